"""GGUF conversion on tiny GGUF files written like llama.cpp writes them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from radixserve.utils.cache_dir import CACHE_DIR_ENV

# See test_loader.py: the repo root is needed on sys.path for tests.helpers.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixserve.models import gguf
from radixserve.models.loader import load_model
from radixserve.models.tokenizer import get_tokenizer
from tests.helpers.hf_reference import hf_logits
from tests.helpers.model_driver import ManualDriver
from tests.helpers.tiny_gguf import CHAT_TEMPLATE, llama_cpp_permute, write_tiny_gguf
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

PROMPT = [5, 17, 42, 3, 58, 7, 30, 11, 50, 31]
VOCAB = 59


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def _ours(path: Path) -> torch.Tensor:
    loaded = load_model(str(path), dtype="float32")
    return ManualDriver(loaded.model, loaded.config).forward([(0, PROMPT)], all_logits=True)


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    rng = np.random.default_rng(0)
    for heads, shape in [(4, (32, 8)), (2, (16, 3)), (3, (12,))]:
        weight = rng.standard_normal(shape).astype(np.float32)
        permuted = llama_cpp_permute(weight, heads)
        assert not np.array_equal(permuted, weight)
        assert np.array_equal(gguf.unpermute_qk(permuted, heads), weight)


def test_tensor_names_map_to_hf() -> None:
    assert gguf.hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf.hf_tensor_name("output.weight") == "lm_head.weight"
    assert gguf.hf_tensor_name("blk.12.attn_k.bias") == "model.layers.12.self_attn.k_proj.bias"
    assert gguf.hf_tensor_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert (
        gguf.hf_tensor_name("blk.3.attn_q_norm.weight") == "model.layers.3.self_attn.q_norm.weight"
    )
    assert gguf.hf_tensor_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_gate_unknown\.weight"):
        gguf.hf_tensor_name("blk.0.ffn_gate_unknown.weight")


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_quantized_llama_gguf_matches_transformers_reading_it(tmp_path: Path, tied: bool) -> None:
    from transformers import AutoModelForCausalLM

    hf = tiny_hf_model(tiny_hf_config("llama", vocab_size=VOCAB, tie_word_embeddings=tied))
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf, "llama", quantize=True)
    reference = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32
    ).eval()
    ours = _ours(path)
    assert float((ours - hf_logits(reference, PROMPT)).abs().max()) < 1e-4
    # Q8_0 is lossy but close: the original model's logits are near as well.
    assert float((ours - hf_logits(hf, PROMPT)).abs().max()) < 0.1


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_float_gguf_reproduces_the_original_model(tmp_path: Path, arch: str) -> None:
    hf = tiny_hf_model(tiny_hf_config(arch, vocab_size=VOCAB))
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", hf, arch, quantize=False)
    assert float((_ours(path) - hf_logits(hf, PROMPT)).abs().max()) < 1e-4


def test_conversion_is_cached_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hf = tiny_hf_model(tiny_hf_config("llama", vocab_size=VOCAB))
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf)
    first = load_model(str(path), dtype="float32").model_dir
    assert first.parent == tmp_path / "cache" / "gguf"
    assert first.name.startswith(f"tiny-{path.stat().st_size}-")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in first.iterdir()
    }
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".tmp")]

    def no_conversion(*args: object) -> None:
        raise AssertionError("converted twice")

    monkeypatch.setattr(gguf, "convert_gguf", no_conversion)
    assert load_model(str(path), dtype="float32").model_dir == first


def test_cache_is_keyed_by_content_not_path_or_mtime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy of the file elsewhere (a reinstall, a clone) reuses the conversion; a different
    file of the same name does not. `radixserve cache list|clear` show and remove it."""
    import os
    import shutil

    from radixserve.cli import main

    hf = tiny_hf_model(tiny_hf_config("llama", vocab_size=VOCAB))
    for sub in ("a", "b", "c"):
        (tmp_path / sub).mkdir()
    path = write_tiny_gguf(tmp_path / "a" / "tiny.gguf", hf)
    copy = tmp_path / "b" / "tiny.gguf"
    shutil.copyfile(path, copy)
    os.utime(copy, (1, 1))
    assert gguf.cached_folder(copy) == gguf.cached_folder(path)
    other = write_tiny_gguf(tmp_path / "c" / "tiny.gguf", tiny_hf_model(hf.config, seed=1))
    assert gguf.cached_folder(other) != gguf.cached_folder(path)

    folder = gguf.ensure_converted(path)
    assert main(["cache", "list"]) == 0
    listing = capsys.readouterr().out
    assert str(gguf.cache_root().parent) in listing and folder.name in listing
    assert main(["cache", "clear", "not-there"]) == 2
    assert "not in the cache: not-there" in capsys.readouterr().err
    assert main(["cache", "clear", folder.name]) == 0
    assert not folder.exists() and "removed 1 entry" in capsys.readouterr().out
    # The other things radixserve caches are listed and cleared too.
    root = gguf.cache_root().parent
    (root / "torch_compile" / "fxgraph").mkdir(parents=True)
    (root / "torch_compile" / "fxgraph" / "graph.bin").write_bytes(b"x" * 2048)
    (root / "auto-dtype-abc-torch2.json").write_text('{"dtype": "float32", "reason": "r"}')
    gguf.ensure_converted(path)
    assert main(["cache", "list"]) == 0
    listing = capsys.readouterr().out
    assert "torch_compile" in listing and "(torch.compile graphs)" in listing
    assert "auto-dtype-abc-torch2.json" in listing and "(--dtype auto verdict)" in listing
    assert main(["cache", "clear"]) == 0
    assert "removed 3 entries" in capsys.readouterr().out
    assert not any(root.iterdir()) or [p.name for p in root.iterdir()] == ["gguf"]


def test_folder_with_one_gguf_and_tokenizer_from_it(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    hf = tiny_hf_model(tiny_hf_config("llama", vocab_size=VOCAB))
    path = write_tiny_gguf(tmp_path / "only.gguf", hf)
    assert load_model(str(tmp_path), dtype="float32").config.vocab_size == VOCAB
    ours = get_tokenizer(path)
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert ours.chat_template == CHAT_TEMPLATE
    assert ours("abc Abc ab").input_ids == reference("abc Abc ab").input_ids
    write_tiny_gguf(tmp_path / "second.gguf", hf)
    with pytest.raises(ValueError, match="several GGUF files"):
        load_model(str(tmp_path))


def test_corrupt_gguf_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(ValueError, match=r"broken\.gguf"):
        load_model(str(path))
    assert not (tmp_path / "cache" / "gguf" / gguf.cached_folder(path).name).exists()


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    import gguf as gguf_lib

    path = tmp_path / "other.gguf"
    writer = gguf_lib.GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"'gpt2'.*supported: llama, qwen2, qwen3"):
        load_model(str(path))
