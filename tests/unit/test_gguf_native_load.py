"""--quantization gguf loads a GGUF's blocks straight from the file (no float conversion) and
runs every block type of real files: greedy output equals transformers' on the same weights."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixserve import Engine
from radixserve.kernels import gguf_types as gt
from radixserve.kernels.build import DISABLE_ENV, load_extension
from radixserve.layers.kquant_paths import KQUANT_INT8_ENV
from radixserve.layers.quantization import MIXED_GGUF_TYPES
from radixserve.models.loader import load_model
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from tests.helpers.hf_reference import hf_greedy_ids
from tests.helpers.tiny_gguf import write_block_gguf
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

# A Q4_K_M-like mix (Q4_K with Q6_K v/down/embedding) plus the other native types, so one small
# model covers them all; K-quants need K to be a multiple of 256.
TYPES = {
    "attn_v": gt.Q6_K,
    "ffn_down": gt.Q5_K,
    "token_embd": gt.Q6_K,
    "output": gt.Q8_0,
    "attn_output": gt.IQ4_XS,
    "ffn_up": gt.Q3_K,
}
PROMPTS = [[1, 5, 9, 30, 12], [1, 40, 41, 42], [1, 7]]
NEW_TOKENS = 10


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    # Exact comparisons need the int16 activations (int8 ones are tested on their own below).
    monkeypatch.setenv(KQUANT_INT8_ENV, "0")


def _model_and_file(tmp_path: Path, tied: bool, types: dict[str, int] = TYPES) -> tuple:
    cfg = tiny_hf_config(
        "llama",
        vocab_size=59,
        hidden_size=256,
        intermediate_size=512,
        head_dim=64,
        tie_word_embeddings=tied,
    )
    hf = tiny_hf_model(cfg)
    path = write_block_gguf(tmp_path / "blocks.gguf", hf, types, gt.Q4_K)
    return hf, path


def _hf_greedy(hf: torch.nn.Module) -> list[list[int]]:
    return hf_greedy_ids(hf, PROMPTS, NEW_TOKENS)


def _engine_greedy(path: Path, **kwargs: object) -> list[list[int]]:
    with Engine(
        model_path=str(path), runtime="thread", dtype="float32", max_total_tokens=2048, **kwargs
    ) as engine:
        outs = engine.generate(
            input_ids=PROMPTS,
            sampling_params={"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
        )
    return [o["output_ids"] for o in outs]


@pytest.mark.parametrize(
    ("tied", "backend", "cpp"),
    [
        (False, "intel_amx", True),
        (True, "intel_amx", True),
        (False, "torch_native", True),
        (False, "intel_amx", False),
    ],
    ids=["untied", "tied", "torch_native", "no_cpp_kernels"],
)
def test_greedy_equals_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tied: bool, backend: str, cpp: bool
) -> None:
    if not cpp:
        monkeypatch.setenv(DISABLE_ENV, "1")  # every type through the PyTorch tile fallback
    hf, path = _model_and_file(tmp_path, tied)
    assert _engine_greedy(path, attention_backend=backend) == _hf_greedy(hf)


def test_q2_k_layers_run_through_the_tile_fallback(tmp_path: Path) -> None:
    """A type without an integer kernel (Q2_K) still stays on its blocks."""
    hf, path = _model_and_file(tmp_path, tied=False, types={**TYPES, "ffn_gate": gt.Q2_K})
    assert _engine_greedy(path) == _hf_greedy(hf)


def test_no_float_copy_of_quantized_weights(tmp_path: Path) -> None:
    """Only norms are float; the linear layers and the embedding hold the file's blocks (a
    fused layer with mixed types part by part), and the cache holds no converted weights."""
    _, path = _model_and_file(tmp_path, tied=False)
    loaded = load_model(str(path), dtype="float32", gguf_blocks=True)
    model = loaded.model
    float_numel = sum(p.numel() for p in model.parameters())
    cfg = loaded.config
    norms = (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size
    assert float_numel == norms
    qkv = model.model.layers[0].self_attn.qkv_proj.quant_method.gguf_weight()
    assert qkv.qtype == MIXED_GGUF_TYPES
    assert [p.qtype for p in qkv.parts] == [gt.Q4_K, gt.Q4_K, gt.Q6_K]
    assert model.model.embed_tokens.quant_method.gguf_weight().qtype == gt.Q6_K
    assert model.lm_head.quant_method.gguf_weight().qtype == gt.Q8_0
    assert model.model.layers[0].self_attn.o_proj.quant_method.gguf_weight().qtype == gt.IQ4_XS
    assert not list(loaded.model_dir.glob("*.safetensors"))
    assert (loaded.model_dir / "config.json").is_file()
    assert (loaded.model_dir / "tokenizer.json").is_file()


def test_tensor_table_is_cached_between_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first load keeps the file's tensor table beside the cached config folder; the next load
    reads it from there (gguf-py's reader, ~2 s on a real vocabulary, is not called) and gets
    the same blocks. A stale table (another file size) is not used."""
    import gguf

    from radixserve.utils import gguf_cache

    _, path = _model_and_file(tmp_path, tied=False)
    first = load_model(str(path), dtype="float32", gguf_blocks=True)
    table = gguf_cache.table_cache_path(path)
    assert table.is_file() and table.parent == first.model_dir.parent

    def no_reader(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tensor table was parsed again")

    monkeypatch.setattr(gguf, "GGUFReader", no_reader)
    second = load_model(str(path), dtype="float32", gguf_blocks=True)
    states = first.model.state_dict(), second.model.state_dict()
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][name], states[1][name]) for name in states[0])
    qkv_a = first.model.model.layers[0].self_attn.qkv_proj.quant_method.gguf_weight().parts
    qkv_b = second.model.model.layers[0].self_attn.qkv_proj.quant_method.gguf_weight().parts
    assert all(torch.equal(x.blocks, y.blocks) for x, y in zip(qkv_a, qkv_b, strict=True))
    assert gguf_cache._read_table_cache(table, tmp_path / "blocks.gguf") is not None
    other = tmp_path / "other.gguf"
    other.write_bytes(b"x")
    assert gguf_cache._read_table_cache(table, other) is None


def test_gguf_blocks_needs_a_gguf_file(tmp_path: Path) -> None:
    hf = tiny_hf_model(tiny_hf_config("llama", vocab_size=59))
    hf.save_pretrained(tmp_path / "folder")
    with pytest.raises(ValueError, match="needs a GGUF model"):
        load_model(str(tmp_path / "folder"), gguf_blocks=True)


def test_int8_activations_keep_the_top_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With K-quants on int8 (Q8_K) activations (forced here; auto picks them where they measure
    faster) the first token of each prompt is still transformers' greedy choice, and the log
    names the choice."""
    monkeypatch.setenv(KQUANT_INT8_ENV, "1")
    hf, path = _model_and_file(tmp_path, tied=False)
    ext = load_extension()
    try:
        with caplog.at_level("INFO"):
            ours = _engine_greedy(path)
    finally:
        if ext is not None:  # process-wide switches the in-process engine set
            ext.set_kquant_int8(False)
            ext.set_q8k_panel_min_rows(2**62)
    if ext is not None:
        assert "int8 activations per 256" in caplog.text
    assert [o[0] for o in ours] == [r[0] for r in _hf_greedy(hf)]


def test_unknown_block_type_is_refused_before_loading(tmp_path: Path) -> None:
    """A tensor of a type radixserve cannot read (here IQ2_XXS) is named in a one-line error
    when the config is read, before any weight is loaded."""
    import gguf
    import numpy as np

    from radixserve.models.config import ModelConfig

    _, path = _model_and_file(tmp_path, tied=False)
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), "llama")
    for field in reader.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        if tensor.name == "blk.0.ffn_up.weight":
            iq2 = gguf.GGMLQuantizationType.IQ2_XXS
            size = gguf.GGML_QUANT_SIZES[iq2]
            rows, k = 512, 256
            data = np.zeros((rows, k // size[0] * size[1]), dtype=np.uint8)
            writer.add_tensor(tensor.name, data, raw_dtype=iq2)
        else:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"IQ2_XXS \(1 tensors, e.g. blk.0.ffn_up.weight\)"):
        ModelConfig.from_pretrained(tmp_path / "odd.gguf")
