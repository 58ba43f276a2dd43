"""The GGUF blocks read on a thread while the scheduler imports torch (utils/gguf_prefetch.py)
give the loader exactly the blocks it reads itself, joined and unpermuted the same way; a
prefetch that failed or was never started leaves the loader reading the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.kernels import gguf_types as gt
from radixserve.models.loader import load_model
from radixserve.server_args import ServerArgs
from radixserve.utils import gguf_prefetch
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from tests.helpers.tiny_gguf import write_block_gguf
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

# Joined q|k|v of one type in some layers, mixed in others (v as Q6_K), an untied LM head.
TYPES = {"attn_v": gt.Q6_K, "token_embd": gt.Q6_K, "output": gt.Q8_0, "ffn_down": gt.Q5_K}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


@pytest.fixture
def gguf_file(tmp_path: Path) -> Path:
    cfg = tiny_hf_config(
        "llama", vocab_size=59, hidden_size=256, intermediate_size=512, head_dim=64
    )
    return write_block_gguf(tmp_path / "blocks.gguf", tiny_hf_model(cfg), TYPES, gt.Q4_K)


def _blocks(path: Path) -> list[tuple[str, torch.Tensor]]:
    model = load_model(str(path), dtype="float32", gguf_blocks=True).model
    found = []
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        gguf = method.gguf_weight() if method is not None else None
        for i, part in enumerate((gguf.parts or (gguf,)) if gguf is not None else ()):
            found.append((f"{name}.{i}", part.blocks))
    assert found, "the model kept no GGUF blocks"
    return found


def test_prefetched_blocks_equal_read_ones(gguf_file: Path) -> None:
    read = _blocks(gguf_file)
    prefetch = gguf_prefetch.start(gguf_file)
    assert prefetch is not None and prefetch.wait()
    fetched = _blocks(gguf_file)
    assert gguf_prefetch.take(gguf_file) is None  # handed to that load, once
    assert [n for n, _ in fetched] == [n for n, _ in read]
    for (name, a), (_, b) in zip(read, fetched, strict=True):
        assert torch.equal(a, b), name
    # The loaded blocks live in the prefetch's memory, not in copies.
    base = prefetch.buffer
    assert base is not None
    addresses = {b.untyped_storage().data_ptr() for _, b in fetched}
    start = torch.frombuffer(base, dtype=torch.uint8, count=1).data_ptr()
    assert any(start <= a < start + len(base) for a in addresses)


def test_a_failed_prefetch_leaves_the_loader_reading(
    gguf_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_read(self: Any) -> None:
        self._error = OSError("no such luck")

    read = _blocks(gguf_file)
    monkeypatch.setattr(gguf_prefetch.Prefetch, "_read", broken_read)
    prefetch = gguf_prefetch.start(gguf_file)
    assert prefetch is not None and not prefetch.wait()
    for (name, a), (_, b) in zip(read, _blocks(gguf_file), strict=True):
        assert torch.equal(a, b), name


def test_only_a_whole_load_of_a_gguf_file_is_prefetched(gguf_file: Path, tmp_path: Path) -> None:
    assert gguf_prefetch.start(tmp_path / "absent.gguf") is None
    assert gguf_prefetch.start(tmp_path) is None
    whole = ServerArgs.from_kwargs(model_path=str(gguf_file), device="cpu")
    assert whole.quantization == "gguf"
    prefetch = gguf_prefetch.start_for(whole)
    assert prefetch is not None
    assert gguf_prefetch.take(gguf_file) is prefetch
    float_weights = ServerArgs.from_kwargs(
        model_path=str(gguf_file), device="cpu", quantization="unquant"
    )
    assert gguf_prefetch.start_for(float_weights) is None
