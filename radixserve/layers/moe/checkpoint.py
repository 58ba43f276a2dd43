"""Expert tensors' checkpoint names -> the stacked parameters of a FusedMoE.

Checkpoints lay experts out two ways, both accepted:
- one tensor per expert and projection, `<...>.experts.{e}.gate_proj.weight` (published Qwen
  and OLMoE checkpoints, and what transformers 5.x writes back), or Mixtral's `w1` (gate),
  `w3` (up), `w2` (down);
- stacked 3-D tensors, `<...>.experts.gate_up_proj` [experts, 2 * inter, hidden] (gate rows
  first) and `<...>.experts.down_proj` [experts, hidden, inter] (transformers' in-memory form),
  or `gate_proj` / `up_proj` [experts, inter, hidden] each (a converted GGUF's
  `ffn_{gate,up,down}_exps`); these are split into per-expert views here, so one loader path
  copies every form.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

# A FusedMoE parameter's shard: (expert, "gate" | "up" | "down").
ExpertShard = tuple[int, str]

_PER_EXPERT = re.compile(
    r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.(weight|bias)$"
)
_STACKED = re.compile(r"^(.*\.experts)\.(gate_up_proj|gate_proj|up_proj|down_proj)(?:\.weight)?$")
_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up"}


def expert_shard(name: str) -> tuple[str, ExpertShard] | None:
    """(FusedMoE parameter name, shard) for a per-expert checkpoint tensor (a weight, or a
    bias where the family has them: gpt-oss), else None."""
    match = _PER_EXPERT.match(name)
    if match is None:
        return None
    prefix, expert, proj, kind = match.group(1), int(match.group(2)), match.group(3), match[4]
    part = _PART.get(proj)
    if part is None:  # down_proj / w2
        return f"{prefix}.w2_{kind}", (expert, "down")
    return f"{prefix}.w13_{kind}", (expert, part)


def per_expert_tensors(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` with every stacked 3-D expert tensor replaced by its per-expert slices (views,
    named as per-expert checkpoints name them); everything else passes through."""
    for name, tensor in weights:
        match = _STACKED.match(name)
        if match is None or tensor.dim() != 3:
            yield name, tensor
            continue
        prefix, proj = match.group(1), match.group(2)
        if proj == "gate_up_proj":
            gate, up = tensor.chunk(2, dim=1)
            for e in range(tensor.shape[0]):
                yield f"{prefix}.{e}.gate_proj.weight", gate[e]
                yield f"{prefix}.{e}.up_proj.weight", up[e]
        else:
            for e in range(tensor.shape[0]):
                yield f"{prefix}.{e}.{proj}.weight", tensor[e]
