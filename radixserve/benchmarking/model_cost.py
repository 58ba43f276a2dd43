"""What one forward step costs in floating-point operations and bytes moved.

The accounting, per step:
- flops: 2 x (the parameters of every per-token matmul) per new token, 2 x vocab x hidden per
  logits row (the lm_head runs only on the rows whose logits are wanted), and attention's
  4 x layers x heads x head_dim per (query, key) pair (QK^T and AV).
- bytes: every weight matrix is streamed once per step (the embedding table is only looked up,
  a few rows), plus the KV cache the step reads (each request's context before its new tokens)
  and writes (one entry per new token).
- mixture-of-experts layers: a token's matmuls are its top_k experts' (flops), and a step reads
  the experts its tokens chose, each once (layers/moe runs every chosen expert once over its
  rows). One token reads exactly top_k experts a layer; for more, the expected number of
  distinct experts under uniform routing, E x (1 - (1 - k/E)^tokens), stands in for the
  routing actually taken.

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
class ExpertLayerCost:
    """One MoE layer's routed experts: parameters and bytes of one expert, how many, how many
    each token takes."""

    params_per_expert: int
    bytes_per_expert: int
    num_experts: int
    top_k: int

    def experts_read(self, tokens: int) -> float:
        """Distinct experts a step of `tokens` tokens reads (exact for 0 and 1 token)."""
        if tokens <= 1:
            return float(self.top_k * tokens)
        n, k = self.num_experts, self.top_k
        return n * (1.0 - (1.0 - k / n) ** tokens)


@dataclass(frozen=True)
class ModelCost:
    body_params: int  # parameters of the per-token matmuls (everything but vocab matrices)
    body_bytes: int
    lm_head_params: int  # vocab x hidden
    lm_head_bytes: int
    kv_bytes_per_token: int  # K and V of one token over all layers
    attn_flops_per_pair: int  # 4 x layers x heads x head_dim
    dtype: str  # the weights' dtype name, to pick the compute ceiling
    # Routed experts of MoE layers (not in body_*): what one token and one step read of them.
    expert_layers: tuple[ExpertLayerCost, ...] = ()

    @property
    def weight_bytes(self) -> int:
        """Bytes of all matrices (routed experts included)."""
        experts = sum(e.bytes_per_expert * e.num_experts for e in self.expert_layers)
        return self.body_bytes + self.lm_head_bytes + experts

    @property
    def params(self) -> int:
        experts = sum(e.params_per_expert * e.num_experts for e in self.expert_layers)
        return self.body_params + self.lm_head_params + experts

    @property
    def active_params(self) -> int:
        """The parameters one token's matmuls use (its top_k experts of each MoE layer)."""
        experts = sum(e.params_per_expert * e.top_k for e in self.expert_layers)
        return self.body_params + self.lm_head_params + experts

    @property
    def active_bytes(self) -> int:
        """The bytes of those parameters: what a batch-1 decode step must read at least."""
        experts = sum(e.bytes_per_expert * e.top_k for e in self.expert_layers)
        return self.body_bytes + self.lm_head_bytes + experts

    @property
    def flops_per_token(self) -> float:
        """The usual 2 x (active) params per generated token (attention excluded)."""
        return 2.0 * self.active_params

    @classmethod
    def from_model(cls, model: torch.nn.Module, config: Any, kv_dtype: torch.dtype) -> ModelCost:
        vocab, hidden = int(config.vocab_size), int(config.hidden_size)
        total_params = total_bytes = 0
        vocab_mats: list[torch.nn.Parameter] = []
        dtype = torch.float32
        experts, expert_tensors = _expert_layers(model)
        for param in model.parameters():
            if any(param is t for t in expert_tensors):
                continue  # counted per expert (expert_layers)
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
            expert_layers=experts,
        )

    @classmethod
    def from_config(
        cls, config: Any, weight_dtype: torch.dtype, kv_dtype: torch.dtype | None = None
    ) -> ModelCost:
        """An estimate for a llama-style decoder (q, k, v, o, gate, up, down, norms); with
        routed experts on every layer where the config has them (Mixtral, Qwen2/3-MoE,
        OLMoE: num_experts or num_local_experts, num_experts_per_tok)."""
        hidden = int(config.hidden_size)
        heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
        head_dim = int(getattr(config, "head_dim", 0) or hidden // heads)
        inter = int(config.intermediate_size)
        attn = hidden * head_dim * (2 * heads + 2 * kv_heads)
        size = torch.empty((), dtype=weight_dtype).element_size()
        layers = int(config.num_hidden_layers)
        experts = _config_experts(config, hidden, size)
        mlp = 0 if experts else 3 * hidden * inter
        per_layer = attn + mlp + 2 * hidden
        body = layers * per_layer + hidden
        head = int(config.vocab_size) * hidden
        return cls(
            body_params=body,
            body_bytes=body * size,
            lm_head_params=head,
            lm_head_bytes=head * size,
            kv_bytes_per_token=_kv_bytes(config, kv_dtype or weight_dtype),
            attn_flops_per_pair=_attn_flops(config),
            dtype=str(weight_dtype).removeprefix("torch."),
            expert_layers=(experts,) * layers if experts else (),
        )

    def step(
        self, prefix_lens: Sequence[int], extend_lens: Sequence[int], num_logits: int
    ) -> StepCost:
        """The cost of one forward step over requests that each append extend_lens[i] tokens
        after prefix_lens[i] cached ones, computing `num_logits` rows of logits."""
        tokens = sum(extend_lens)
        pairs = sum(n * p + n * (n + 1) // 2 for p, n in zip(prefix_lens, extend_lens, strict=True))
        flops = (
            2.0 * (self.active_params - self.lm_head_params) * tokens
            + 2.0 * self.lm_head_params * num_logits
            + float(self.attn_flops_per_pair) * pairs
        )
        kv = self.kv_bytes_per_token * (sum(prefix_lens) + tokens)
        return StepCost(tokens, flops, self.weights_read(tokens, num_logits > 0) + kv)

    def weights_read(self, tokens: int, logits: bool = True) -> float:
        """Weight bytes a step over `tokens` new tokens reads: every dense matrix once, the
        LM head if it computes logits, the routed experts its tokens choose."""
        experts = sum(e.bytes_per_expert * e.experts_read(tokens) for e in self.expert_layers)
        return float(self.body_bytes + experts + (self.lm_head_bytes if logits else 0))

    def decode_step(self, context_lens: Sequence[int]) -> StepCost:
        """One decode step for requests whose contexts (before the new token) have these lengths."""
        return self.step(context_lens, [1] * len(context_lens), len(context_lens))


def _config_experts(config: Any, hidden: int, size: int) -> ExpertLayerCost | None:
    """One MoE layer's experts from a config (ours or transformers'), None for a dense one."""
    hf = getattr(config, "hf_config", None) or config
    n = int(getattr(hf, "num_experts", 0) or getattr(hf, "num_local_experts", 0) or 0)
    if n <= 0:
        return None
    inter = int(getattr(hf, "moe_intermediate_size", 0) or hf.intermediate_size)
    params = 3 * hidden * inter
    return ExpertLayerCost(params, params * size, n, int(hf.num_experts_per_tok))


def _expert_layers(model: torch.nn.Module) -> tuple[tuple[ExpertLayerCost, ...], list[Any]]:
    """Each MoE layer's routed-expert cost, and the float expert stacks (parameters that the
    dense accounting must skip). GGUF expert blocks are buffers, not parameters."""
    from radixserve.layers.moe import FusedMoE

    layers: list[ExpertLayerCost] = []
    tensors: list[Any] = []
    for module in model.modules():
        if not isinstance(module, FusedMoE):
            continue
        n = module.num_experts
        params = 3 * module.hidden_size * module.intermediate_size  # gate, up, down
        block_bytes = module.quant_method.block_bytes()
        stacks = [module.w13_weight, module.w2_weight]
        tensors += stacks
        nbytes = block_bytes or sum(t.numel() * t.element_size() for t in stacks)
        # --ep-size: the stacks hold this rank's experts only.
        per_expert = nbytes // module.num_local_experts
        layers.append(ExpertLayerCost(params, per_expert, n, module.router.top_k))
    return tuple(layers), tensors


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
