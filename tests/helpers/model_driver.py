"""Drive one of our models step by step, building each ForwardBatch by hand.

No scheduler, allocator or prefix cache: KV slots are handed out in order and each request owns
one row of a private req_to_token table. Good for checking model code against a reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from radixserve.distributed import parallel_state
from radixserve.layers.attention.torch_native import TorchNativeAttnBackend
from radixserve.mem_cache.kv_cache import KVCache
from radixserve.model_executor.forward_batch import ForwardBatch, ForwardMode
from radixserve.models.config import ModelConfig
from radixserve.models.kv_layout import kv_layout


class ManualDriver:
    """Runs extend and decode steps of `model` over its own KV cache.

    `forward([(req, new_ids), ...])` appends new_ids to each request's sequence (a request seen
    for the first time starts empty) and returns logits for the new tokens.
    """

    def __init__(
        self,
        model: nn.Module,
        config: ModelConfig,
        *,
        max_tokens: int = 4096,
        max_requests: int = 8,
        device: str | torch.device = "cpu",
    ) -> None:
        self.model = model
        self.config = config
        self.device = torch.device(device)
        # Each tensor-parallel rank caches only its own kv heads (replicated when too few).
        local_kv_heads = max(1, config.num_key_value_heads // parallel_state.get_tp_size())
        # The model's cache rows (one latent head for multi-head latent attention).
        layout = kv_layout(config, local_kv_heads)
        self.kv_cache = KVCache(
            max_tokens,
            config.num_hidden_layers,
            layout.num_kv_heads,
            layout.head_dim,
            config.dtype,
            self.device,
            v_shares_k=layout.v_shares_k,
        )
        self.req_to_token = torch.zeros(
            (max_requests, config.context_len), dtype=torch.int64, device=self.device
        )
        self.backend = TorchNativeAttnBackend()
        self.seq_lens = [0] * max_requests
        self.next_slot = 0

    def _allocate(self, count: int) -> torch.Tensor:
        if self.next_slot + count > self.kv_cache.size:
            raise RuntimeError("ManualDriver ran out of KV slots; raise max_tokens")
        slots = torch.arange(self.next_slot, self.next_slot + count, device=self.device)
        self.next_slot += count
        return slots

    def build_batch(
        self, batch: Sequence[tuple[int, Sequence[int]]], decode: bool = False
    ) -> ForwardBatch:
        """The ForwardBatch for appending each request's new tokens (updates seq lengths)."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[torch.Tensor] = []
        prefix_lens, extend_lens, last_rows = [], [], []
        for req, new_ids in batch:
            if decode and len(new_ids) != 1:
                raise ValueError("a decode step takes exactly one token per request")
            prefix, n = self.seq_lens[req], len(new_ids)
            req_slots = self._allocate(n)
            self.req_to_token[req, prefix : prefix + n] = req_slots
            self.seq_lens[req] = prefix + n
            ids.extend(new_ids)
            positions.extend(range(prefix, prefix + n))
            slots.append(req_slots)
            prefix_lens.append(prefix)
            extend_lens.append(n)
            last_rows.append(len(ids) - 1)
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]

        def as_tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        return ForwardBatch(
            forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
            input_ids=as_tensor(ids),
            positions=as_tensor(positions),
            req_pool_indices=as_tensor([req for req, _ in batch]),
            seq_lens=as_tensor(seq_lens),
            extend_prefix_lens=as_tensor(prefix_lens),
            extend_seq_lens=as_tensor(extend_lens),
            out_cache_loc=torch.cat(slots),
            req_to_token=self.req_to_token,
            kv_cache=self.kv_cache,
            attn_backend=self.backend,
            req_pool_indices_cpu=[req for req, _ in batch],
            seq_lens_cpu=seq_lens,
            extend_prefix_lens_cpu=prefix_lens,
            extend_seq_lens_cpu=extend_lens,
            logits_indices=as_tensor(last_rows),
        )

    @torch.inference_mode()
    def forward(
        self,
        batch: Sequence[tuple[int, Sequence[int]]],
        decode: bool = False,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Logits [num_new_tokens, vocab] with all_logits, else [batch, vocab] (last tokens)."""
        fb = self.build_batch(batch, decode)
        self.backend.init_forward_metadata(fb)
        hidden = self.model(fb.input_ids, fb.positions, fb)
        rows = hidden if all_logits else hidden[fb.logits_indices]
        return self.model.compute_logits(rows)

    def greedy(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        req: int = 0,
        stop_ids: Sequence[int] = (),
    ) -> list[int]:
        """Prefill then one decode step per token; stops after a token in stop_ids."""
        logits = self.forward([(req, list(prompt_ids))])
        out: list[int] = []
        while True:
            token = int(logits[0].argmax())
            out.append(token)
            if len(out) >= max_new_tokens or token in stop_ids:
                return out
            logits = self.forward([(req, [token])], decode=True)
