"""gpt-oss GGUF files written as llama.cpp's converter writes them (arch "gpt-oss": experts
ffn_{gate,up,down}_exps with biases, the router ffn_gate_inp with a bias, attn_sinks, YaRN and the
sliding window in the metadata), with F32 or MXFP4 experts: the float conversion and
--quantization gguf (MXFP4 experts kept as the file's blocks) both reproduce transformers on the
weights the file holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve import Engine
from radixserve.kernels import gguf_types
from radixserve.layers.moe import GGUFExpertsMethod
from radixserve.models import gguf
from radixserve.models.loader import load_model
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from tests.helpers.family_check import require_hf_arch
from tests.helpers.hf_reference import hf_greedy_ids, hf_logits
from tests.helpers.model_driver import ManualDriver
from tests.helpers.tiny_gpt_oss_gguf import round_experts_through_mxfp4, write_gpt_oss_gguf
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

require_hf_arch("gpt_oss")

VOCAB = 59
PROMPT = [5, 17, 42, 3, 58, 7, 30, 11, 50, 31, 8, 9, 10, 12]  # past the 8-token window


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def _model(mxfp4: bool) -> torch.nn.Module:
    # The default SwiGLU limit (7.0): GGUF has no key for gpt-oss's, llama.cpp fixes it.
    hf = tiny_hf_model(tiny_hf_config("gpt_oss", vocab_size=VOCAB))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("sinks") or name.endswith("_bias"):
                param.copy_(torch.randn(param.shape, generator=gen))
    if mxfp4:
        round_experts_through_mxfp4(hf)
    return hf


def _logits(path: Path, **load_args: object) -> torch.Tensor:
    loaded = load_model(str(path), dtype="float32", **load_args)
    return ManualDriver(loaded.model, loaded.config).forward([(0, PROMPT)], all_logits=True)


def test_tensor_names_map_to_hf() -> None:
    assert gguf.hf_tensor_name("blk.1.attn_sinks.weight", "gpt-oss") == (
        "model.layers.1.self_attn.sinks"
    )
    assert (
        gguf.hf_tensor_name("blk.0.ffn_gate_inp.bias", "gpt-oss")
        == "model.layers.0.mlp.router.bias"
    )
    assert gguf.hf_tensor_name("blk.0.post_attention_norm.weight", "gpt-oss") == (
        "model.layers.0.post_attention_layernorm.weight"
    )
    assert gguf.hf_tensor_name("blk.2.ffn_up_exps.bias", "gpt-oss") == (
        "model.layers.2.mlp.experts.up_proj.bias"
    )
    assert gguf.gguf_architecture("gpt_oss") == "gpt-oss"


@pytest.mark.parametrize("blocks", [False, True], ids=["converted", "read_from_the_file"])
@pytest.mark.parametrize("mxfp4", [False, True], ids=["f32", "mxfp4"])
def test_gguf_reproduces_the_model(tmp_path: Path, mxfp4: bool, blocks: bool) -> None:
    hf = _model(mxfp4)
    path = write_gpt_oss_gguf(tmp_path / "gpt-oss.gguf", hf, mxfp4)
    loaded = load_model(str(path), dtype="float32", gguf_blocks=blocks)
    config = loaded.model.config.hf_config
    assert config.layer_types == ["sliding_attention", "full_attention"]
    assert config.rope_parameters["rope_type"] == "yarn"
    experts = loaded.model.model.layers[0].mlp.experts
    on_blocks = isinstance(experts.quant_method, GGUFExpertsMethod)
    assert on_blocks == (blocks and mxfp4)
    if on_blocks:
        assert experts.quant_method.down_part.qtype == gguf_types.MXFP4
        assert experts.w13_weight.numel() == 0  # no float copy of the experts
    ours = _logits(path, gguf_blocks=blocks)
    assert float((ours - hf_logits(hf, PROMPT)).abs().max()) < 1e-4


def test_engine_on_mxfp4_blocks_equals_transformers(tmp_path: Path) -> None:
    hf = _model(mxfp4=True)
    path = write_gpt_oss_gguf(tmp_path / "gpt-oss.gguf", hf, mxfp4=True)
    prompts = [[1, 5, 9, 30, 12], PROMPT]
    expected = hf_greedy_ids(hf, prompts, 10)
    with Engine(
        model_path=str(path),
        runtime="thread",
        dtype="float32",
        max_total_tokens=2048,
        attention_backend="intel_amx",
        quantization="gguf",
    ) as engine:
        outs = engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": 10, "temperature": 0, "ignore_eos": True},
        )
    assert [o["output_ids"] for o in outs] == expected
