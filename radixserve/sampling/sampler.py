"""The batched sampler: processed logits in, one token per row out.

Order (as SGLang): repetition / frequency / presence penalties, logit bias, min_new_tokens
blocking, grammar vocab mask; then greedy rows take the exact argmax of those processed
logits, and the other rows go through temperature, top-k, top-p (over the top-k renormalised
distribution, as SGLang's default flashinfer kernel does) and min-p, then draw one token.

Drawing: each row uses a single uniform and inverts the cumulative distribution
(``searchsorted``), so the whole batch is a handful of tensor ops. A seeded row's uniform is a
pure function of (sampling_seed, number of tokens generated), which makes its output independent
of batch composition and of retraction; unseeded rows draw from the global torch RNG.

Logprobs follow SGLang's default (SGLANG_RETURN_ORIGINAL_LOGPROB unset): the log-softmax of
the processed logits divided by the row's temperature, taken *before* top-k/top-p/min-p
filtering. Greedy rows use temperature 1, i.e. the plain log-softmax of the processed logits.
-inf is clamped to float32's most negative finite value so the numbers stay JSON-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

import torch

from radixserve.sampling.sampling_batch_info import SamplingBatchInfo

logger = logging.getLogger(__name__)

_LOGPROB_FLOOR = torch.finfo(torch.float32).min
# --enable-deterministic-inference: torch's logsumexp splits a lone row's reduction over the
# threads but not a batch's rows, so a row's logprob would depend on its batch (seen as 2e-6);
# log_softmax reduces each row the same way at any batch size.
_BATCH_INVARIANT = [False]


def set_batch_invariant(enabled: bool) -> None:
    """Reported logprobs independent of the batch (at the cost of a [B, V] log-softmax)."""
    _BATCH_INVARIANT[0] = enabled


class SampleOutput(NamedTuple):
    next_token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32 logprob of the chosen token
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None  # (values [B, k], ids [B, k])
    # The processed, temperature-scaled logits the logprobs come from (None when no logprobs
    # were asked for): token_ids_logprob reads its ids' logprobs from the same distribution.
    scaled: torch.Tensor | None = None


def _check_logits(logits: torch.Tensor, info: SamplingBatchInfo) -> None:
    expected = (len(info), info.vocab_size)
    if logits.dim() != 2 or tuple(logits.shape) != expected:
        raise ValueError(f"logits must have shape {expected}, got {tuple(logits.shape)}.")


def scale_by_temperature(processed: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    if info.is_all_greedy:
        return processed  # every temperature is 1.0
    return processed / info.temperatures


def compute_logprobs(logits: torch.Tensor, info: SamplingBatchInfo | None = None) -> torch.Tensor:
    """Float32 log-softmax over the vocabulary, ``[N, V]``; -inf clamped to a finite floor.

    Without ``info`` this is the raw distribution, which is what SGLang reports for prompt
    tokens. With ``info`` (one row per request) each row is divided by its temperature first,
    matching the sampler's reported output logprobs when no penalties apply.
    """
    x = logits.float()
    if info is not None:
        if x.shape[0] != len(info):
            raise ValueError(f"logits has {x.shape[0]} rows for a batch of {len(info)}.")
        x = scale_by_temperature(x, info)
    return torch.log_softmax(x, dim=-1).clamp_(min=_LOGPROB_FLOOR)


def chosen_logprobs(
    scaled: torch.Tensor, next_ids: torch.Tensor, top_logprobs_num: int
) -> SampleOutput:
    """The reported logprob of each row's chosen token (and the row's top-k), from the
    processed, temperature-scaled logits the row was sampled from."""
    if _BATCH_INVARIANT[0]:
        # Each row reduced alike at any batch size (see _BATCH_INVARIANT).
        everything = torch.log_softmax(scaled, dim=-1)

        def logprobs_at(ids: torch.Tensor) -> torch.Tensor:
            return everything.gather(-1, ids)
    else:
        # Only the chosen (and top-k) entries are needed, so avoid materialising [B, V]
        # log-probs: logprob = logit - logsumexp(row).
        lse = torch.logsumexp(scaled, dim=-1, keepdim=True)

        def logprobs_at(ids: torch.Tensor) -> torch.Tensor:
            return scaled.gather(-1, ids) - lse

    chosen = logprobs_at(next_ids.unsqueeze(-1))
    logprobs = torch.nan_to_num(chosen.squeeze(-1), nan=_LOGPROB_FLOOR, neginf=_LOGPROB_FLOOR)
    top = None
    if top_logprobs_num > 0:
        k = min(top_logprobs_num, scaled.shape[-1])
        ids = scaled.topk(k, dim=-1).indices
        values = torch.nan_to_num(logprobs_at(ids), nan=_LOGPROB_FLOOR, neginf=_LOGPROB_FLOOR)
        top = (values, ids)
    return SampleOutput(next_ids.to(torch.int64), logprobs, top, scaled)


def filter_sorted(probs_sorted: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Zero the tail that top-k, top-p and min-p exclude; rows are sorted descending.

    Each filter keeps a prefix of the sorted row, so the result is a prefix of non-zeros.
    """
    vocab = probs_sorted.shape[-1]
    positions = torch.arange(vocab, device=probs_sorted.device).view(1, -1)
    kept = probs_sorted.masked_fill(positions >= info.top_ks.view(-1, 1), 0.0)
    if info.need_top_p:
        # Keep a token while the mass strictly before it is under top_p of the (top-k
        # renormalised) total; the first token always survives.
        cumulative = kept.cumsum(dim=-1)
        total = cumulative[:, -1:]
        before = cumulative - kept
        kept = kept.masked_fill(before > info.top_ps.view(-1, 1) * total, 0.0)
    if info.need_min_p:
        threshold = kept[:, :1] * info.min_ps.view(-1, 1)
        kept = kept.masked_fill(kept < threshold, 0.0)
    return kept


def _draw(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Invert each row's cumulative distribution at ``uniforms * total``; returns column ids.

    The target is kept strictly below the row total, so the first cdf entry above it exists
    and belongs to a token with non-zero weight.
    """
    cdf = weights.cumsum(dim=-1)
    total = cdf[:, -1]
    target = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    index = torch.searchsorted(cdf, target.unsqueeze(-1).contiguous(), right=True).squeeze(-1)
    return index.clamp_(max=weights.shape[-1] - 1)


def _row_uniforms(info: SamplingBatchInfo, device: torch.device) -> torch.Tensor:
    uniforms = torch.rand(len(info), device=device, dtype=torch.float32)
    if info.any_seeded:
        uniforms = torch.where(info.has_seed, info.seed_uniforms, uniforms)
    return uniforms


def _sample_rows(scaled: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    probs = torch.softmax(scaled, dim=-1)
    uniforms = _row_uniforms(info, scaled.device)
    if info.need_top_k or info.need_top_p:
        probs_sorted, order = probs.sort(dim=-1, descending=True, stable=True)
        chosen = _draw(filter_sorted(probs_sorted, info), uniforms)
        return order.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    if info.need_min_p:
        threshold = probs.amax(dim=-1, keepdim=True) * info.min_ps.view(-1, 1)
        probs = probs.masked_fill(probs < threshold, 0.0)
    return _draw(probs, uniforms)


def _torch_argmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


class Sampler:
    """Samples the next token of every row; see the module docstring for the exact rules.

    `argmax` picks greedy rows' tokens (the first index of each row's maximum). The serving
    path passes the C++ one (kernels' argmax_rows): `sampling/` may not import kernels, and
    the bare argmax of an all-greedy batch is a measurable share of a decode step's host time.
    """

    def __init__(self, argmax: Callable[[torch.Tensor], torch.Tensor] = _torch_argmax) -> None:
        self.argmax = argmax

    def __call__(
        self,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        top_logprobs_num: int = 0,
        need_logprobs: bool = True,
    ) -> SampleOutput:
        """With need_logprobs=False (no row asked for logprobs) the returned logprobs are
        zeros, and an all-greedy batch with nothing to process is a bare argmax."""
        _check_logits(logits, info)
        if top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be >= 0, got {top_logprobs_num}.")
        plain = info.is_all_greedy and not info.needs_logit_processing
        if plain and not need_logprobs and not top_logprobs_num:
            return SampleOutput(self.argmax(logits), torch.zeros(len(info)), None)
        processed = info.process_logits(logits)
        argmax = self.argmax(processed)
        if info.is_all_greedy:
            next_ids = argmax
            scaled = processed
        else:
            scaled = scale_by_temperature(processed, info)
            sampled = _sample_rows(scaled, info)
            next_ids = torch.where(info.is_greedy, argmax, sampled)
        if info.needs_logit_processing:
            # A row whose every token is masked has no distribution; fall back to the raw
            # argmax (as SGLang does on a failed draw) instead of returning garbage.
            dead = ~torch.isfinite(processed.amax(dim=-1))
            next_ids = torch.where(dead, logits.argmax(dim=-1), next_ids)
        if not need_logprobs and not top_logprobs_num:
            return SampleOutput(next_ids.to(torch.int64), torch.zeros(len(info)), None)
        return chosen_logprobs(scaled, next_ids, top_logprobs_num)

    @staticmethod
    def compute_logprobs(
        logits: torch.Tensor, info: SamplingBatchInfo | None = None
    ) -> torch.Tensor:
        return compute_logprobs(logits, info)
