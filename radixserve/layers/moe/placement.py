"""Where a MoE layer's experts sit: logical experts (the router's ids) on physical expert slots
(--ep-num-redundant-experts: num_experts + N slots, an equal run of them per EP rank), and the
balanced packing that --enable-eplb recomputes from measured load.

Pure functions over plain data: no weights and no collectives (expert_moves.py moves weights,
eplb.py decides when). Every rank computes the same placement from the same counts (the router
is replicated, so every rank saw the same routing), so no placement is ever sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class LayerPlacement:
    """phys_to_log[p]: the logical expert physical slot p holds. EP rank g owns the slots
    [g * slots_per_rank, (g + 1) * slots_per_rank)."""

    phys_to_log: tuple[int, ...]
    num_logical: int
    ep_size: int

    def __post_init__(self) -> None:
        num_physical = len(self.phys_to_log)
        if num_physical % self.ep_size:
            raise ValueError(
                f"{num_physical} physical experts do not split over {self.ep_size} EP ranks"
            )
        if any(not 0 <= e < self.num_logical for e in self.phys_to_log):
            raise ValueError(f"a physical slot names an expert outside 0..{self.num_logical - 1}")
        missing = set(range(self.num_logical)) - set(self.phys_to_log)
        if missing:
            # A logical expert without a slot would silently drop its tokens' share.
            raise ValueError(f"logical experts {sorted(missing)} have no physical slot")

    @property
    def num_physical(self) -> int:
        return len(self.phys_to_log)

    @property
    def slots_per_rank(self) -> int:
        return self.num_physical // self.ep_size

    def rank_of(self, physical: int) -> int:
        return physical // self.slots_per_rank

    def local_logical(self, ep_rank: int) -> tuple[int, ...]:
        """The logical expert of each of EP rank `ep_rank`'s slots, in slot order."""
        start = ep_rank * self.slots_per_rank
        return self.phys_to_log[start : start + self.slots_per_rank]

    @cached_property
    def copies(self) -> tuple[tuple[int, ...], ...]:
        """copies[e]: the physical slots holding logical expert e, ascending."""
        out: list[list[int]] = [[] for _ in range(self.num_logical)]
        for physical, logical in enumerate(self.phys_to_log):
            out[logical].append(physical)
        return tuple(tuple(c) for c in out)

    def is_identity(self) -> bool:
        """One slot per expert, slot e holding expert e: the router's ids are the slots."""
        return self.phys_to_log == tuple(range(self.num_logical))

    def dispatch_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(table [logical, max copies] int64 padded with the first copy, counts [logical])
        for dispatch()."""
        width = max(len(c) for c in self.copies)
        table = torch.tensor([[*c, *(c[0],) * (width - len(c))] for c in self.copies])
        counts = torch.tensor([len(c) for c in self.copies])
        return table, counts


def dispatch(experts: torch.Tensor, table: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Logical ids [tokens, k] -> physical ids: token t's expert e goes to copy t mod (copies of
    e). Deterministic and the same on every rank (SGLang spreads tokens over the copies too; a
    random pick would differ between ranks and lose or double a share)."""
    rows = torch.arange(experts.shape[0], device=experts.device).unsqueeze(-1)
    which = rows % counts.to(experts.device)[experts]
    return table.to(experts.device)[experts, which]


def trivial(num_logical: int, num_physical: int, ep_size: int) -> LayerPlacement:
    """SGLang's trivial placement: slot p holds expert p mod num_logical, so the redundant
    slots repeat the first experts."""
    return LayerPlacement(tuple(p % num_logical for p in range(num_physical)), num_logical, ep_size)


def rank_loads(load: torch.Tensor, placement: LayerPlacement) -> torch.Tensor:
    """Each EP rank's share of `load` [logical] (routings per expert) under `placement`, each
    expert's load split evenly over its copies, as dispatch() spreads it."""
    out = torch.zeros(placement.ep_size, dtype=torch.float64)
    for logical, slots in enumerate(placement.copies):
        share = float(load[logical]) / len(slots)
        for physical in slots:
            out[placement.rank_of(physical)] += share
    return out


def utilization(load: torch.Tensor, placement: LayerPlacement) -> float:
    """Mean over max of the ranks' loads (SGLang's balancedness): 1.0 perfectly balanced, 1 /
    ep_size when one rank does everything; 1.0 with no load."""
    loads = rank_loads(load, placement)
    peak = float(loads.max())
    return float(loads.mean()) / peak if peak > 0 else 1.0


def rebalance(
    load: torch.Tensor, num_physical: int, ep_size: int, current: LayerPlacement | None = None
) -> LayerPlacement:
    """A balanced placement for `load` [logical]: the redundant slots go one by one to the
    expert with the highest load per copy (at most one copy per rank while any expert has
    fewer: a second copy on the same rank balances nothing), then the copies, heaviest first,
    each to the least-loaded rank with a free slot that does not hold that expert yet. Ties
    break by the lowest id, so every rank gets the same answer. `current` is kept when the new
    placement would not lower the busiest rank's load (a move that gains nothing)."""
    new = _pack(load, num_physical, ep_size)
    keep = (
        current is not None
        and current.num_physical == num_physical
        and float(rank_loads(load, current).max()) <= float(rank_loads(load, new).max())
    )
    return current if keep and current is not None else new


def _pack(load: torch.Tensor, num_physical: int, ep_size: int) -> LayerPlacement:
    num_logical = load.numel()
    if num_physical < num_logical or num_physical % ep_size:
        raise ValueError(
            f"{num_physical} physical slots cannot hold {num_logical} experts over {ep_size} ranks"
        )
    weights = [float(x) for x in load.reshape(-1)]
    num_copies = [1] * num_logical
    for _ in range(num_physical - num_logical):
        spread = [e for e in range(num_logical) if num_copies[e] < ep_size] or range(num_logical)
        hottest = max(spread, key=lambda e: (weights[e] / num_copies[e], -e))
        num_copies[hottest] += 1
    items = sorted(
        ((weights[e] / num_copies[e], e) for e in range(num_logical) for _ in range(num_copies[e])),
        key=lambda item: (-item[0], item[1]),
    )
    per_rank = num_physical // ep_size
    rank_load = [0.0] * ep_size
    held: list[list[int]] = [[] for _ in range(ep_size)]
    for share, logical in items:
        free = [g for g in range(ep_size) if len(held[g]) < per_rank]
        apart = [g for g in free if logical not in held[g]] or free
        target = min(apart, key=lambda g: (rank_load[g], g))
        held[target].append(logical)
        rank_load[target] += share
    # Ascending within a rank: the grouped expert loop then runs a rank's slots in logical order.
    return LayerPlacement(
        tuple(e for g in range(ep_size) for e in sorted(held[g])), num_logical, ep_size
    )


def placement_from_map(
    row: Sequence[int], num_logical: int, num_physical: int, ep_size: int
) -> LayerPlacement:
    """One layer's row of a given physical_to_logical_map, checked against the run's slots."""
    if len(row) != num_physical:
        raise ValueError(
            f"a physical_to_logical_map row has {len(row)} slots, this run {num_physical} "
            "(the model's experts + --ep-num-redundant-experts)"
        )
    return LayerPlacement(tuple(int(e) for e in row), num_logical, ep_size)


# --ep-num-redundant-experts, set by the model runner before the model is built (as
# parallel_state's --ep-size): the extra physical slots each MoE layer allocates.
_NUM_REDUNDANT = 0


def set_num_redundant_experts(count: int) -> None:
    global _NUM_REDUNDANT
    _NUM_REDUNDANT = count


def num_redundant_experts() -> int:
    return _NUM_REDUNDANT
