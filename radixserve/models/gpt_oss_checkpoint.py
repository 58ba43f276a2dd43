"""gpt-oss checkpoint tensors -> the per-expert names FusedMoE's loader takes.

A gpt-oss checkpoint keeps each layer's experts fused, in one of two forms:
- float, as transformers holds and saves them: `experts.gate_up_proj` [experts, hidden,
  2 * inter] (x @ W: inputs along dim 1) whose output columns alternate gate, up, gate, up...,
  `experts.down_proj` [experts, inter, hidden], and biases `gate_up_proj_bias` [experts,
  2 * inter] (alternating the same way) and `down_proj_bias` [experts, hidden];
- MXFP4 (the published checkpoints, quantization_config.quant_method "mxfp4"):
  `experts.gate_up_proj_blocks` / `_scales` and `experts.down_proj_blocks` / `_scales`, which
  decode to [experts, out, in] (the transpose of the float form; gate_up's rows alternate),
  beside the same float biases.
A converted GGUF (models/gguf.py) stacks them with gate and up apart:
`experts.{gate,up,down}_proj.{weight,bias}` [experts, out, in] / [experts, out].
All become `experts.{e}.{gate,up,down}_proj.{weight,bias}` as [out, in] matrices with gate and
up de-interleaved into their own halves, so FusedMoE stacks gate rows first like every other
family and the activation (ClampedSwiGLU) reads halves.

MXFP4 experts go to `keep_blocks` (models/gpt_oss_blocks.py: the layer takes them as blocks,
never decoded) where the caller gives one and it accepts them; otherwise they are decoded one
expert at a time into the model dtype (the float copy of a whole layer never exists at once).

The attention sinks (`self_attn.sinks`) move to the attention layer that uses them
(`self_attn.attn.sinks`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator

import torch

from radixserve.layers.quantization.mxfp4 import dequantize_mxfp4
from radixserve.layers.weight_storage import weight_dtype

logger = logging.getLogger(__name__)

_FLOAT = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)(_bias)?$")
_MXFP4 = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)_(blocks|scales)$")
# A converted GGUF's experts: ffn_{gate,up,down}_exps stacked [experts, out, in] with gate and
# up already apart, and their biases [experts, out].
_STACKED = re.compile(r"^(.*\.experts)\.(gate_proj|up_proj|down_proj)\.(weight|bias)$")
_SINKS = ".self_attn.sinks"


# (experts prefix, "gate_up_proj" | "down_proj", blocks, scales) -> whether it took them.
KeepBlocks = Callable[[str, str, torch.Tensor, torch.Tensor], bool]


def gpt_oss_tensors(
    weights: Iterable[tuple[str, torch.Tensor]], keep_blocks: KeepBlocks | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` with gpt-oss's fused and MXFP4 expert tensors split per expert (see the
    module docstring) and the sinks renamed; everything else passes through. MXFP4 pairs that
    `keep_blocks` takes are not yielded."""
    # MXFP4 halves seen so far: (experts prefix, projection) -> {"blocks"|"scales": tensor}.
    pending: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        if name.endswith(_SINKS):
            yield name[: -len(".sinks")] + ".attn.sinks", tensor
            continue
        packed = _MXFP4.match(name)
        if packed is not None:
            key = (packed[1], packed[2])
            parts = pending.setdefault(key, {})
            parts[packed[3]] = tensor
            if len(parts) == 2:  # a file may list scales and blocks in either order
                del pending[key]
                if keep_blocks is not None and keep_blocks(
                    key[0], key[1], parts["blocks"], parts["scales"]
                ):
                    continue
                yield from _mxfp4_experts(key[0], key[1], parts["blocks"], parts["scales"])
            continue
        stacked = _STACKED.match(name)
        if stacked is not None:
            prefix, proj, kind = stacked[1], stacked[2], stacked[3]
            for e in range(tensor.shape[0]):
                yield f"{prefix}.{e}.{proj}.{kind}", tensor[e]
            continue
        fused = _FLOAT.match(name)
        if fused is None:
            yield name, tensor
        elif fused[3]:
            yield from _split_biases(fused[1], fused[2], tensor)
        else:
            yield from _float_experts(fused[1], fused[2], tensor)
    if pending:
        missing = [f"{prefix}.{proj}" for prefix, proj in pending]
        raise ValueError(f"MXFP4 expert tensors without their blocks or scales: {missing}")


def _per_expert(
    prefix: str, proj: str, count: int, matrix: Callable[[int], torch.Tensor]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each expert's [out, in] matrix (`matrix(e)`), gate_up's alternating rows split into
    gate (even) and up (odd)."""
    for e in range(count):
        w = matrix(e)
        if proj == "down_proj":
            yield f"{prefix}.{e}.down_proj.weight", w
        else:
            yield f"{prefix}.{e}.gate_proj.weight", w[0::2]
            yield f"{prefix}.{e}.up_proj.weight", w[1::2]


def _float_experts(
    prefix: str, proj: str, tensor: torch.Tensor
) -> Iterator[tuple[str, torch.Tensor]]:
    """transformers' [experts, in, out] float form."""
    if tensor.dim() != 3:
        raise ValueError(f"{prefix}.{proj}: expected [experts, in, out], got {tuple(tensor.shape)}")
    yield from _per_expert(prefix, proj, tensor.shape[0], lambda e: tensor[e].t())


def _mxfp4_experts(
    prefix: str, proj: str, blocks: torch.Tensor, scales: torch.Tensor
) -> Iterator[tuple[str, torch.Tensor]]:
    """MXFP4 [experts, out, G, 16] blocks with [experts, out, G] scales, decoded per expert."""
    if blocks.dim() != 4:
        raise ValueError(
            f"{prefix}.{proj}_blocks: expected [experts, out, blocks, 16], got "
            f"{tuple(blocks.shape)}"
        )
    dtype = weight_dtype()
    logger.debug("Decoding MXFP4 experts %s.%s %s", prefix, proj, tuple(blocks.shape))
    yield from _per_expert(
        prefix, proj, blocks.shape[0], lambda e: dequantize_mxfp4(blocks[e], scales[e], dtype)
    )


def _split_biases(
    prefix: str, proj: str, tensor: torch.Tensor
) -> Iterator[tuple[str, torch.Tensor]]:
    """[experts, out] biases, gate_up's alternating columns split like its rows."""
    for e in range(tensor.shape[0]):
        if proj == "down_proj":
            yield f"{prefix}.{e}.down_proj.bias", tensor[e]
        else:
            yield f"{prefix}.{e}.gate_proj.bias", tensor[e, 0::2]
            yield f"{prefix}.{e}.up_proj.bias", tensor[e, 1::2]
