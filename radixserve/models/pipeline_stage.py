"""What one pipeline stage of a Llama-shaped model builds and loads (--pp-size).

A stage builds only its own decoder layers (the others are PPMissingLayer placeholders without
parameters, so layer indices and KV-cache layer ids stay global); the embedding only on stage 0,
the final norm and LM head only on the last stage. Checkpoint tensors of parts a stage does not
hold are skipped by name, so loading reads them but keeps nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from radixserve.distributed import parallel_state as ps
from radixserve.distributed.pipeline_layout import PARTITION_ENV, stage_layers


class PPMissingLayer(nn.Module):
    """Stands for a part of the model another pipeline stage holds; never called."""

    def forward(self, *args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("this part of the model belongs to another pipeline stage")


@dataclass(frozen=True)
class StagePlan:
    layers: range  # the decoder layers this stage runs
    num_layers: int  # all of the model's decoder layers
    first: bool  # holds the embedding
    last: bool  # holds the final norm and the LM head

    def owns(self, layer_id: int) -> bool:
        return layer_id in self.layers

    def skip_names(self, tie_word_embeddings: bool) -> list[str]:
        """Checkpoint name fragments of tensors this stage does not hold."""
        if self.first and self.last:
            return []
        skip = [f"model.layers.{i}." for i in range(self.num_layers) if i not in self.layers]
        if not self.first and not (self.last and tie_word_embeddings):
            skip.append("model.embed_tokens.")
        if not self.last:
            skip += ["model.norm.", "lm_head."]
        return skip


def stage_plan(num_layers: int) -> StagePlan:
    """This process's stage (every layer, first and last, without pipeline parallelism)."""
    rank, size = ps.get_pp_rank(), ps.get_pp_size()
    if size == 1:
        return StagePlan(range(num_layers), num_layers, True, True)
    layers = stage_layers(num_layers, rank, size, os.environ.get(PARTITION_ENV))
    return StagePlan(layers, num_layers, rank == 0, rank == size - 1)


def stage_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
    plan: StagePlan,
    tie_word_embeddings: bool,
    skip_names: Iterable[str],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint tensors this stage loads: those named by `skip_names` (or held by other
    stages) dropped, and on a last stage without the embedding, a tied LM head (its own module
    there) loaded from the embedding tensor."""
    skip = [*skip_names, *plan.skip_names(tie_word_embeddings)]
    retarget = tie_word_embeddings and plan.last and not plan.first
    for name, tensor in weights:
        if any(part in name for part in skip):
            continue
        if retarget and name == "model.embed_tokens.weight":
            yield "lm_head.weight", tensor
        else:
            yield name, tensor
