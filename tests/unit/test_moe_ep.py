"""--ep-size: expert parallelism inside the TP group (gloo, float32). With tp 2 and ep 2 each
rank holds half the experts whole and skips the rows routed to the other half; with ep 1 it
holds half of every expert. Either way the all-reduced logits equal transformers'."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.family_check import require_hf_arch
from tests.helpers.hf_reference import hf_logits
from tests.helpers.tiny_models import make_tiny_checkpoint

FAMILIES = ("qwen3_moe", "mixtral")
for _family in FAMILIES:
    require_hf_arch(_family)

PROMPT = [5, 17, 42, 99, 3, 250, 7]
NUM_EXPERTS = 8  # tests/helpers/tiny_models.py's MoE families


def _ep_worker(rank: int, world: int, ep: int, init_file: str, folders: list[str]) -> None:
    import torch.distributed as dist

    from radixserve.distributed import parallel_state as ps
    from radixserve.models.loader import load_model
    from tests.helpers.model_driver import ManualDriver

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ps.set_ep_size(ep)
    moe_tp = world // ep
    try:
        for folder in folders:
            loaded = load_model(folder, dtype="float32")
            experts = loaded.model.model.layers[-1].mlp.experts
            # 1/ep of the experts, whole along the expert axis; each split over moe_tp ranks.
            local = NUM_EXPERTS // ep
            assert (experts.num_local_experts, experts.w13_weight.shape[0]) == (local, local)
            assert experts.expert_start == (rank // moe_tp) * local
            assert (experts.moe_tp_size, experts.moe_tp_rank) == (moe_tp, rank % moe_tp)
            assert not experts.fused_call_allowed()
            driver = ManualDriver(loaded.model, loaded.config, max_tokens=64)
            prefill = driver.forward([(0, PROMPT)], all_logits=True)
            decode = driver.forward([(0, [9])], decode=True)
            torch.save((prefill, decode), Path(folder) / f"logits-{rank}.pt")
    finally:
        ps.set_ep_size(1)
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("world", "ep", "families"),
    [(2, 2, FAMILIES), (4, 2, ("qwen3_moe",))],
    ids=["tp2-ep2", "tp4-ep2"],
)
def test_expert_parallel_ranks_match_transformers(
    tmp_path: Path, world: int, ep: int, families: tuple[str, ...]
) -> None:
    import torch.multiprocessing as mp

    models = {tmp_path / f: make_tiny_checkpoint(tmp_path / f, f) for f in families}
    folders = [str(folder) for folder in models]
    rendezvous = str(tmp_path / "rendezvous")
    mp.spawn(_ep_worker, args=(world, ep, rendezvous, folders), nprocs=world, join=True)
    for folder, hf in models.items():
        reference = hf_logits(hf, [*PROMPT, 9])
        for rank in range(world):
            prefill, decode = torch.load(folder / f"logits-{rank}.pt")
            assert torch.allclose(prefill, reference[:-1], atol=1e-4), (folder.name, rank)
            assert torch.allclose(decode[0], reference[-1], atol=1e-4), (folder.name, rank)


def test_ep_size_must_divide_tp_size() -> None:
    from radixserve.options.errors import ServerArgsError
    from radixserve.server_args import ServerArgs

    with pytest.raises(ServerArgsError, match="--ep-size: 3 must divide --tp-size 2"):
        ServerArgs.from_kwargs(tp_size=2, ep_size=3)


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["--moe-a2a-backend", "deepep"], "--moe-a2a-backend deepep (supported: none)"),
        (["--moe-runner-backend", "triton"], "--moe-runner-backend triton (supported: auto)"),
        (["--expert-distribution-recorder-mode", "per_token"], "(supported: stat)"),
        (["--eplb-algorithm", "elasticity_aware"], "--eplb-algorithm"),
    ],
)
def test_unimplemented_moe_options_are_refused(argv: list[str], refused: str) -> None:
    from radixserve.options.errors import ServerArgsError
    from radixserve.server_args import ServerArgs

    with pytest.raises(ServerArgsError) as err:
        ServerArgs.from_cli(argv)
    assert refused in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("argv", [["--enable-eplb"], ["--ep-num-redundant-experts", "2"]])
def test_expert_placement_needs_expert_parallelism(argv: list[str]) -> None:
    from radixserve.options.errors import ServerArgsError
    from radixserve.server_args import ServerArgs

    with pytest.raises(ServerArgsError, match="needs --ep-size > 1"):
        ServerArgs.from_cli(argv)


def test_ep_size_must_divide_the_experts(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixserve.distributed import parallel_state as ps
    from radixserve.layers.moe import FusedMoE
    from radixserve.layers.moe.router import RouterSpec
    from radixserve.options.errors import ServerArgsError

    monkeypatch.setattr(ps, "get_tp_size", lambda: 4)
    monkeypatch.setattr(ps, "get_tp_rank", lambda: 0)
    monkeypatch.setattr(ps, "_EP_SIZE", 4)
    with pytest.raises(ServerArgsError, match="--ep-size: 4 does not divide the model's 6"):
        FusedMoE(6, 16, 32, RouterSpec(top_k=2))


def test_engine_tp2_ep2_greedy_equals_one_rank(tmp_path: Path) -> None:
    """The whole serving path (scheduler, rank 1 in its own process): the same greedy tokens."""
    from radixserve import Engine

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
    greedy = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    with Engine(runtime="thread", **kwargs) as single:
        expected = [
            r["output_ids"] for r in single.generate(input_ids=prompts, sampling_params=greedy)
        ]
    with Engine(tp_size=2, ep_size=2, dist_timeout=20, **kwargs) as engine:
        got = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=greedy)]
    assert got == expected


def test_gguf_expert_blocks_keep_only_the_local_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GGUF file's stacks hold every expert; rank 1 of ep 2 keeps experts 3..5 of 6."""
    from radixserve.distributed import parallel_state as ps
    from radixserve.layers.moe import ExpertBlocks, FusedMoE, use_gguf_experts
    from radixserve.layers.moe.router import RouterSpec

    monkeypatch.setattr(ps, "get_tp_size", lambda: 2)
    monkeypatch.setattr(ps, "get_tp_rank", lambda: 1)
    monkeypatch.setattr(ps, "_EP_SIZE", 2)
    layer = FusedMoE(6, 16, 32, RouterSpec(top_k=2))
    assert (layer.expert_start, layer.num_local_experts, layer.intermediate_size) == (3, 3, 32)
    experts = torch.arange(6, dtype=torch.uint8)[:, None, None]
    gate, up = (ExpertBlocks(experts.expand(6, 32, 8).clone(), 8, 32) for _ in range(2))
    down = ExpertBlocks(experts.expand(6, 16, 8).clone(), 8, 16)
    method = use_gguf_experts(layer, [gate, up], down)
    assert method.gate_up_parts[0].blocks.shape == (3, 64, 8)
    assert method.gate_up_parts[0].blocks[:, 0, 0].tolist() == [3, 4, 5]
    assert method.down_part.blocks[:, 0, 0].tolist() == [3, 4, 5]
