"""The real default model: GGUF conversion and caching, and outputs equal to transformers'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.models import gguf
from radixserve.models.loader import LoadedModel
from radixserve.models.tokenizer import get_tokenizer
from tests.helpers.default_model import TimedLoad, timed_load
from tests.helpers.hf_reference import argmax_agrees, hf_greedy, hf_logits
from tests.helpers.model_driver import ManualDriver

PLAIN_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]
CHAT_QUESTIONS = ["What is 2+2?", "Name three primary colors."]
LOGIT_TOL = 1e-3


@pytest.fixture(scope="module")
def prompts(default_tokenizer: Any) -> list[list[int]]:
    chats = [
        default_tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in CHAT_QUESTIONS
    ]
    return [default_tokenizer(text).input_ids for text in PLAIN_PROMPTS + chats]


def test_gguf_converts_to_a_cached_hf_folder(
    fresh_default_load: TimedLoad, default_gguf: Path
) -> None:
    from gguf import GGUFReader

    loaded = fresh_default_load.loaded
    cfg = loaded.config
    assert cfg.architectures == ("LlamaForCausalLM",)
    assert (cfg.num_hidden_layers, cfg.hidden_size) == (30, 576)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.tie_word_embeddings and cfg.vocab_size == 49152
    assert loaded.model_dir.parent == fresh_default_load.cache_dir / "gguf"
    files = {p.name for p in loaded.model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
    template = GGUFReader(default_gguf).fields["tokenizer.chat_template"].contents()
    assert get_tokenizer(loaded.model_dir).chat_template == template


def test_second_load_is_cached_and_faster(
    fresh_default_load: TimedLoad, default_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_conversion(*args: object) -> None:
        raise AssertionError("the cached conversion was not reused")

    monkeypatch.setattr(gguf, "convert_gguf", no_conversion)
    again = timed_load(default_gguf, fresh_default_load.cache_dir)
    assert again.loaded.model_dir == fresh_default_load.loaded.model_dir
    assert again.seconds < fresh_default_load.seconds / 2


def test_prefill_logits_match_transformers(
    default_model: LoadedModel, hf_default_model: Any, prompts: list[list[int]]
) -> None:
    for ids in prompts:
        driver = ManualDriver(default_model.model, default_model.config)
        ours = driver.forward([(0, ids)], all_logits=True)
        ref = hf_logits(hf_default_model, ids)
        assert float((ours - ref).abs().max()) < LOGIT_TOL
        assert argmax_agrees(ours, ref)


def test_one_batched_prefill_matches_transformers(
    default_model: LoadedModel, hf_default_model: Any, prompts: list[list[int]]
) -> None:
    driver = ManualDriver(default_model.model, default_model.config)
    last = driver.forward(list(enumerate(prompts)))
    for i, ids in enumerate(prompts):
        ref = hf_logits(hf_default_model, ids)[-1]
        assert float((last[i] - ref).abs().max()) < LOGIT_TOL
        assert int(last[i].argmax()) == int(ref.argmax())


@pytest.mark.parametrize("which", [0, 1, 3])
def test_greedy_decode_equals_transformers_generate(
    default_model: LoadedModel, hf_default_model: Any, prompts: list[list[int]], which: int
) -> None:
    ids = prompts[which]
    stop = default_model.config.eos_token_ids
    driver = ManualDriver(default_model.model, default_model.config)
    ours = driver.greedy(ids, max_new_tokens=20, stop_ids=stop)
    with torch.inference_mode():
        reference = hf_greedy(hf_default_model, ids, max_new_tokens=20, stop_ids=stop)
    assert ours == reference
    assert len(ours) >= 5  # a real continuation, not an immediate stop


def test_embedding_rows_dequantized_from_blocks_equal_the_float_table(
    default_gguf: Path, default_model: LoadedModel
) -> None:
    """--quantization gguf drops the float embedding table and dequantizes the rows it looks
    up from the token_embd blocks (Q8_0 here): every row must be bitwise the converted table's."""
    import numpy as np
    from gguf import GGUFReader

    from radixserve.layers.quantization import GGUFWeight
    from radixserve.layers.vocab_embedding import gguf_rows

    tensor = next(t for t in GGUFReader(default_gguf).tensors if t.name == "token_embd.weight")
    table = default_model.model.model.embed_tokens.weight
    blocks = torch.from_numpy(np.asarray(tensor.data).copy())
    weight = GGUFWeight(blocks, int(tensor.tensor_type), table.shape[0])
    ids = torch.arange(table.shape[0])
    assert torch.equal(gguf_rows(weight, ids), table)
    # Any ids shape, as F.embedding takes.
    assert torch.equal(gguf_rows(weight, ids[:6].reshape(2, 3)), table[:6].reshape(2, 3, -1))
