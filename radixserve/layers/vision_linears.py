"""A vision-language model's encoder (transformers' vision modules, built with plain
nn.Linear) on the language model's float matmul: ops.float_linear, radixserve's packed kernel
from the row count where it measured faster than torch's BLAS at start-up (ops.tune_float_gemm),
torch's elsewhere and for 16-bit weights (oneDNN's bf16 GEMM, which is what runs the tower under
`--dtype auto` on an AMX host). Switched with the language model's fast kernels."""

from __future__ import annotations

import torch
from torch import nn

from radixserve.kernels import ops

# The attribute a vision-language model keeps its encoder under (LLaVA, Idefics3, Gemma 3:
# `vision`; Qwen2-VL: `visual`).
VISION_ATTRS = ("vision", "visual")


class FastFloatLinear(nn.Linear):
    """nn.Linear whose matmul is ops.float_linear (same weight, same bias, same result up to
    the summation order of the packed kernel)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.float_linear(x, self.weight, self.bias)


def use_fast_vision_linears(model: nn.Module, enabled: bool) -> int:
    """Switch every plain nn.Linear of the model's vision encoder to FastFloatLinear (or
    back); returns how many. The language model's own layers are LinearBase and switch with
    their quant methods; the vision side is transformers' modules, switched by class."""
    count = 0
    for attr in VISION_ATTRS:
        encoder = getattr(model, attr, None)
        if not isinstance(encoder, nn.Module):
            continue
        for module in encoder.modules():
            if enabled and type(module) is nn.Linear:
                module.__class__ = FastFloatLinear
                count += 1
            elif not enabled and type(module) is FastFloatLinear:
                module.__class__ = nn.Linear
                count += 1
    return count
