"""Per-step sampling tensors for a batch, built from the requests' SamplingParams.

The scheduler rebuilds this every step from each request's params and the tokens it has
generated so far, so nothing here has to be filtered or merged when the batch changes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixserve.sampling import penalties
from radixserve.sampling.constrained.mask_apply import PackedVocabMask
from radixserve.sampling.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1
_GOLDEN64 = 0x9E3779B97F4A7C15


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a bijective 64-bit mix with good avalanche."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def seeded_uniform(seed: int, step: int) -> float:
    """The uniform in [0, 1) that a request seeded with ``seed`` uses at output step ``step``.

    A pure function of (seed, step): it does not depend on the device, the batch, or any RNG
    state, so a seeded request samples the same tokens alone, in any batch, and after being
    retracted and re-prefilled. 24 bits keep the value exact in float32 and strictly below 1.
    """
    h = _mix64(_mix64(seed + _GOLDEN64) ^ ((step + 1) * _GOLDEN64 & _MASK64))
    return (h >> 40) / float(1 << 24)


@dataclass
class SamplingBatchInfo:
    """Per-step tensors for a batch of B requests (built on the logits' device).

    Invariants: every tensor has B rows; greedy rows carry temperature 1.0 (their logprobs are
    those of the processed logits); ``top_ks`` is clamped to ``vocab_size`` (== all);
    the optional ``[B, V]`` tensors are None when no row in the batch needs them.
    """

    vocab_size: int
    device: torch.device
    temperatures: torch.Tensor  # [B, 1] float32
    top_ps: torch.Tensor  # [B] float32
    top_ks: torch.Tensor  # [B] int64
    min_ps: torch.Tensor  # [B] float32
    is_greedy: torch.Tensor  # [B] bool
    is_all_greedy: bool
    need_top_k: bool
    need_top_p: bool
    need_min_p: bool
    has_seed: torch.Tensor  # [B] bool
    seed_uniforms: torch.Tensor  # [B] float32, this step's draw for seeded rows, else 0
    any_seeded: bool
    token_counts: torch.Tensor | None = None  # [B, V] float32 counts of generated tokens
    repetition_penalties: torch.Tensor | None = None  # [B, 1]
    frequency_penalties: torch.Tensor | None = None  # [B, 1]
    presence_penalties: torch.Tensor | None = None  # [B, 1]
    logit_bias: torch.Tensor | None = None  # [B, V] float32
    min_tokens_mask: torch.Tensor | None = None  # [B, V] bool, True = blocked this step
    vocab_mask: torch.Tensor | None = None  # [B, V] bool, True = allowed
    grammar_mask: PackedVocabMask | None = None  # packed, applied in place to its rows only

    def __len__(self) -> int:
        return int(self.temperatures.shape[0])

    @classmethod
    def from_requests(
        cls,
        params: Sequence[SamplingParams],
        output_ids: Sequence[Sequence[int]],
        vocab_size: int,
        device: torch.device | str,
        eos_token_ids: Sequence[int] = (),
        vocab_mask: torch.Tensor | None = None,
        grammar_mask: PackedVocabMask | None = None,
        token_counts: torch.Tensor | None = None,
    ) -> SamplingBatchInfo:
        """Build the step's tensors.

        ``output_ids[i]`` are the tokens request i generated so far (penalties,
        min_new_tokens, and the seeded draw's step index). ``vocab_mask`` is an optional
        ``[B, V]`` bool tensor, True = allowed; ``grammar_mask`` the same constraint packed
        (what the scheduler passes: its grammar rows are masked in place, the others untouched).
        ``token_counts`` ([B, V] float32) are the rows' output-token counts when the caller keeps
        them incrementally (sampling/output_counts.py); else the penalties count output_ids.
        """
        batch = len(params)
        if batch == 0:
            raise ValueError("params must hold at least one request.")
        if len(output_ids) != batch:
            raise ValueError(f"output_ids has {len(output_ids)} rows for {batch} params.")
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}.")
        dev = torch.device(device)
        greedy = [p.is_greedy for p in params]
        top_ks = [vocab_size if p.top_k == -1 or p.top_k >= vocab_size else p.top_k for p in params]
        seeds = [p.sampling_seed for p in params]
        uniforms = [
            0.0 if s is None else seeded_uniform(s, len(ids))
            for s, ids in zip(seeds, output_ids, strict=True)
        ]

        def f32(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=dev)

        info = cls(
            vocab_size=vocab_size,
            device=dev,
            temperatures=f32(
                [1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)]
            ).view(-1, 1),
            top_ps=f32([p.top_p for p in params]),
            top_ks=torch.tensor(top_ks, dtype=torch.int64, device=dev),
            min_ps=f32([p.min_p for p in params]),
            is_greedy=torch.tensor(greedy, dtype=torch.bool, device=dev),
            is_all_greedy=all(greedy),
            need_top_k=any(k < vocab_size for k, g in zip(top_ks, greedy, strict=True) if not g),
            need_top_p=any(p.top_p < 1.0 for p, g in zip(params, greedy, strict=True) if not g),
            need_min_p=any(p.min_p > 0.0 for p, g in zip(params, greedy, strict=True) if not g),
            has_seed=torch.tensor([s is not None for s in seeds], dtype=torch.bool, device=dev),
            seed_uniforms=f32(uniforms),
            any_seeded=any(s is not None for s in seeds),
        )
        info._build_penalties(params, output_ids, token_counts)
        info._build_logit_bias(params)
        info._build_min_tokens_mask(params, output_ids, eos_token_ids)
        info._set_vocab_mask(vocab_mask)
        info._set_grammar_mask(grammar_mask)
        return info

    def _build_penalties(
        self,
        params: Sequence[SamplingParams],
        output_ids: Sequence[Sequence[int]],
        token_counts: torch.Tensor | None,
    ) -> None:
        rep = [p.repetition_penalty for p in params]
        freq = [p.frequency_penalty for p in params]
        pres = [p.presence_penalty for p in params]
        need_rep = any(r != 1.0 for r in rep)
        need_add = any(f != 0.0 for f in freq) or any(p != 0.0 for p in pres)
        if not (need_rep or need_add) or not any(output_ids):
            return
        if token_counts is None:
            token_counts = penalties.token_counts(output_ids, self.vocab_size, self.device)
        elif tuple(token_counts.shape) != (len(params), self.vocab_size):
            raise ValueError(
                f"token_counts has shape {tuple(token_counts.shape)}, expected "
                f"({len(params)}, {self.vocab_size})."
            )
        self.token_counts = token_counts

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=self.device).view(-1, 1)

        if need_rep:
            self.repetition_penalties = column(rep)
        if need_add:
            self.frequency_penalties = column(freq)
            self.presence_penalties = column(pres)

    def _build_logit_bias(self, params: Sequence[SamplingParams]) -> None:
        rows: list[int] = []
        cols: list[int] = []
        values: list[float] = []
        for row, p in enumerate(params):
            for token, bias in (p.logit_bias or {}).items():
                if not 0 <= token < self.vocab_size:
                    raise ValueError(
                        f"logit_bias token {token} of request {row} is outside [0, {self.vocab_size})."
                    )
                rows.append(row)
                cols.append(token)
                values.append(bias)
        if not rows:
            return
        bias_t = torch.zeros(
            (len(params), self.vocab_size), dtype=torch.float32, device=self.device
        )
        bias_t[torch.tensor(rows, device=self.device), torch.tensor(cols, device=self.device)] = (
            torch.tensor(values, dtype=torch.float32, device=self.device)
        )
        self.logit_bias = bias_t

    def _build_min_tokens_mask(
        self,
        params: Sequence[SamplingParams],
        output_ids: Sequence[Sequence[int]],
        eos_token_ids: Sequence[int],
    ) -> None:
        # SGLang blocks EOS and stop_token_ids until min_new_tokens is reached, whatever
        # ignore_eos says; we do the same.
        rows: list[int] = []
        ids: list[list[int]] = []
        for row, (p, out) in enumerate(zip(params, output_ids, strict=True)):
            if len(out) < p.min_new_tokens:
                rows.append(row)
                ids.append(sorted(set(eos_token_ids) | (p.stop_token_ids or set())))
        self.min_tokens_mask = penalties.min_new_tokens_block(
            rows, ids, len(params), self.vocab_size, self.device
        )

    def _set_vocab_mask(self, vocab_mask: torch.Tensor | None) -> None:
        if vocab_mask is None:
            return
        expected = (len(self), self.vocab_size)
        if tuple(vocab_mask.shape) != expected or vocab_mask.dtype != torch.bool:
            raise ValueError(
                f"vocab_mask must be a bool tensor of shape {expected}, "
                f"got {vocab_mask.dtype} {tuple(vocab_mask.shape)}."
            )
        self.vocab_mask = vocab_mask.to(self.device)

    def _set_grammar_mask(self, grammar_mask: PackedVocabMask | None) -> None:
        if grammar_mask is None:
            return
        if len(grammar_mask.bitmask) != len(self):
            raise ValueError(
                f"grammar_mask has {len(grammar_mask.bitmask)} rows for a batch of {len(self)}."
            )
        # The bitmask stays where it was filled (the CPU); applying moves it if needed.
        self.grammar_mask = grammar_mask

    @property
    def needs_logit_processing(self) -> bool:
        return any(
            t is not None
            for t in (
                self.token_counts,
                self.logit_bias,
                self.min_tokens_mask,
                self.vocab_mask,
                self.grammar_mask,
            )
        )

    def process_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Return float32 logits after penalties, logit bias, min_new_tokens and vocab mask.

        Never modifies ``logits`` in place: the caller may still need the raw values.
        """
        x = logits.float()
        counts = self.token_counts
        if counts is not None and self.repetition_penalties is not None:
            x = penalties.apply_repetition_penalty(x, counts, self.repetition_penalties)
        if counts is not None and self.frequency_penalties is not None:
            assert self.presence_penalties is not None
            x = penalties.apply_additive_penalties(
                x, counts, self.frequency_penalties, self.presence_penalties
            )
        if self.logit_bias is not None:
            x = x + self.logit_bias
        if self.min_tokens_mask is not None:
            x = x.masked_fill(self.min_tokens_mask, float("-inf"))
        if self.vocab_mask is not None:
            x = x.masked_fill(~self.vocab_mask, float("-inf"))
        if self.grammar_mask is not None:
            if x is logits:  # .float() of float32 logits is the caller's tensor: copy first
                x = x.clone()
            self.grammar_mask.apply_(x)
        return x
