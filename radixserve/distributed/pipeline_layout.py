"""Who is where under pipeline parallelism (--pp-size), as plain arithmetic.

The world is pp_size stages of tp_size ranks: global rank = stage * tp_size + tp rank, so rank
0 (the scheduler) is stage 0's TP rank 0. Stage s runs a contiguous range of decoder layers;
stage 0 also owns the embedding, the last stage the final norm and the LM head. Hidden states go
from each rank to the rank with the same TP index in the next stage; the last stage's TP rank 0
sends the logits back to rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass

# SGLang's override of the split: layers per stage, e.g. "16,15,15,15".
PARTITION_ENV = "SGLANG_PP_LAYER_PARTITION"


def parse_partition(text: str, num_layers: int, pp_size: int) -> list[int]:
    """The layer counts of SGLANG_PP_LAYER_PARTITION; ValueError naming it when they do not
    give every one of the pp_size stages at least one of the model's num_layers layers."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{PARTITION_ENV}={text!r}: expected layer counts like 16,15") from None
    if len(counts) != pp_size or min(counts) < 1 or sum(counts) != num_layers:
        raise ValueError(
            f"{PARTITION_ENV}={text!r}: needs {pp_size} counts (one per --pp-size stage), each "
            f">= 1, adding up to the model's {num_layers} layers"
        )
    return counts


def stage_layers(
    num_layers: int, pp_rank: int, pp_size: int, partition: str | None = None
) -> range:
    """The decoder layers stage `pp_rank` of `pp_size` runs.

    `partition` (SGLANG_PP_LAYER_PARTITION) gives the count per stage. Otherwise near-equal
    contiguous shares; when they do not divide evenly the extra layers go to the stages before
    the last (from the second-to-last backwards), as SGLang does: the last stage also runs the
    LM head. Every stage gets at least one layer (ValueError otherwise).
    """
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pipeline stage {pp_rank} is not in 0..{pp_size - 1}")
    if num_layers < pp_size:
        raise ValueError(
            f"--pp-size {pp_size} needs at least one decoder layer per stage; the model has "
            f"{num_layers}"
        )
    if partition:
        counts = parse_partition(partition, num_layers, pp_size)
    else:
        counts = [num_layers // pp_size] * pp_size
        for i in range(num_layers - sum(counts)):
            counts[-2 - i] += 1
    start = sum(counts[:pp_rank])
    return range(start, start + counts[pp_rank])


@dataclass(frozen=True)
class PipelineLayout:
    tp_size: int
    pp_size: int

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def stage_of(self, rank: int) -> int:
        return rank // self.tp_size

    def tp_rank_of(self, rank: int) -> int:
        return rank % self.tp_size

    def stage_ranks(self, stage: int) -> list[int]:
        """The global ranks of `stage` (its TP group), in TP order."""
        return list(range(stage * self.tp_size, (stage + 1) * self.tp_size))

    def next_rank(self, rank: int) -> int | None:
        """Where `rank` sends its hidden states (None on the last stage)."""
        stage = self.stage_of(rank)
        return None if stage == self.pp_size - 1 else rank + self.tp_size

    def prev_rank(self, rank: int) -> int | None:
        """Where `rank` receives hidden states from (None on stage 0)."""
        return None if self.stage_of(rank) == 0 else rank - self.tp_size

    @property
    def logits_sender(self) -> int:
        """The rank that sends each step's logits to rank 0: the last stage's TP rank 0."""
        return (self.pp_size - 1) * self.tp_size


def micro_batches(num_reqs: int, max_size: int | None) -> list[range]:
    """Consecutive request ranges of at most `max_size` (None: the whole batch at once)."""
    if num_reqs == 0:
        return []
    size = max_size or num_reqs
    return [range(i, min(i + size, num_reqs)) for i in range(0, num_reqs, size)]
