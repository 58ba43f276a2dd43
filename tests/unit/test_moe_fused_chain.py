"""A Qwen3-MoE model on GGUF blocks (attention, router-free experts, per-head q/k norms) runs
all its decoder layers in one C++ call (LlamaLayerChain with set_qk_norm/set_moe,
kernels/csrc/moe_layer.cpp): the same calls as the module-by-module fast path, so the logits
of prefill, mixed and decode steps, batch 1 (the one-token expert kernel) and batch 2 (tokens
grouped by expert), are bitwise equal."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.kernels import build, ops
from radixserve.kernels import gguf_types as gt
from radixserve.layers.attention.cpu_paged import CpuPagedAttnBackend
from radixserve.layers.fast_path import use_fast_kernels
from radixserve.layers.kquant_paths import KQUANT_INT8_ENV
from radixserve.layers.moe import moe_call_args
from radixserve.models.loader import load_model
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from tests.helpers.family_check import require_hf_arch
from tests.helpers.model_driver import ManualDriver
from tests.helpers.tiny_gguf import write_block_moe_gguf
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model


@pytest.fixture(params=["1", "0"], ids=["q8k-activations", "int16-activations"])
def moe_file(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    if build.load_extension() is None:
        pytest.skip("C++ kernels unavailable")
    require_hf_arch("qwen3_moe")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    # Pinned: otherwise each use_fast_kernels times both activation formats and may pick
    # another for the second run.
    monkeypatch.setenv(KQUANT_INT8_ENV, request.param)
    cfg = tiny_hf_config(
        "qwen3_moe",
        vocab_size=59,
        hidden_size=256,
        moe_intermediate_size=256,
        head_dim=64,
        norm_topk_prob=True,
    )
    types = {"ffn_gate_exps": gt.Q4_K, "ffn_up_exps": gt.Q8_0, "ffn_down_exps": gt.Q6_K}
    return write_block_moe_gguf(
        tmp_path / "moe.gguf", tiny_hf_model(cfg), "qwen3moe", types, gt.Q4_K
    )


def _steps(model: torch.nn.Module, config: object, fused: bool) -> list[torch.Tensor]:
    driver = ManualDriver(model, config)
    driver.backend = CpuPagedAttnBackend()
    use_fast_kernels(model, True)
    layers = model.model.layers
    if not fused:
        for layer in layers:
            layer.fused_args = None
    try:
        return [
            driver.forward([(0, [5, 6, 7, 8, 9, 10, 11]), (1, [3, 4])], all_logits=True),
            driver.forward([(1, [12, 13, 14]), (0, [15])], all_logits=True),
            driver.forward([(0, [16]), (1, [17])], decode=True),  # two rows: grouped experts
            driver.forward([(0, [18])], decode=True),  # one row: the one-token kernel
            driver.forward([(0, [19])], decode=True),
        ]
    finally:
        use_fast_kernels(model, False)


def test_moe_chain_equals_module_by_module(moe_file: Path) -> None:
    loaded = load_model(str(moe_file), dtype="float32", gguf_blocks=True)
    model = loaded.model
    layers = model.model.layers
    assert all(moe_call_args(layer.mlp) is not None for layer in layers)
    chain_calls: list[int] = []
    real_chain = ops.run_layer_chain
    with torch.inference_mode():
        want = _steps(model, loaded.config, fused=False)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ops, "run_layer_chain", lambda *a: chain_calls.append(1) or real_chain(*a))
            got = _steps(model, loaded.config, fused=True)
    assert len(chain_calls) == len(got)  # every step in one C++ call
    # The two one-row decode steps ran every layer in the single-row regions (experts
    # included), not llama_layer's kernel by kernel.
    assert model.model._layer_chains.current.single_row_runs() == 2
    assert all(layer.fused_args is None for layer in layers)  # switched off again
    for w, g in zip(want, got, strict=True):
        assert torch.equal(g, w)


def test_moe_layers_the_chain_cannot_run_stay_module_by_module(moe_file: Path) -> None:
    """Experts split over ranks, a sigmoid router or a shared expert: no C++ MoE call."""
    from radixserve.layers.moe import Scoring

    loaded = load_model(str(moe_file), dtype="float32", gguf_blocks=True)
    block = loaded.model.model.layers[0].mlp
    experts = block.experts
    spec = experts.router
    experts.router = spec._replace(scoring=Scoring.SIGMOID)
    assert moe_call_args(block) is None
    experts.router = spec
    experts.tp_size = 2
    assert moe_call_args(block) is None
    experts.tp_size = 1
    block.shared_expert = torch.nn.Identity()
    assert moe_call_args(block) is None


def test_batch_one_decode_reads_only_the_chosen_experts(moe_file: Path) -> None:
    """The single-row chain's decode step touches no expert but the router's choices: with
    every other expert's blocks overwritten by NaN scales, its logits are unchanged."""
    from radixserve.layers.moe import fused_moe

    loaded = load_model(str(moe_file), dtype="float32", gguf_blocks=True)
    model = loaded.model
    prompt, token = [5, 6, 7, 8, 9, 10, 11], 12
    chosen: list[set[int]] = []
    real_route = fused_moe.route

    def recording(*args: object, **kwargs: object) -> object:
        routing = real_route(*args, **kwargs)
        chosen.append(set(routing.experts.reshape(-1).tolist()))
        return routing

    def prefilled() -> ManualDriver:
        driver = ManualDriver(model, loaded.config)
        driver.backend = CpuPagedAttnBackend()
        driver.forward([(0, prompt)])
        return driver

    use_fast_kernels(model, True)
    try:
        with torch.inference_mode():
            # Both requests' prompts first: the prefill reads most experts.
            module_driver, chain_driver = prefilled(), prefilled()
            args = [layer.fused_args for layer in model.model.layers]
            for layer in model.model.layers:
                layer.fused_args = None
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(fused_moe, "route", recording)
                want = module_driver.forward([(0, [token])], decode=True)
            layers = model.model.layers
            assert len(chosen) == len(layers)
            for layer, picked, fused_args in zip(layers, chosen, args, strict=True):
                layer.fused_args = fused_args
                method = layer.mlp.experts.quant_method
                for part in (*method.gate_up_parts, method.down_part):
                    for e in range(part.blocks.shape[0]):
                        if e not in picked:
                            part.blocks[e].fill_(0xFF)  # fp16 scales of all ones: NaN
            runs = model.model._layer_chains.current.single_row_runs()
            got = chain_driver.forward([(0, [token])], decode=True)
    finally:
        use_fast_kernels(model, False)
    assert model.model._layer_chains.current.single_row_runs() == runs + 1
    assert torch.isfinite(got).all() and torch.equal(got, want)
