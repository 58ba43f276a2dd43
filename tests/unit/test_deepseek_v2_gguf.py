"""DeepSeek-V2 GGUF files written as llama.cpp's converter writes them (arch "deepseek2"), in
its older layout (attn_kv_b whole) and its newer one (attn_k_b / attn_v_b, MLA sizes in
key/value_length_mla): the float conversion and --quantization gguf reproduce transformers on
the weights the file holds, for a V2-shaped config (q_lora_rank, grouped routing, YaRN) and a
V2-Lite-shaped one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.layers.quantization import GGUFLinearMethod
from radixserve.models import gguf
from radixserve.models.deepseek_v2_checkpoint import join_kv_b
from radixserve.models.loader import load_model
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from tests.helpers.family_check import require_hf_arch
from tests.helpers.hf_reference import hf_greedy_ids, hf_logits
from tests.helpers.model_driver import ManualDriver
from tests.helpers.tiny_deepseek_gguf import write_deepseek2_gguf
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

require_hf_arch("deepseek_v2")

VOCAB = 59
PROMPT = [5, 17, 42, 3, 58, 7, 30, 11, 50, 31, 8, 9, 10, 12]
# YaRN as the published V2 configs have it (mscale equal to mscale_all_dim: GGUF stores one).
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 0.8,
    "mscale_all_dim": 0.8,
}
V2: dict[str, Any] = {"num_hidden_layers": 3, "rope_parameters": YARN}
V2_LITE: dict[str, Any] = {
    "num_hidden_layers": 3,
    "q_lora_rank": None,
    "topk_method": "greedy",
    "n_group": None,
    "topk_group": None,
    "routed_scaling_factor": 1.0,
}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def _model(shape: str, **extra: Any) -> torch.nn.Module:
    overrides = {**(V2 if shape == "v2" else V2_LITE), **extra}
    return tiny_hf_model(tiny_hf_config("deepseek_v2", vocab_size=VOCAB, **overrides))


def _logits(path: Path, **load_args: object) -> torch.Tensor:
    loaded = load_model(str(path), dtype="float32", **load_args)
    return ManualDriver(loaded.model, loaded.config).forward([(0, PROMPT)], all_logits=True)


def test_tensor_names_map_to_hf() -> None:
    assert gguf.hf_tensor_name("blk.1.attn_kv_a_mqa.weight", "deepseek2") == (
        "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    )
    assert gguf.hf_tensor_name("blk.0.attn_q_a_norm.weight", "deepseek2") == (
        "model.layers.0.self_attn.q_a_layernorm.weight"
    )
    assert gguf.hf_tensor_name("blk.2.attn_k_b.weight", "deepseek2") == (
        "model.layers.2.self_attn.k_b_proj.weight"
    )
    assert gguf.hf_tensor_name("blk.2.ffn_up_shexp.weight", "deepseek2") == (
        "model.layers.2.mlp.shared_expert.up_proj.weight"
    )
    assert gguf.gguf_architecture("deepseek_v2") == "deepseek2"


def test_join_kv_b_inverts_the_split() -> None:
    heads, nope, v, latent = 3, 4, 5, 6
    kv_b = torch.randn(heads * (nope + v), latent)
    per_head = kv_b.view(heads, nope + v, latent)
    k_b = per_head[:, :nope].transpose(1, 2)  # as convert_hf_to_gguf.py stores attn_k_b
    assert torch.equal(join_kv_b(k_b, per_head[:, nope:]), kv_b)


@pytest.mark.parametrize("blocks", [False, True], ids=["converted", "read_from_the_file"])
@pytest.mark.parametrize("split_kv_b", [False, True], ids=["kv_b", "k_b_v_b"])
@pytest.mark.parametrize("shape", ["v2", "v2_lite"])
def test_gguf_reproduces_the_model(
    tmp_path: Path, shape: str, split_kv_b: bool, blocks: bool
) -> None:
    hf = _model(shape)
    path = write_deepseek2_gguf(tmp_path / "ds.gguf", hf, split_kv_b)
    loaded = load_model(str(path), dtype="float32", gguf_blocks=blocks)
    config = loaded.model.config.hf_config
    assert config.first_k_dense_replace == 1
    assert config.topk_method == hf.config.topk_method
    assert config.qk_nope_head_dim == hf.config.qk_nope_head_dim
    assert config.v_head_dim == hf.config.v_head_dim
    ours = _logits(path, gguf_blocks=blocks)
    assert float((ours - hf_logits(hf, PROMPT)).abs().max()) < 1e-4


def test_q8_0_blocks_equal_the_conversion(tmp_path: Path) -> None:
    """A Q8_0 file (every projection's input a whole number of blocks): MLA's linear layers
    stay on the file's blocks (kv_b_proj, folded into attention, is dequantized) and give the
    conversion's logits (the same weights)."""
    hf = _model("v2", q_lora_rank=64, v_head_dim=16)
    path = write_deepseek2_gguf(tmp_path / "ds.gguf", hf, True, quantize=True)
    attn = load_model(str(path), dtype="float32", gguf_blocks=True).model.model.layers[1].self_attn
    for name in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"):
        assert isinstance(getattr(attn, name).quant_method, GGUFLinearMethod), name
    converted = _logits(path)
    on_blocks = _logits(path, gguf_blocks=True)
    assert float((converted - on_blocks).abs().max()) < 1e-3


def test_sigmoid_router_refused(tmp_path: Path) -> None:
    path = write_deepseek2_gguf(tmp_path / "v3.gguf", _model("v2"), True, sigmoid_gating=True)
    with pytest.raises(ValueError, match="DeepSeek-V3"):
        load_model(str(path), dtype="float32")


def test_engine_equals_transformers(tmp_path: Path) -> None:
    hf = _model("v2")
    path = write_deepseek2_gguf(tmp_path / "ds.gguf", hf, split_kv_b=True)
    prompts = [[1, 5, 9, 30, 12], PROMPT]
    expected = hf_greedy_ids(hf, prompts, 10)
    with Engine(
        model_path=str(path),
        runtime="thread",
        dtype="float32",
        max_total_tokens=2048,
        quantization="gguf",
    ) as engine:
        outs = engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": 10, "temperature": 0, "ignore_eos": True},
        )
    assert [o["output_ids"] for o in outs] == expected
