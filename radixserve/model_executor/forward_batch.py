"""The one object the scheduler hands to the model runner for a forward pass.

Models see only `input_ids`, `positions` and this batch (which their attention layers pass to the
attention backend). They never see requests, queues or the radix tree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from radixserve.layers.attention.base import AttentionBackend
    from radixserve.mem_cache.kv_cache import KVCache


class ForwardMode(enum.Enum):
    """EXTEND covers prefill, chunked prefill and prefill over a cached prefix; DECODE is one
    new token per request. A mixed batch is an EXTEND whose decode requests extend by one."""

    EXTEND = "extend"
    DECODE = "decode"

    @property
    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE


@dataclass
class ForwardBatch:
    """Tensors describing one step for `batch_size` requests, flattened over `num_tokens`.

    For request i the new tokens occupy positions
    [extend_prefix_lens[i], seq_lens[i]) of its sequence; their KV goes to `out_cache_loc`
    (in request order), and earlier positions are read through `req_to_token[req_pool_indices[i]]`.
    """

    forward_mode: ForwardMode
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    req_pool_indices: torch.Tensor  # [batch_size] int64
    seq_lens: torch.Tensor  # [batch_size] int64: length after this step
    extend_prefix_lens: torch.Tensor  # [batch_size] int64: tokens already in the KV cache
    extend_seq_lens: torch.Tensor  # [batch_size] int64: new tokens this step
    out_cache_loc: torch.Tensor  # [num_tokens] int64: KV slot for each new token
    req_to_token: torch.Tensor  # [max_reqs, max_context_len] the request-to-token table
    kv_cache: KVCache
    attn_backend: AttentionBackend
    # Host-side copies, so backends can loop over requests without device syncs.
    req_pool_indices_cpu: list[int]
    seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int]
    # The flattened token rows whose logits are wanted (StepInputs.logits_rows): usually each
    # request's last new token, every new token of a request that asks for prompt logprobs,
    # none for a prefill chunk that does not reach the prompt's end; so not batch_size long.
    logits_indices: torch.Tensor  # [len(logits_rows)] int64
    # EAGLE: the features an EAGLE draft head reads per token (the target's hidden states, or
    # the head's own from its previous step), [num_tokens, feature size].
    spec_hidden: torch.Tensor | None = None
    # EAGLE3: target decoder layers whose inputs (hidden + residual) the model hands back in
    # `captured`, concatenated per token (num_layers: the last layer's output).
    capture_layers: tuple[int, ...] = ()
    # Set by the model during the forward: the captured layer inputs (target), or the next draft
    # step's features (EAGLE head).
    captured: torch.Tensor | None = None
    # A vision model's image pieces in this step (multimodal/image_items.py's ImageChunk), and
    # what the model makes of them: flattened rows whose input embedding is replaced, and the
    # replacement [len(rows), hidden] (models/llava.py sets it, LlamaModel applies it).
    image_chunks: tuple[Any, ...] = ()
    embedding_overrides: tuple[torch.Tensor, torch.Tensor] | None = None
    # Runs of flattened rows (first, count), each the new tokens of one image, that attend to
    # each other both ways besides causally (Gemma 3's image tokens, set by its model): the
    # attention backends then run those requests on a PyTorch masked path
    # (layers/attention/bidirectional.py).
    bidirectional_blocks: tuple[tuple[int, int], ...] = ()
    # An M-RoPE model's (Qwen2-VL) rotary positions [3, num_tokens] when a request of the step
    # has images, else None (`positions` then rotate on all three axes); `positions` pick KV
    # slots either way (models/qwen2_vl.py, layers/mrope.py).
    mrope_positions: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
