"""Qwen2/3-MoE, Mixtral and OLMoE GGUF files written as llama.cpp writes them (experts stacked as
ffn_{gate,up,down}_exps, router ffn_gate_inp, Qwen2-MoE's ffn_*_shexp and ffn_gate_inp_shexp;
Mixtral as arch llama with an expert count and q/k rows permuted; OLMoE, whose config and
tokenizer transformers' GGUF readers do not build):
the float conversion reproduces the original model; with --quantization gguf the experts stay
on the file's blocks, per expert, and the logits stay those of the dequantized weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve import Engine
from radixserve.layers.moe import GGUFExpertsMethod
from radixserve.models import gguf
from radixserve.models.loader import load_model
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from tests.helpers.family_check import require_hf_arch
from tests.helpers.hf_reference import hf_logits
from tests.helpers.model_driver import ManualDriver
from tests.helpers.tiny_gguf import write_tiny_gguf
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

PROMPT = [5, 17, 42, 3, 58, 7, 30, 11, 50, 31]
VOCAB = 59
ARCHS = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama", "olmoe": "olmoe"}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def _logits(path: Path, **load_args: object) -> torch.Tensor:
    loaded = load_model(str(path), dtype="float32", **load_args)
    return ManualDriver(loaded.model, loaded.config).forward([(0, PROMPT)], all_logits=True)


def _model(arch: str) -> torch.nn.Module:
    require_hf_arch(arch)
    # Renormalized top-k, as llama.cpp runs every qwen3moe file (Qwen2-MoE: not renormalized).
    return tiny_hf_model(tiny_hf_config(arch, vocab_size=VOCAB, norm_topk_prob=arch == "qwen3_moe"))


def test_expert_tensor_names_map_to_hf() -> None:
    assert gguf.hf_tensor_name("blk.2.ffn_gate_exps.weight", "qwen3moe") == (
        "model.layers.2.mlp.experts.gate_proj.weight"
    )
    assert gguf.hf_tensor_name("blk.0.ffn_gate_inp.weight", "qwen3moe") == (
        "model.layers.0.mlp.gate.weight"
    )
    assert gguf.hf_tensor_name("blk.1.ffn_gate_inp_shexp.weight", "qwen2moe") == (
        "model.layers.1.mlp.shared_expert_gate.weight"
    )
    assert gguf.gguf_architecture("qwen3_moe") == "qwen3moe"


@pytest.mark.parametrize("blocks", [False, True], ids=["converted", "read_from_the_file"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_float_gguf_reproduces_the_original_model(tmp_path: Path, arch: str, blocks: bool) -> None:
    """F32 experts: converted to safetensors, or (--quantization gguf) read straight from the
    file as float stacks."""
    hf = _model(arch)
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", hf, ARCHS[arch], quantize=False)
    ours = _logits(path, gguf_blocks=blocks)
    assert float((ours - hf_logits(hf, PROMPT)).abs().max()) < 1e-4


@pytest.mark.parametrize("arch", list(ARCHS))
def test_experts_run_on_the_files_blocks(tmp_path: Path, arch: str) -> None:
    hf = _model(arch)
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", hf, ARCHS[arch], quantize=True)
    loaded = load_model(str(path), dtype="float32", gguf_blocks=True)
    for layer in loaded.model.model.layers:
        experts = layer.mlp.experts
        assert isinstance(experts.quant_method, GGUFExpertsMethod)
        assert experts.w13_weight.numel() == 0  # no float copy of the experts
        assert experts.quant_method.block_bytes() > 0
        if arch == "qwen2_moe":  # the shared expert's projections are on blocks as well
            shared = layer.mlp.shared_expert
            assert shared.gate_up_proj.quant_method.gguf_weight() is not None
            assert shared.down_proj.quant_method.gguf_weight() is not None
    on_blocks = _logits(path, gguf_blocks=True)
    # The converted (dequantized) weights are the reference; the integer kernels quantize
    # activations too, so close rather than equal. Q8_0 keeps the original model's near too.
    converted = _logits(path)
    assert float((on_blocks - converted).abs().max()) < 0.05
    assert float((converted - hf_logits(hf, PROMPT)).abs().max()) < 0.1
    assert torch.equal(on_blocks.argmax(-1), converted.argmax(-1))


@pytest.mark.parametrize("quantize", [False, True], ids=["f32", "q8_0"])
def test_mixtral_file_with_one_tensor_per_expert(tmp_path: Path, quantize: bool) -> None:
    """Mixtral files converted before llama.cpp stacked experts (blk.N.ffn_gate.E.weight):
    the experts are gathered into the stacks, on blocks or in float."""
    hf = _model("mixtral")
    path = write_tiny_gguf(tmp_path / "old.gguf", hf, "llama", quantize, stacked_experts=False)
    assert gguf.hf_tensor_name("blk.1.ffn_down.7.weight") == (
        "model.layers.1.mlp.experts.7.down_proj.weight"
    )
    loaded = load_model(str(path), dtype="float32", gguf_blocks=True)
    experts = loaded.model.model.layers[0].mlp.experts
    assert isinstance(experts.quant_method, GGUFExpertsMethod) == quantize
    on_blocks, converted = _logits(path, gguf_blocks=True), _logits(path)
    reference = hf_logits(hf, PROMPT)
    assert float((converted - reference).abs().max()) < (0.1 if quantize else 1e-4)
    assert float((on_blocks - converted).abs().max()) < (0.05 if quantize else 1e-4)


def test_engine_on_expert_blocks_equals_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Qwen3-MoE file whose experts are K-quant blocks (gate Q4_K and up Q8_0: gate|up of
    mixed types; down Q6_K), served on those blocks by the engine: greedy tokens equal
    transformers' on the blocks' dequantized weights (int16 activations, exact enough)."""
    from radixserve.kernels import gguf_types as gt
    from radixserve.layers.kquant_paths import KQUANT_INT8_ENV
    from tests.helpers.hf_reference import hf_greedy_ids
    from tests.helpers.tiny_gguf import write_block_moe_gguf

    require_hf_arch("qwen3_moe")
    monkeypatch.setenv(KQUANT_INT8_ENV, "0")
    # K-quants need K to be a multiple of 256: hidden and the experts' size are 256.
    cfg = tiny_hf_config(
        "qwen3_moe",
        vocab_size=VOCAB,
        hidden_size=256,
        moe_intermediate_size=256,
        head_dim=64,
        norm_topk_prob=True,
    )
    hf = tiny_hf_model(cfg)
    types = {"ffn_gate_exps": gt.Q4_K, "ffn_up_exps": gt.Q8_0, "ffn_down_exps": gt.Q6_K}
    path = write_block_moe_gguf(tmp_path / "moe.gguf", hf, "qwen3moe", types, gt.Q8_0)
    prompts = [[1, 5, 9, 30, 12], [1, 40, 41, 42], [1, 7]]
    expected = hf_greedy_ids(hf, prompts, 10)
    for backend in ("intel_amx", "torch_native"):
        with Engine(
            model_path=str(path),
            runtime="thread",
            dtype="float32",
            max_total_tokens=2048,
            attention_backend=backend,
            quantization="gguf",  # the experts stay on the file's blocks
        ) as engine:
            outs = engine.generate(
                input_ids=prompts,
                sampling_params={"max_new_tokens": 10, "temperature": 0, "ignore_eos": True},
            )
        assert [o["output_ids"] for o in outs] == expected, backend
