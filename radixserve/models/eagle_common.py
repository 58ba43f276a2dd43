"""What EAGLE draft heads share: parts taken from the target model, and checkpoint names.

An EAGLE head checkpoint (SGLang's layout, as the EAGLE authors publish them) names its tensors
without the `model.` prefix (`fc.weight`, `layers.0.self_attn.q_proj.weight`, `midlayer.*`,
`norm.weight`) and usually leaves out the embedding, and an EAGLE-1 head the LM head too: those
are the target model's, shared after loading (`share_target_parts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn


class FromTarget(nn.Module):
    """Stands for a module the head takes from the target model once both are loaded."""

    def forward(self, *args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("an EAGLE head part was not taken from the target model")


def head_weight_names(
    weights: Iterable[tuple[str, torch.Tensor]], keep_top_level: tuple[str, ...]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint names mapped onto the head module: `model.` prefixed, except the names in
    `keep_top_level` (and names that already carry the prefix)."""
    for name, tensor in weights:
        if name.startswith("model.") or name.split(".")[0] in keep_top_level:
            yield name, tensor
        else:
            yield f"model.{name}", tensor


def has_tensor(weights: list[tuple[str, torch.Tensor]], fragment: str) -> bool:
    return any(fragment in name for name, _ in weights)
