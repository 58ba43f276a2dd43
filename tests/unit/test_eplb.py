"""Expert placement: --ep-num-redundant-experts (extra physical copies), --init-expert-location
and --enable-eplb (rebalancing from measured load, weights moved between ranks by gloo
broadcast). The algorithm's unit checks, the refusals, and two ranks whose logits stay equal
to transformers' across a move, and whose greedy tokens equal one rank's across rebalances."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from radixserve.layers.moe import eplb, placement
from radixserve.layers.moe.expert_location import initial_placements
from radixserve.layers.moe.expert_moves import transfers
from radixserve.layers.moe.placement import (
    LayerPlacement,
    dispatch,
    rank_loads,
    rebalance,
    trivial,
    utilization,
)
from radixserve.options.errors import ServerArgsError
from tests.helpers.family_check import require_hf_arch
from tests.helpers.tiny_models import make_tiny_checkpoint

SKEWED = torch.tensor([10.0, 10, 10, 10, 10, 10, 400, 900])
PROMPT = [5, 17, 42, 99, 3, 250, 7]
LONG_PROMPT = list(range(20, 60))


def test_trivial_placement_repeats_the_first_experts() -> None:
    layout = trivial(8, 10, 2)
    assert layout.phys_to_log == (0, 1, 2, 3, 4, 5, 6, 7, 0, 1)
    assert layout.local_logical(1) == (5, 6, 7, 0, 1)
    assert layout.copies[0] == (0, 8) and layout.copies[7] == (7,)
    assert trivial(8, 8, 2).is_identity() and not layout.is_identity()


@pytest.mark.parametrize(("ep", "redundant"), [(2, 2), (2, 0), (4, 4)])
def test_rebalance_lowers_the_busiest_rank(ep: int, redundant: int) -> None:
    physical = 8 + redundant
    before = trivial(8, physical, ep)
    after = rebalance(SKEWED, physical, ep)
    # Every slot used, every expert placed at least once, equal runs per rank.
    assert after.num_physical == physical and after.slots_per_rank == physical // ep
    assert all(len(c) >= 1 for c in after.copies)
    assert float(rank_loads(SKEWED, after).max()) < float(rank_loads(SKEWED, before).max())
    assert utilization(SKEWED, after) > utilization(SKEWED, before)
    if redundant:
        # The redundant slots went to the hottest expert first.
        assert len(after.copies[7]) > 1
        assert len(after.copies[7]) >= len(after.copies[6]) >= len(after.copies[0]) == 1
    # The same answer every time (every rank computes it on its own).
    assert rebalance(SKEWED, physical, ep) == after


def test_rebalance_keeps_copies_of_one_expert_apart() -> None:
    """Two copies on one rank balance nothing: the second redundant slot goes to expert 1."""
    after = rebalance(torch.tensor([100.0, 1, 1, 1]), 6, 2)
    assert [len(c) for c in after.copies] == [2, 2, 1, 1]
    assert {after.rank_of(p) for p in after.copies[0]} == {0, 1}


def test_rebalance_keeps_a_placement_that_is_already_best() -> None:
    load = torch.tensor([900.0, 400, 10, 10, 10, 10, 10, 10])
    current = trivial(8, 10, 2)  # 0 and 1 doubled, one copy each per rank: already even
    assert rebalance(load, 10, 2, current) is current
    assert rebalance(SKEWED, 10, 2, current) != current


def test_dispatch_spreads_tokens_over_an_experts_copies() -> None:
    layout = LayerPlacement((0, 1, 2, 0, 3, 0), num_logical=4, ep_size=2)
    table, counts = layout.dispatch_tables()
    experts = torch.tensor([[0, 1]] * 6)
    physical = dispatch(experts, table, counts)
    # Every pick is a copy of the routed expert, and the 6 tokens use each copy of 0 twice.
    assert all(
        layout.phys_to_log[p] == e
        for p, e in zip(physical.flatten().tolist(), experts.flatten().tolist(), strict=True)
    )
    assert sorted(physical[:, 0].tolist()) == [0, 0, 3, 3, 5, 5]
    assert physical[:, 1].tolist() == [1] * 6


def test_a_placement_without_some_expert_is_refused() -> None:
    with pytest.raises(ValueError, match=r"logical experts \[3\] have no physical slot"):
        LayerPlacement((0, 1, 2, 0), num_logical=4, ep_size=2)
    with pytest.raises(ValueError, match="do not split over 2 EP ranks"):
        LayerPlacement((0, 1, 2), num_logical=3, ep_size=2)


def test_transfers_name_only_the_experts_a_rank_gains() -> None:
    old = trivial(4, 6, 2)  # rank 0: 0 1 2, rank 1: 3 0 1
    new = LayerPlacement((0, 0, 3, 1, 2, 3), num_logical=4, ep_size=2)
    assert transfers(old, new) == [(3, 1, 0), (2, 0, 1)]


def _fake_layer(num_experts: int = 8, redundant: int = 2, ep: int = 2) -> SimpleNamespace:
    physical = num_experts + redundant
    return SimpleNamespace(
        num_experts=num_experts,
        num_physical_experts=physical,
        ep_size=ep,
        placement=trivial(num_experts, physical, ep),
    )


def test_init_expert_location_reads_a_map_or_counts(tmp_path: Path) -> None:
    layers = {1: _fake_layer()}  # layer 0 dense
    row = [7, 6, 5, 4, 3, 2, 1, 0, 7, 7]
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"physical_to_logical_map": [[0] * 10, row]}))
    assert initial_placements(str(path), layers)[1].phys_to_log == tuple(row)
    counts = torch.zeros(2, 8)
    counts[1] = SKEWED
    pt = tmp_path / "expert_distribution_recorder_1.pt"
    torch.save({"rank": 0, "logical_count": counts}, pt)
    assert initial_placements(str(pt), layers)[1] == rebalance(SKEWED.double(), 10, 2)
    assert initial_placements("trivial", layers) == {}


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        ('{"physical_to_logical_map": [[0, 1], [0, 1]]}', "has 2 slots, this run 10"),
        ('{"something": 1}', "unknown format"),
        ("placement.txt", "not trivial, a .pt or .json file"),
        ("/nonexistent/where.json", "cannot read"),
    ],
)
def test_init_expert_location_refusals(spec: str, refused: str) -> None:
    with pytest.raises(ServerArgsError, match="--init-expert-location") as err:
        initial_placements(spec, {1: _fake_layer()})
    assert refused in str(err.value)


def test_plan_skips_when_already_balanced() -> None:
    layer = _fake_layer(redundant=0)
    even = torch.full((8,), 10.0)
    # Balanced: nothing above threshold 0.5 is worth moving.
    assert eplb.plan({1: layer}, {1: even}, threshold=0.5) is None
    moves = eplb.plan({1: layer}, {1: SKEWED}, threshold=1.0)
    assert moves and moves[0].layer_id == 1 and moves[0].after > moves[0].before


@pytest.mark.parametrize(
    ("kwargs", "option", "refused"),
    [
        ({"ep_num_redundant_experts": 2}, "--ep-num-redundant-experts", "needs --ep-size > 1"),
        ({"enable_eplb": True}, "--enable-eplb", "needs --ep-size > 1"),
        ({"init_expert_location": "x.json"}, "--init-expert-location", "needs --ep-size > 1"),
        ({"tp_size": 2, "ep_size": 2, "ep_num_redundant_experts": -1}, "--ep-num", ">= 0"),
        ({"tp_size": 2, "ep_size": 2, "eplb_algorithm": "lp"}, "--eplb-algorithm", "'lp'"),
        (
            {"tp_size": 2, "ep_size": 2, "eplb_rebalance_num_iterations": 0},
            "--eplb-rebalance-num-iterations",
            "must be > 0",
        ),
        (
            {"tp_size": 2, "ep_size": 2, "eplb_min_rebalancing_utilization_threshold": 1.5},
            "--eplb-min-rebalancing-utilization-threshold",
            "within 0..1",
        ),
    ],
)
def test_placement_options_are_refused_clearly(
    kwargs: dict[str, object], option: str, refused: str
) -> None:
    from radixserve.server_args import ServerArgs

    with pytest.raises(ServerArgsError) as err:
        ServerArgs.from_kwargs(**kwargs)
    text = str(err.value)
    assert text.startswith(option) and refused in text and "\n" not in text


def test_physical_experts_must_divide_by_ep_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixserve.distributed import parallel_state as ps
    from radixserve.layers.moe import FusedMoE
    from radixserve.layers.moe.router import RouterSpec

    monkeypatch.setattr(ps, "get_tp_size", lambda: 2)
    monkeypatch.setattr(ps, "get_tp_rank", lambda: 0)
    monkeypatch.setattr(ps, "_EP_SIZE", 2)
    monkeypatch.setattr(placement, "_NUM_REDUNDANT", 1)
    with pytest.raises(ServerArgsError, match="--ep-num-redundant-experts: 1 gives 9 physical"):
        FusedMoE(8, 16, 32, RouterSpec(top_k=2))


def test_gguf_blocks_follow_the_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GGUF file's stacks hold every expert once; rank 1 of ep 2 with 2 redundant slots keeps
    copies of experts 5, 6, 7, 0, 1 (the trivial placement)."""
    from radixserve.distributed import parallel_state as ps
    from radixserve.layers.moe import ExpertBlocks, FusedMoE, use_gguf_experts
    from radixserve.layers.moe.router import RouterSpec

    monkeypatch.setattr(ps, "get_tp_size", lambda: 2)
    monkeypatch.setattr(ps, "get_tp_rank", lambda: 1)
    monkeypatch.setattr(ps, "_EP_SIZE", 2)
    monkeypatch.setattr(placement, "_NUM_REDUNDANT", 2)
    layer = FusedMoE(8, 16, 32, RouterSpec(top_k=2))
    ids = torch.arange(8, dtype=torch.uint8)[:, None, None]
    gate, up = (ExpertBlocks(ids.expand(8, 32, 8).clone(), 8, 32) for _ in range(2))
    down = ExpertBlocks(ids.expand(8, 16, 8).clone(), 8, 16)
    method = use_gguf_experts(layer, [gate, up], down)
    assert method.gate_up_parts[0].blocks[:, 0, 0].tolist() == [5, 6, 7, 0, 1]
    assert method.down_part.blocks[:, 0, 0].tolist() == [5, 6, 7, 0, 1]


def _move_worker(rank: int, world: int, init_file: str, folder: str) -> None:
    import torch.distributed as dist

    from radixserve.distributed import parallel_state as ps
    from radixserve.layers.moe import expert_stats
    from radixserve.layers.moe.expert_moves import moe_layers, move_layer
    from radixserve.models.loader import load_model
    from tests.helpers.model_driver import ManualDriver

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ps.set_ep_size(2)
    placement.set_num_redundant_experts(2)
    try:
        loaded = load_model(folder, dtype="float32")
        expert_stats.attach(loaded.model)
        layers = moe_layers(loaded.model)
        assert layers and all(m.w13_weight.shape[0] == 5 for m in layers.values())
        driver = ManualDriver(loaded.model, loaded.config, max_tokens=64)
        prefill = driver.forward([(0, PROMPT)], all_logits=True)
        target = rebalance(SKEWED, 10, 2)
        moved = {i: move_layer(layer, target) for i, layer in layers.items()}
        assert all(n > 0 for n in moved.values())
        assert all(layer.placement == target for layer in layers.values())
        decode = driver.forward([(0, [9])], decode=True)  # KV from before the move
        # Many rows: every copy of the hot experts takes some (token t -> copy t mod copies).
        second = driver.forward([(1, LONG_PROMPT)], all_logits=True)
        torch.save((prefill, decode, second), Path(folder) / f"logits-{rank}.pt")
    finally:
        ps.set_ep_size(1)
        placement.set_num_redundant_experts(0)
        dist.destroy_process_group()


# gpt-oss: expert biases move with the weights; DeepSeek-V2: a dense first layer, grouped
# routing and shared experts beside the moved ones.
@pytest.mark.parametrize(
    "family",
    [
        "qwen3_moe",
        pytest.param("gpt_oss", marks=pytest.mark.slow),
        pytest.param("deepseek_v2", marks=pytest.mark.slow),
    ],
)
def test_moved_experts_keep_the_logits(tmp_path: Path, family: str) -> None:
    """tp 2, ep 2, 2 redundant slots: logits equal transformers' before and after every layer's
    experts moved to a skewed-load placement in the middle of a request."""
    import torch.multiprocessing as mp

    from tests.helpers.hf_reference import hf_logits

    require_hf_arch(family)
    folder = tmp_path / family
    hf = make_tiny_checkpoint(folder, family)
    mp.spawn(_move_worker, args=(2, str(tmp_path / "rdv"), str(folder)), nprocs=2, join=True)
    reference = hf_logits(hf, [*PROMPT, 9])
    long_reference = hf_logits(hf, LONG_PROMPT)
    for rank in range(2):
        prefill, decode, second = torch.load(folder / f"logits-{rank}.pt")
        assert torch.allclose(prefill, reference[:-1], atol=1e-4), rank
        assert torch.allclose(decode[0], reference[-1], atol=1e-4), rank
        assert torch.allclose(second, long_reference, atol=1e-4), rank


REVERSED = json.dumps({"physical_to_logical_map": [[7, 6, 5, 4, 3, 2, 1, 0, 7, 6]] * 2})
PLACEMENTS = {
    # Rebalanced every 2 forward passes, one layer per pass, in the middle of generation.
    "eplb": {
        "enable_eplb": True,
        "eplb_rebalance_num_iterations": 2,
        "eplb_rebalance_layers_per_chunk": 1,
    },
    # Started from a given map (inline JSON): every expert moved at start-up, none later.
    "init-map": {"init_expert_location": REVERSED},
}


@pytest.mark.parametrize("case", ["eplb", pytest.param("init-map", marks=pytest.mark.slow)])
def test_engine_placement_greedy_equals_one_rank(tmp_path: Path, case: str) -> None:
    """The serving path, tp 2 / ep 2 with 2 redundant slots: the same greedy tokens as one
    rank."""
    from radixserve import Engine

    require_hf_arch("qwen3_moe")
    folder = tmp_path / "qwen3_moe"
    make_tiny_checkpoint(folder, "qwen3_moe")
    kwargs = {
        "model_path": str(folder),
        "dtype": "float32",
        "skip_tokenizer_init": True,
        "max_total_tokens": 1024,
        "random_seed": 0,
    }
    prompts = [[5, 6, 7, 8], list(range(30, 50)), [9, 10, 11]]
    greedy = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    with Engine(runtime="thread", **kwargs) as single:
        expected = [
            r["output_ids"] for r in single.generate(input_ids=prompts, sampling_params=greedy)
        ]
    with Engine(
        tp_size=2,
        ep_size=2,
        ep_num_redundant_experts=2,
        dist_timeout=20,
        **PLACEMENTS[case],
        **kwargs,
    ) as engine:
        got = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=greedy)]
        info = engine.get_server_info()
    assert got == expected
    if case == "eplb":
        assert info["eplb_rebalances_total"] >= 2
        assert info["eplb_layers_moved_total"] >= 2
    else:
        assert "eplb_rebalances_total" not in info


def test_manager_rebalances_every_n_passes_in_chunks(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every 3 passes a decision from the window's counts; one layer moves per pass; each move
    is logged with its balancedness before and after."""
    from radixserve.layers.moe import expert_stats

    moved: list[tuple[int, int]] = []

    def fake_move(layer: SimpleNamespace, new: LayerPlacement) -> int:
        moved.append((layer.layer_id, manager.passes))
        layer.placement = new
        return 1

    monkeypatch.setattr(eplb, "move_layer", fake_move)
    layers = {i: _fake_layer() for i in (0, 1)}
    for i, layer in layers.items():
        layer.layer_id = i
    config = eplb.EPLBConfig(
        rebalance_num_iterations=3, layers_per_chunk=1, min_utilization_threshold=1.0
    )
    manager = eplb.EPLBManager(layers, config)  # type: ignore[arg-type]
    caplog.set_level("INFO", logger=eplb.__name__)
    try:
        routed = torch.tensor([[7, 6]] * 50 + [[0, 1]] * 5)  # experts 6 and 7 hot
        for _ in range(4):
            for i in layers:
                expert_stats.observe(i, routed, 8)
            manager.on_forward_pass_end()
    finally:
        manager.close()
    # Decided at pass 3: layer 0 moved then, layer 1 at pass 4.
    assert moved == [(0, 3), (1, 4)]
    assert manager.rebalances == 1 and manager.layers_moved == 2
    assert all(len(layer.placement.copies[7]) == 2 for layer in layers.values())
    logged = [r.getMessage() for r in caplog.records if "moved layers" in r.getMessage()]
    assert len(logged) == 2 and "balancedness" in logged[0] and "1 layers left" in logged[0]
    assert expert_stats._EPLB_COUNTS is None
