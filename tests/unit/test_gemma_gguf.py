"""Gemma 2/3 GGUF files written as llama.cpp's converter writes them (tests/helpers/
tiny_gemma_gguf.py): converted to a cached folder and loaded on their blocks
(--quantization gguf), they give the model they were written from (norms stored plus one,
Gemma's tensor names, soft-capping, windows, which layers slide, Gemma 3's RoPE bases and
scaling filled from the metadata); transformers reading the same file agrees; the file's chat
template reaches the cached tokenizer, and the end of a turn stops generation."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.kernels import gguf_types as gt
from radixserve.models import gguf
from radixserve.models.gguf_config import fill_gemma_config
from radixserve.models.loader import load_model
from radixserve.models.tokenizer import get_tokenizer
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from tests.helpers.family_check import BACKENDS, require_hf_arch
from tests.helpers.hf_reference import hf_greedy_ids, hf_logits, load_hf_from_gguf
from tests.helpers.model_driver import ManualDriver
from tests.helpers.tiny_gemma_gguf import CHAT_TEMPLATE, write_gemma_gguf
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

require_hf_arch("gemma2")
require_hf_arch("gemma3")

VOCAB = 64
# Past the 8-token window.
PROMPT = [2, *range(10, 40)]
PROMPTS = [[2, 5, 9, 30], [2, *range(10, 30)]]
NEW_TOKENS = 8
SLIDING, FULL = "sliding_attention", "full_attention"
# Configs as llama.cpp derives them from a file (query_pre_attn_scalar = head_dim; Gemma 3's
# sliding base 10000, five sliding layers then a global one) and ones the file must spell out
# (gguf-py's per-layer pattern and freq_base_swa keys).
CONFIGS: dict[str, dict[str, Any]] = {
    "gemma2": {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0},
    "gemma2-pattern": {"layer_types": [FULL, SLIDING, SLIDING, FULL]},
    "gemma3": {
        "num_hidden_layers": 6,
        "rope_parameters": {
            SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
            FULL: {"rope_type": "linear", "factor": 4.0, "rope_theta": 5000.0},
        },
    },
    "gemma3-pattern": {
        "layer_types": [SLIDING, FULL, SLIDING, FULL],
        "final_logit_softcapping": 3.0,
        "rope_parameters": {
            SLIDING: {"rope_type": "default", "rope_theta": 100.0},
            FULL: {"rope_type": "default", "rope_theta": 5000.0},
        },
    },
}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def _model(name: str, **overrides: Any) -> tuple[str, torch.nn.Module]:
    arch = name.split("-")[0]
    kwargs = {"vocab_size": VOCAB, "num_hidden_layers": 4, **CONFIGS[name], **overrides}
    return arch, tiny_hf_model(tiny_hf_config(arch, **kwargs))


def _our_logits(path: Path, blocks: bool) -> torch.Tensor:
    loaded = load_model(str(path), dtype="float32", gguf_blocks=blocks)
    return ManualDriver(loaded.model, loaded.config).forward([(0, PROMPT)], all_logits=True)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_float_gguf_reproduces_the_model(tmp_path: Path, name: str) -> None:
    """F32 tensors, converted and loaded straight from the file: the written model's logits."""
    arch, hf = _model(name)
    path = write_gemma_gguf(tmp_path / f"{arch}.gguf", hf, arch)
    want = hf_logits(hf, PROMPT)
    for blocks in (False, True):
        assert torch.allclose(_our_logits(path, blocks), want, atol=1e-4), blocks


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["gemma2", "gemma3-pattern"])
def test_quantized_gguf_greedy_equals_transformers(tmp_path: Path, name: str, backend: str) -> None:
    """Q8_0 and Q4_0 blocks (tied embedding included) run on their blocks by default; the
    float model holds the blocks' dequantized weights."""
    arch, hf = _model(name)
    types = {"attn_v": gt.Q4_0, "ffn_down": gt.Q4_0}
    path = write_gemma_gguf(tmp_path / f"{arch}.gguf", hf, arch, types, gt.Q8_0)
    sampling = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    with Engine(
        model_path=str(path), runtime="thread", dtype="float32", attention_backend=backend
    ) as engine:
        outs = engine.generate(input_ids=PROMPTS, sampling_params=sampling)
    assert [o["output_ids"] for o in outs] == hf_greedy_ids(hf, PROMPTS, NEW_TOKENS)


def test_blocks_stay_blocks_and_norms_lose_the_added_one(tmp_path: Path) -> None:
    arch, hf = _model("gemma3-pattern")
    path = write_gemma_gguf(tmp_path / "g.gguf", hf, arch, {}, gt.Q8_0)
    model = load_model(str(path), dtype="float32", gguf_blocks=True).model
    layer = model.model.layers[0]
    assert layer.self_attn.qkv_proj.quant_method.gguf_weight().qtype == gt.Q8_0
    assert model.model.embed_tokens.quant_method.gguf_weight().qtype == gt.Q8_0
    hf_layer = hf.model.layers[0]
    for ours, theirs in [
        (layer.pre_feedforward_layernorm, hf_layer.pre_feedforward_layernorm),
        (layer.post_feedforward_layernorm, hf_layer.post_feedforward_layernorm),
        (layer.self_attn.k_norm, hf_layer.self_attn.k_norm),
        (model.model.norm, hf.model.norm),
    ]:
        assert torch.allclose(ours.weight, theirs.weight, atol=1e-6)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_transformers_reading_the_file_agrees(tmp_path: Path, arch: str) -> None:
    """transformers' own GGUF reader on a Q8_0 file: head_dim 256 (its default
    query_pre_attn_scalar), default soft-caps and layer pattern, no RoPE scaling: the fields
    it does not read then hold what llama.cpp derives."""
    shape = {"head_dim": 256, "num_attention_heads": 2, "num_key_value_heads": 1}
    if arch == "gemma2":
        defaults = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
    else:
        defaults = {"num_hidden_layers": 6, "rope_parameters": None}
    _, hf = _model(arch, query_pre_attn_scalar=256, **shape, **defaults)
    path = write_gemma_gguf(tmp_path / f"{arch}.gguf", hf, arch, {}, gt.Q8_0)
    want = hf_logits(load_hf_from_gguf(path), PROMPT)
    assert torch.allclose(_our_logits(path, blocks=False), want, atol=1e-4)
    assert torch.allclose(want, hf_logits(hf, PROMPT), atol=1e-4)


@pytest.mark.parametrize("blocks", [False, True], ids=["converted", "metadata-only"])
def test_chat_template_reaches_the_cached_tokenizer(tmp_path: Path, blocks: bool) -> None:
    from transformers import AutoTokenizer

    arch, hf = _model("gemma3-pattern")
    path = write_gemma_gguf(tmp_path / "chat.gguf", hf, arch)
    folder = gguf.ensure_metadata(path) if blocks else gguf.ensure_converted(path)
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    template = saved.get("chat_template") or (folder / "chat_template.jinja").read_text()
    assert template == CHAT_TEMPLATE
    ours = get_tokenizer(folder)
    messages = [{"role": "user", "content": "ab c"}]
    text = ours.apply_chat_template(messages, tokenize=False)
    # (jinja drops the template's final newline)
    assert text == "<bos><start_of_turn>user\nab c<end_of_turn>\n<start_of_turn>model"
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert ours("abc ab a").input_ids == reference("abc ab a").input_ids


@pytest.mark.parametrize(("eot", "stops"), [(None, (1, 5)), (4, (1, 4))])
def test_end_of_turn_stops_generation(tmp_path: Path, eot: int | None, stops: tuple) -> None:
    """<eos> (1) and the end of a turn: tokenizer.ggml.eot_token_id, else <end_of_turn> (5)
    found by name, as llama.cpp finds it; in the converted and the metadata-only folders."""
    from radixserve.models.config import ModelConfig

    arch, hf = _model("gemma3-pattern")
    path = write_gemma_gguf(tmp_path / "eot.gguf", hf, arch, eot_token_id=eot)
    assert ModelConfig.from_pretrained(gguf.ensure_metadata(path)).eos_token_ids == stops
    assert ModelConfig.from_pretrained(gguf.ensure_converted(path)).eos_token_ids == stops


def test_gemma_tensor_names() -> None:
    assert gguf.hf_tensor_name("blk.2.ffn_norm.weight", "gemma2") == (
        "model.layers.2.pre_feedforward_layernorm.weight"
    )
    assert gguf.hf_tensor_name("blk.2.ffn_norm.weight", "llama") == (
        "model.layers.2.post_attention_layernorm.weight"
    )
    assert gguf.hf_tensor_name("blk.0.post_attention_norm.weight", "gemma3") == (
        "model.layers.0.post_attention_layernorm.weight"
    )
    assert gguf.hf_tensor_name("blk.0.post_ffw_norm.weight", "gemma3") == (
        "model.layers.0.post_feedforward_layernorm.weight"
    )
    with pytest.raises(ValueError, match="post_ffw_norm"):
        gguf.hf_tensor_name("blk.0.post_ffw_norm.weight", "llama")
    assert gguf.gguf_architecture("gemma3_text") == "gemma3"


class _Field:
    def __init__(self, value: Any) -> None:
        self.value = value

    def contents(self) -> Any:
        return self.value


@pytest.mark.parametrize(("arch", "layers", "scalar"), [("gemma2", 46, 144), ("gemma3", 62, 168)])
def test_27b_softmax_scale_follows_llama_cpp(arch: str, layers: int, scalar: int) -> None:
    """GGUF stores no query_pre_attn_scalar: the 27B models' is hidden / heads, as llama.cpp
    takes it (their released configs say the same), others' head_dim."""
    fields = {f"{arch}.attention.sliding_window": _Field(4096)}
    reader = SimpleNamespace(fields=fields)
    for count, want in ((layers, scalar), (layers - 4, 128)):
        hidden = 4608 if arch == "gemma2" else 5376
        shape = {"num_attention_heads": 32, "head_dim": 128, "num_hidden_layers": count}
        config = tiny_hf_config(arch, hidden_size=hidden, **shape)
        fill_gemma_config(reader, arch, config)
        assert config.query_pre_attn_scalar == want
