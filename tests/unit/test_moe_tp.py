"""The MoE families on two tensor-parallel ranks (gloo), float32: each rank holds half of every
expert's intermediate dimension (and of the attention heads, the shared expert, the dense
layers), and the prefill and decode logits of both ranks equal transformers'."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.family_check import require_hf_arch
from tests.helpers.hf_reference import hf_logits
from tests.helpers.tiny_models import make_tiny_checkpoint

FAMILIES = ("qwen3_moe", "mixtral", "qwen2_moe", "olmoe")
for _family in FAMILIES:
    require_hf_arch(_family)

PROMPT = [5, 17, 42, 99, 3, 250, 7]


def _tp_worker(rank: int, world: int, init_file: str, folders: list[str]) -> None:
    import torch.distributed as dist

    from radixserve.models.loader import load_model
    from tests.helpers.model_driver import ManualDriver

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for folder in folders:
            loaded = load_model(folder, dtype="float32")
            experts = loaded.model.model.layers[-1].mlp.experts
            assert experts.tp_size == world and experts.w13_weight.shape[1] * world == 2 * (
                loaded.config.hf_config.moe_intermediate_size
                if hasattr(loaded.config.hf_config, "moe_intermediate_size")
                else loaded.config.intermediate_size
            )
            driver = ManualDriver(loaded.model, loaded.config, max_tokens=64)
            prefill = driver.forward([(0, PROMPT)], all_logits=True)
            decode = driver.forward([(0, [9])], decode=True)
            torch.save((prefill, decode), Path(folder) / f"logits-{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_tensor_parallel_ranks_match_transformers(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    models = {tmp_path / f: make_tiny_checkpoint(tmp_path / f, f) for f in FAMILIES}
    folders = [str(folder) for folder in models]
    mp.spawn(_tp_worker, args=(2, str(tmp_path / "rendezvous"), folders), nprocs=2, join=True)
    for folder, hf in models.items():
        reference = hf_logits(hf, [*PROMPT, 9])
        for rank in range(2):
            prefill, decode = torch.load(folder / f"logits-{rank}.pt")
            assert torch.allclose(prefill, reference[:-1], atol=1e-4), (folder.name, rank)
            assert torch.allclose(decode[0], reference[-1], atol=1e-4), (folder.name, rank)
