"""--is-embedding: the last token's final hidden state, L2-normalised, as transformers computes
it on the same weights (real default model, float32)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine

TEXTS = ["The cat sat on the mat.", "Quantum computers use qubits.", "I love pizza"]


@pytest.fixture(scope="module")
def embedder(default_gguf: Path) -> Iterator[Engine]:
    with Engine(
        model_path=str(default_gguf),
        dtype="float32",
        quantization="unquant",  # the exact float path (a .gguf runs quantized by default)
        is_embedding=True,
        max_total_tokens=4096,
    ) as engine:
        yield engine


@torch.inference_mode()
def hf_embedding(hf_model: Any, ids: list[int]) -> torch.Tensor:
    hidden = hf_model.model(torch.tensor([ids])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden.float(), dim=-1)


def test_embeddings_match_transformers(embedder: Engine, hf_default_model: Any) -> None:
    results = embedder.encode(TEXTS)
    assert len(results) == len(TEXTS)
    for text, result in zip(TEXTS, results, strict=True):
        ids = embedder.tokenizer.encode(text)
        ours = torch.tensor(result["embedding"])
        assert result["meta_info"]["prompt_tokens"] == len(ids)
        assert abs(float(ours.norm()) - 1.0) < 1e-4
        assert torch.allclose(ours, hf_embedding(hf_default_model, ids), atol=1e-4)
    # Batched or alone, with or without a cached prefix: the same vector.
    alone = embedder.encode(TEXTS[1])["embedding"]
    assert torch.allclose(torch.tensor(alone), torch.tensor(results[1]["embedding"]), atol=1e-5)


def test_embedding_server_refuses_generation(embedder: Engine) -> None:
    with pytest.raises(ValueError, match="embedding model"):
        embedder.generate("Hello", {"max_new_tokens": 4})
    info = embedder.get_server_info()
    assert info["num_running_reqs"] == 0
    assert info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]
