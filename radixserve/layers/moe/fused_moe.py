"""A mixture-of-experts MLP: router top-k, tokens grouped by expert, each expert's gate|up,
activation and down run over its own rows only, results scattered back weighted.

The experts' weights belong to the layer's `quant_method` (methods.py: float, or GGUF blocks);
the routing (router.py) and the grouping here are the same for every form. Accumulation runs
expert by expert in ascending id, as transformers' eager experts do, so float32 results
match it.

Under --tp-size N each rank holds every expert's slice of the intermediate dimension (gate and
up rows, down columns: the dense MLP's column/row split applied per expert), routes the same
tokens to the same experts (the router is replicated), and the partial outputs are summed
across ranks at the end, as a row-parallel layer's are.

Experts may carry biases (gpt-oss): `w13_bias` [experts, 2 * inter] (gate first, sliced per rank
like the rows) and `w2_bias` [experts, hidden], added after each projection. The down bias is
added on one rank per expert (MoE-TP rank 0 of the EP group holding it), so the all-reduce
counts it once.

Under --ep-size E (dividing --tp-size N) the TP ranks form E expert-parallel groups of N / E
ranks: EP group g holds experts [g * X / E, (g + 1) * X / E) whole along the expert axis, and
within a group the intermediate dimension is split as above. Every rank still sees every token
(--moe-a2a-backend none): it runs its own experts over the rows routed to them, rows routed
elsewhere add nothing here, and the TP all-reduce sums the groups' partial outputs.

The router's ids are logical experts; the stacks hold physical slots (placement.py). Without
--ep-num-redundant-experts and before any --enable-eplb move, slot e holds expert e and the ids
are used as they are. Otherwise each routed (token, expert) is first mapped to one physical copy
of the expert (placement.dispatch), and a rank runs the copies in its own slots.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.distributed import parallel_state as ps
from radixserve.layers.activation import get_act_and_mul
from radixserve.layers.linear import copy_checked
from radixserve.layers.moe import expert_stats, placement, routed_capture
from radixserve.layers.moe.methods import ExpertsMethod, UnquantizedExpertsMethod
from radixserve.layers.moe.placement import LayerPlacement
from radixserve.layers.moe.router import RouterSpec, route
from radixserve.options.errors import ServerArgsError


class FusedMoE(nn.Module):
    """The routed experts of one layer. forward(hidden [tokens, hidden], router logits
    [tokens, experts]) -> [tokens, hidden]."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        router: RouterSpec,
        hidden_act: str = "silu",
        bias: bool = False,
        act: nn.Module | None = None,
    ) -> None:
        """`act` replaces the activation `hidden_act` names (gpt-oss's clamped SwiGLU);
        `bias`: per-expert biases on gate|up and down."""
        super().__init__()
        if not 0 < router.top_k <= num_experts:
            raise ValueError(f"top_k {router.top_k} is not within 1..{num_experts} experts")
        self.tp_rank = ps.get_tp_rank()
        self.tp_size = ps.get_tp_size()
        self.ep_size = ps.get_ep_size()
        self.moe_tp_rank = ps.get_moe_tp_rank()
        self.moe_tp_size = ps.get_moe_tp_size()
        self.num_experts = num_experts
        redundant = placement.num_redundant_experts()
        self.num_physical_experts = num_experts + redundant
        if self.num_physical_experts % self.ep_size:
            if redundant:
                raise ServerArgsError(
                    "--ep-num-redundant-experts",
                    f"{redundant} gives {self.num_physical_experts} physical experts (the "
                    f"model's {num_experts} + {redundant}), which --ep-size {self.ep_size} does "
                    "not divide; choose a count that makes the sum a multiple of --ep-size",
                )
            raise ServerArgsError(
                "--ep-size",
                f"{self.ep_size} does not divide the model's {num_experts} experts; use an "
                "--ep-size that divides both the expert count and --tp-size",
            )
        # This rank's physical slots: one contiguous run [expert_start, + num_local_experts).
        self.num_local_experts = self.num_physical_experts // self.ep_size
        self.ep_rank = ps.get_ep_rank()
        self.expert_start = self.ep_rank * self.num_local_experts
        self.set_placement(placement.trivial(num_experts, self.num_physical_experts, self.ep_size))
        self.hidden_size = hidden_size
        # This rank's slice of each local expert's intermediate dimension.
        self.intermediate_size = ps.divide(intermediate_size, self.moe_tp_size, "expert size")
        self.router = router
        self.act = get_act_and_mul(hidden_act) if act is None else act
        # Called where the routing is known (expert_stats.py: --expert-distribution-recorder-mode).
        self.layer_id: int | None = None
        self.quant_method: ExpertsMethod = UnquantizedExpertsMethod()
        self.quant_method.create_weights(
            self, self.num_local_experts, hidden_size, self.intermediate_size
        )
        experts = range(num_experts)
        self.w13_weight.shard_ids = tuple((e, p) for e in experts for p in ("gate", "up"))
        self.w2_weight.shard_ids = tuple((e, "down") for e in experts)
        self.w13_weight.weight_loader = self.weight_loader
        self.w2_weight.weight_loader = self.weight_loader
        self.w13_bias: nn.Parameter | None = None
        self.w2_bias: nn.Parameter | None = None
        if bias:
            dtype = self.w13_weight.dtype
            inter2 = 2 * self.intermediate_size
            self.w13_bias = nn.Parameter(
                torch.empty(self.num_local_experts, inter2, dtype=dtype), requires_grad=False
            )
            self.w2_bias = nn.Parameter(
                torch.empty(self.num_local_experts, hidden_size, dtype=dtype), requires_grad=False
            )
            self.w13_bias.shard_ids = self.w13_weight.shard_ids
            self.w2_bias.shard_ids = self.w2_weight.shard_ids
            self.w13_bias.weight_loader = self.weight_loader
            self.w2_bias.weight_loader = self.weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """Copy this rank's slice of one expert's gate, up (rows) or down (columns) matrix, or
        of its bias, into its place in the stack."""
        # Checked directly, not by a scan of param.shard_ids (2 x experts entries, per tensor).
        is_down = param is self.w2_weight or param is self.w2_bias
        parts = ("down",) if is_down else ("gate", "up")
        if not (
            isinstance(shard_id, tuple)
            and len(shard_id) == 2
            and isinstance(shard_id[0], int)
            and 0 <= shard_id[0] < self.num_experts
            and shard_id[1] in parts
        ):
            raise ValueError(f"not an expert shard of this layer: {shard_id!r}")
        expert, part = shard_id
        # Every local slot holding a copy of this expert (none: another EP rank's expert).
        for local in self.local_slots(expert):
            self._load_slot(param.data[local], loaded_weight, part)

    def _load_slot(self, target: torch.Tensor, loaded_weight: torch.Tensor, part: str) -> None:
        inter = self.intermediate_size
        start = self.moe_tp_rank * inter
        if part == "down":
            if loaded_weight.dim() == 1:  # the down bias: whole on every rank
                copy_checked(target, loaded_weight)
            else:
                copy_checked(target, loaded_weight.narrow(1, start, inter))
            return
        target = target.narrow(0, 0 if part == "gate" else inter, inter)
        copy_checked(target, loaded_weight.narrow(0, start, inter))

    def set_placement(self, layout: LayerPlacement) -> None:
        """Use `layout` for routing (the stacks must already hold it: expert_moves.py)."""
        self.placement = layout
        self.local_logical = layout.local_logical(self.ep_rank)
        # None: slot e holds expert e, the router's ids index the slots as they are.
        self.dispatch_tables = None if layout.is_identity() else layout.dispatch_tables()

    def local_slots(self, logical: int) -> list[int]:
        """This rank's stack indices holding logical expert `logical`."""
        return [i for i, e in enumerate(self.local_logical) if e == logical]

    def local_index(self, physical: int) -> int | None:
        """Where physical slot `physical` sits in this rank's stacks; None if another rank
        holds it."""
        local = physical - self.expert_start
        return local if 0 <= local < self.num_local_experts else None

    def holds_all_experts(self) -> bool:
        return self.num_local_experts == self.num_experts and self.dispatch_tables is None

    def fused_call_allowed(self) -> bool:
        """Whether the one-call C++ decoder layer may run this layer in its place
        (layers/moe/fused_call.py): it routes and runs every expert on one rank, without
        expert biases, and records nothing (so not while expert counts are recorded, nor
        while a step's routed experts are captured)."""
        return (
            self.tp_size == 1
            and self.holds_all_experts()
            and self.w13_bias is None
            and self.w2_bias is None
            and not expert_stats.recording()
            and not routed_capture.capturing()
        )

    # Under --enable-torch-compile the data-dependent expert loop runs eagerly between
    # compiled graphs: traced, each new set of chosen experts recompiled the graph until
    # dynamo's recompile limit gave up on it. compiled_decode wraps forward in
    # torch.compiler.disable for modules that say so; a decorator here would import dynamo
    # (1.2 s) in every start, compiled or not.
    eager_under_compile = True

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, experts = route(router_logits, self.router, hidden.dtype)
        if self.layer_id is not None:
            expert_stats.observe(self.layer_id, experts, self.num_experts)
            routed_capture.observe(self.layer_id, experts)
        if self.dispatch_tables is not None:
            experts = placement.dispatch(experts, *self.dispatch_tables)
        out = self._fused(hidden, weights, experts)
        if out is None:
            out = (
                self._one_token(hidden, weights[0], experts[0])
                if hidden.shape[0] == 1
                else self._grouped(hidden, weights, experts)
            )
        # Each rank summed its slice of the intermediate dimension.
        return out if self.tp_size == 1 else ps.tensor_model_parallel_all_reduce(out)

    def _fused(
        self, hidden: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor | None:
        """The experts' one C++ call for a few rows (kernels/csrc/moe.cpp: the grouped loop's
        sums), where the method has one: SiLU on the C++ kernels, no expert biases."""
        if not getattr(self.act, "use_fast_kernels", False) or self.w13_bias is not None:
            return None
        if not self.holds_all_experts():  # the kernel indexes the stacks by global id
            return None
        return self.quant_method.few_rows(hidden, experts, weights)

    def _grouped(
        self, hidden: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor:
        """Each chosen expert (physical slot) once, over all the rows routed to it."""
        top_k = self.router.top_k
        flat = experts.reshape(-1)
        # Every (token, slot) assignment, ordered by expert: each expert's rows are one run.
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_physical_experts).tolist()
        flat_weights = weights.reshape(-1)
        out = torch.zeros_like(hidden)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue  # never touches that expert's weights
            picks = order[start : start + count]
            start += count
            local = self.local_index(expert)
            if local is None:
                continue  # another EP rank adds this expert's share
            tokens = picks // top_k
            y = self._expert(local, hidden[tokens])
            out.index_add_(0, tokens, y * flat_weights[picks, None])
        return out

    def _one_token(
        self, hidden: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor:
        """A batch-1 decode step: the token's k experts in ascending id, without the grouping's
        index work (a third of a layer's time at batch 1). The same sums in the same order as
        the grouped path over one row, so the same bits."""
        chosen = sorted(zip(experts.tolist(), weights.tolist(), strict=True))
        out = torch.zeros_like(hidden)
        for expert, weight in chosen:
            local = self.local_index(expert)
            if local is not None:  # else another EP rank adds it
                out += self._expert(local, hidden) * weight
        return out

    def _expert(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        """One local expert (its index in this rank's stacks) over its rows: gate|up,
        activation, down, with the biases if any."""
        method = self.quant_method
        gate_up = method.gate_up(self, expert, x)
        if self.w13_bias is not None:
            gate_up = gate_up + self.w13_bias[expert].to(gate_up.dtype)
        y = method.down(self, expert, self.act(gate_up))
        if self.w2_bias is not None and self.moe_tp_rank == 0:
            y = y + self.w2_bias[expert].to(y.dtype)
        return y
