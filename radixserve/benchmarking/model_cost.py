"""What one forward step costs in floating-point operations and bytes moved.

The accounting, per step:
- flops: 2 x (the parameters of every per-token matmul) per new token, 2 x vocab x hidden per
  logits row (the lm_head runs only on the rows whose logits are wanted), and attention's
  4 x layers x heads x head_dim per (query, key) pair (QK^T and AV).
- bytes: every weight matrix is streamed once per step (the embedding table is only looked up,
  a few rows), plus the KV cache the step reads (each request's context before its new tokens)
  and writes (one entry per new token).

`ModelCost.from_model` counts a loaded model's parameters; `ModelCost.from_config` estimates
them from a config alone (for a client that only knows the served model's config).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from radixserve.kernels.gguf_types import row_weights as gguf_row_weights
from radixserve.layers.quantization import MethodLayer


@dataclass(frozen=True)
class StepCost:
    tokens: int
    flops: float
    bytes: float

    def __add__(self, other: StepCost) -> StepCost:
        return StepCost(
            self.tokens + other.tokens, self.flops + other.flops, self.bytes + other.bytes
        )


ZERO_COST = StepCost(0, 0.0, 0.0)


@dataclass(frozen=True)
class ModelCost:
    body_params: int  # parameters of the per-token matmuls (everything but vocab matrices)
    body_bytes: int
    lm_head_params: int  # vocab x hidden
    lm_head_bytes: int
    kv_bytes_per_token: int  # K and V of one token over all layers
    attn_flops_per_pair: int  # 4 x layers x heads x head_dim
    dtype: str  # the weights' dtype name, to pick the compute ceiling

    @property
    def weight_bytes(self) -> int:
        """Bytes streamed by a step that computes logits: all matrices once."""
        return self.body_bytes + self.lm_head_bytes

    @property
    def params(self) -> int:
        return self.body_params + self.lm_head_params

    @property
    def flops_per_token(self) -> float:
        """The usual 2 x params per generated token (attention excluded)."""
        return 2.0 * self.params

    @classmethod
    def from_model(cls, model: torch.nn.Module, config: Any, kv_dtype: torch.dtype) -> ModelCost:
        vocab, hidden = int(config.vocab_size), int(config.hidden_size)
        total_params = total_bytes = 0
        vocab_mats: list[torch.nn.Parameter] = []
        dtype = torch.float32
        for param in model.parameters():
            total_params += param.numel()
            total_bytes += param.numel() * param.element_size()
            if param.dim() == 2 and param.shape[0] >= vocab and param.shape[1] == hidden:
                vocab_mats.append(param)
            elif param.is_floating_point() and param.dim() == 2:
                dtype = param.dtype
        head = vocab_mats[-1] if vocab_mats else None
        head_params = head.numel() if head is not None else vocab * hidden
        head_bytes = head.numel() * head.element_size() if head is not None else 0
        vocab_params = sum(p.numel() for p in vocab_mats)
        vocab_bytes = sum(p.numel() * p.element_size() for p in vocab_mats)
        # --quantization gguf: projections hold GGUF blocks (their float weights are empty); a
        # tied LM head multiplies the embedding's blocks, so those are what a step reads.
        for module in model.modules():
            if not isinstance(module, MethodLayer):
                continue
            gguf = module.quant_method.gguf_weight()
            if gguf is None:
                continue
            for part in gguf.pieces():  # a fused layer of mixed types, part by part
                rows, row_bytes = part.blocks.shape
                cols = gguf_row_weights(part.qtype, row_bytes)
                if rows >= vocab and cols == hidden:
                    head_params, head_bytes = rows * cols, part.blocks.numel()
                else:
                    total_params += rows * cols
                    total_bytes += part.blocks.numel()
        return cls(
            body_params=total_params - vocab_params,
            body_bytes=total_bytes - vocab_bytes,
            lm_head_params=head_params,
            lm_head_bytes=head_bytes,
            kv_bytes_per_token=_kv_bytes(config, kv_dtype),
            attn_flops_per_pair=_attn_flops(config),
            dtype=str(dtype).removeprefix("torch."),
        )

    @classmethod
    def from_config(
        cls, config: Any, weight_dtype: torch.dtype, kv_dtype: torch.dtype | None = None
    ) -> ModelCost:
        """An estimate for a dense llama-style decoder (q, k, v, o, gate, up, down, norms)."""
        hidden = int(config.hidden_size)
        heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
        head_dim = int(getattr(config, "head_dim", 0) or hidden // heads)
        inter = int(config.intermediate_size)
        attn = hidden * head_dim * (2 * heads + 2 * kv_heads)
        per_layer = attn + 3 * hidden * inter + 2 * hidden
        body = int(config.num_hidden_layers) * per_layer + hidden
        head = int(config.vocab_size) * hidden
        size = torch.empty((), dtype=weight_dtype).element_size()
        return cls(
            body_params=body,
            body_bytes=body * size,
            lm_head_params=head,
            lm_head_bytes=head * size,
            kv_bytes_per_token=_kv_bytes(config, kv_dtype or weight_dtype),
            attn_flops_per_pair=_attn_flops(config),
            dtype=str(weight_dtype).removeprefix("torch."),
        )

    def step(
        self, prefix_lens: Sequence[int], extend_lens: Sequence[int], num_logits: int
    ) -> StepCost:
        """The cost of one forward step over requests that each append extend_lens[i] tokens
        after prefix_lens[i] cached ones, computing `num_logits` rows of logits."""
        tokens = sum(extend_lens)
        pairs = sum(n * p + n * (n + 1) // 2 for p, n in zip(prefix_lens, extend_lens, strict=True))
        flops = (
            2.0 * self.body_params * tokens
            + 2.0 * self.lm_head_params * num_logits
            + float(self.attn_flops_per_pair) * pairs
        )
        kv = self.kv_bytes_per_token * (sum(prefix_lens) + tokens)
        weights = self.body_bytes + (self.lm_head_bytes if num_logits else 0)
        return StepCost(tokens, flops, float(weights + kv))

    def decode_step(self, context_lens: Sequence[int]) -> StepCost:
        """One decode step for requests whose contexts (before the new token) have these lengths."""
        return self.step(context_lens, [1] * len(context_lens), len(context_lens))


def _kv_bytes(config: Any, kv_dtype: torch.dtype) -> int:
    hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", 0) or hidden // heads)
    size = torch.empty((), dtype=kv_dtype).element_size()
    return 2 * int(config.num_hidden_layers) * int(config.num_key_value_heads) * head_dim * size


def _attn_flops(config: Any) -> int:
    hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", 0) or hidden // heads)
    return 4 * int(config.num_hidden_layers) * heads * head_dim


class ForwardCounter:
    """Wraps a ModelRunner's forward (on the instance) to add up the cost of every step run,
    so an end-to-end benchmark can report ceilings for exactly the work the engine did."""

    def __init__(self, runner: Any, cost: ModelCost) -> None:
        self.cost = cost
        self.total = ZERO_COST
        self.steps = 0
        self.decode_steps = 0
        self._runner = runner
        self._forward = runner.forward

        def counted(step: Any, *args: Any, **kwargs: Any) -> Any:
            out = self._forward(step, *args, **kwargs)
            self.total = self.total + cost.step(
                step.prefix_lens, step.extend_lens, len(step.logits_rows)
            )
            self.steps += 1
            self.decode_steps += int(step.is_decode)
            return out

        runner.forward = counted

    def reset(self) -> None:
        self.total = ZERO_COST
        self.steps = self.decode_steps = 0

    def close(self) -> None:
        """Restore the runner's own forward."""
        self._runner.__dict__.pop("forward", None)
