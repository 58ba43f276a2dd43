"""OLMo 2 (Olmo2ForCausalLM) on tiny random checkpoints, float32: greedy tokens equal
transformers' on both attention backends (post-norm layers, q/k norms over the full projection
width, off the one-call C++ decoder layer); on two tensor-parallel ranks the q/k norms span both
ranks' heads, kv heads split or replicated."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.family_check import (
    BACKENDS,
    engine_greedy,
    fused_layers,
    require_hf_arch,
    transformers_greedy,
)
from tests.helpers.hf_reference import hf_logits
from tests.helpers.tiny_models import make_tiny_checkpoint

require_hf_arch("olmo2")

PROMPTS = [[3, 5, 9, 30, 12], [4, *range(40, 52)], [6, *range(60, 100)]]
TP_PROMPT = [5, 17, 42, 99, 3, 250, 7]


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("olmo2")
    return folder, make_tiny_checkpoint(folder, "olmo2")


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(olmo2: tuple, backend: str) -> None:
    folder, hf = olmo2
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)


def test_layers_run_module_by_module(olmo2: tuple) -> None:
    folder, _ = olmo2
    assert fused_layers(folder) == [False, False]


def _tp_worker(rank: int, world: int, init_file: str, folders: list[str]) -> None:
    import torch.distributed as dist

    from radixserve.models.loader import load_model
    from tests.helpers.model_driver import ManualDriver

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for folder in folders:
            loaded = load_model(folder, dtype="float32")
            driver = ManualDriver(loaded.model, loaded.config, max_tokens=64)
            prefill = driver.forward([(0, TP_PROMPT)], all_logits=True)
            decode = driver.forward([(0, [9])], decode=True)
            torch.save((prefill, decode), Path(folder) / f"logits-{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_tensor_parallel_ranks_match_transformers(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    # Two kv heads split over the ranks; one kv head replicated on both.
    models = {
        tmp_path / f"kv{kv}": make_tiny_checkpoint(
            tmp_path / f"kv{kv}", "olmo2", **{"num_key_value_heads": kv}
        )
        for kv in (2, 1)
    }
    folders = [str(folder) for folder in models]
    mp.spawn(_tp_worker, args=(2, str(tmp_path / "rendezvous"), folders), nprocs=2, join=True)
    for folder, hf in models.items():
        reference = hf_logits(hf, [*TP_PROMPT, 9])
        for rank in range(2):
            prefill, decode = torch.load(folder / f"logits-{rank}.pt")
            assert torch.allclose(prefill, reference[:-1], atol=1e-4)
            assert torch.allclose(decode[0], reference[-1], atol=1e-4)
