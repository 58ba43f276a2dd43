"""--quantization w8a8_int8 for float checkpoints: every decoder projection's weight is quantized
at load time to int8 with one scale per block of 32 weights (GGUF's Q8_0 layout, so the same
kernels run it: int16-quantized activations for small batches, float tiles over dequantized
blocks for prefill), and the float weight is freed. Per-block scales are finer than SGLang's
per-channel int8, so the error stays near 0.2% of each weight's block maximum. The LM head and
the embeddings stay in float, as in SGLang's w8a8_int8.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from radixserve.layers.quantization import use_gguf_blocks

logger = logging.getLogger(__name__)

GGML_Q8_0 = 8  # GGML's type id of Q8_0 blocks
_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def q8_0_blocks(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] float weight (K a multiple of 32) -> [N, K / 32 * 34] uint8 Q8_0 blocks."""
    rows, cols = weight.shape
    if cols % 32:
        raise ValueError(f"Q8_0 needs a multiple of 32 input features, got {cols}")
    w = weight.detach().float().reshape(rows, cols // 32, 32)
    scale = w.abs().amax(dim=-1) / 127.0
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.round(w * inverse.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    d = scale.to(torch.float16).view(torch.uint8).reshape(rows, cols // 32, 2)
    blocks = torch.cat([d, q.view(torch.uint8)], dim=-1)
    assert blocks.shape[-1] == 34  # fp16 scale + 32 int8 codes
    return blocks.reshape(rows, -1).contiguous()


def apply_int8_quantization(model: nn.Module) -> tuple[int, int]:
    """Quantize the decoder projections in place; returns (layers quantized, bytes of blocks)."""
    count = nbytes = 0
    for name, module in model.named_modules():
        if not name.endswith(_PROJECTIONS) or module.quant_method.gguf_weight() is not None:
            continue
        weight = getattr(module, "weight", None)
        if weight is None or weight.dim() != 2 or weight.shape[1] % 32:
            continue
        blocks = q8_0_blocks(weight)
        use_gguf_blocks(module, [(blocks, GGML_Q8_0)])
        count += 1
        nbytes += blocks.numel()
    logger.info("w8a8_int8: %d projections on int8 blocks (%d MB)", count, nbytes // 10**6)
    return count, nbytes
