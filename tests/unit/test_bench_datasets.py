"""Benchmark dataset generators: lengths in range, seeds reproducible, shared prefixes shared."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixserve.benchmarking.datasets import (
    DatasetError,
    add_dataset_args,
    compute_random_lens,
    get_dataset,
    random_text,
    sample_generated_shared_prefix_requests,
    sample_random_requests,
    sample_sharegpt_requests,
    vocab_token_ids,
)


class WordTokenizer:
    """Token i is the word "w<i>"; ids 0 and 1 are special. Round-trips exactly."""

    vocab_size = 200
    all_special_ids = (0, 1)
    bos_token = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [int(word[1:]) for word in text.split()]

    def decode(self, ids: Any, **_: Any) -> str:
        return " ".join(f"w{int(i)}" for i in ids)

    def apply_chat_template(self, messages: list[dict[str, Any]], **_: Any) -> str:
        return " ".join(["w1", *(m["content"] for m in messages)])


class ByteTokenizer(WordTokenizer):
    """Bytes as tokens (id = byte + 2): random ids often decode to invalid UTF-8, so the text
    does not round-trip to the same ids."""

    vocab_size = 258

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [b + 2 for b in text.encode("utf-8")]

    def decode(self, ids: Any, **_: Any) -> str:
        return bytes(int(i) - 2 for i in ids if int(i) >= 2).decode("utf-8", errors="replace")


def dataset_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_dataset_args(parser)
    return parser.parse_args(list(argv))


def test_random_lens_stay_in_range_and_follow_the_seed() -> None:
    lens = compute_random_lens(100, 0.25, 500, np.random.default_rng(3))
    assert min(lens) >= 25 and max(lens) <= 100
    assert len(set(lens)) > 10
    assert lens == compute_random_lens(100, 0.25, 500, np.random.default_rng(3))
    assert compute_random_lens(7, 1.0, 20, np.random.default_rng(0)) == [7] * 20
    # Ratio 0 (SGLang's default) still gives at least one token.
    assert min(compute_random_lens(3, 0.0, 200, np.random.default_rng(0))) == 1
    with pytest.raises(DatasetError):
        compute_random_lens(10, 1.5, 1, np.random.default_rng(0))


def test_random_ids_have_exact_lengths_and_no_special_tokens() -> None:
    tok = WordTokenizer()
    rng = np.random.default_rng(0)
    rows = sample_random_requests(tok, 40, 12, 50, 0.5, rng, return_text=False)
    assert len(rows) == 50
    for row in rows:
        assert isinstance(row.prompt, list)
        assert 20 <= row.prompt_len <= 40 and len(row.prompt) == row.prompt_len
        assert 6 <= row.output_len <= 12
        assert all(2 <= t < 200 for t in row.prompt)
    assert set(vocab_token_ids(tok).tolist()) == set(range(2, 200))


def test_random_text_is_retokenized_to_its_reported_length() -> None:
    for tok in (WordTokenizer(), ByteTokenizer()):
        rows = sample_random_requests(tok, 16, 4, 30, 1.0, np.random.default_rng(1))
        for row in rows:
            assert isinstance(row.prompt, str)
            assert row.prompt_len == len(tok.encode(row.prompt)) <= 16
    # A round-tripping tokenizer keeps the exact length.
    text, length = random_text(WordTokenizer(), [5, 6, 7])
    assert (text, length) == ("w5 w6 w7", 3)


def test_same_seed_same_prompts_other_seed_other_prompts() -> None:
    tok = WordTokenizer()
    args = dataset_args("--dataset-name", "random", "--num-prompts", "8", "--seed", "5")
    first, again = get_dataset(args, tok), get_dataset(args, tok)
    assert first == again
    other = get_dataset(dataset_args("--dataset-name", "random", "--num-prompts", "8"), tok)
    assert [r.prompt for r in other] != [r.prompt for r in first]


def test_random_ids_dataset_and_tokenize_prompt_send_ids() -> None:
    tok = WordTokenizer()
    ids = get_dataset(dataset_args("--dataset-name", "random-ids", "--num-prompts", "4"), tok)
    assert all(isinstance(r.prompt, list) for r in ids)
    args = dataset_args(
        "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2",
        "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "8",
        "--gsp-question-len", "4", "--tokenize-prompt",
    )  # fmt: skip
    rows = get_dataset(args, tok)
    assert all(isinstance(r.prompt, list) and len(r.prompt) == r.prompt_len for r in rows)


def test_shared_prefix_groups_share_their_system_prompt() -> None:
    tok = WordTokenizer()
    rows = sample_generated_shared_prefix_requests(
        tok, 3, 4, 10, 5, 7, 1.0, np.random.default_rng(0)
    )
    assert len(rows) == 12
    assert [r.group for r in rows] != sorted(r.group for r in rows)  # shuffled
    systems: dict[int, set[str]] = {}
    for row in rows:
        assert isinstance(row.prompt, str)
        system, question = row.prompt.split("\n\n")
        assert len(tok.encode(system)) == 10 and len(tok.encode(question)) == 5
        assert row.prompt_len == 15 and row.output_len == 7
        assert row.group is not None
        systems.setdefault(row.group, set()).add(system)
    assert all(len(s) == 1 for s in systems.values())
    assert len({next(iter(s)) for s in systems.values()}) == 3
    questions = [str(r.prompt).split("\n\n")[1] for r in rows]
    assert len(set(questions)) == 12


def test_gen_aliases_of_older_sglang_versions() -> None:
    args = dataset_args("--gen-num-groups", "3", "--gen-prompts-per-group", "5")
    assert (args.gsp_num_groups, args.gsp_prompts_per_group) == (3, 5)
    assert (args.gsp_system_prompt_len, args.gsp_question_len, args.gsp_output_len) == (
        2048,
        128,
        256,
    )


def _sharegpt_file(tmp_path: Path) -> Path:
    data = [
        {"conversations": [{"value": "w5 w6 w7"}, {"value": "w8 w9 w10 w11 w12 w13"}]},
        {"conversations": [{"value": "w5"}, {"value": "w8 w9"}]},  # prompt too short
        {"conversations": [{"value": "only one turn"}]},
        {"conversation": [{"value": "w2 w3 w4 w5 w6"}, {"value": "w7 w8"}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_from_a_local_file(tmp_path: Path) -> None:
    tok = WordTokenizer()
    path = str(_sharegpt_file(tmp_path))
    rows = sample_sharegpt_requests(tok, path, 10, np.random.default_rng(0))
    assert sorted((r.prompt_len, r.output_len) for r in rows) == [(3, 6), (5, 2)]
    fixed = sample_sharegpt_requests(tok, path, 1, np.random.default_rng(0), fixed_output_len=9)
    assert len(fixed) == 1 and fixed[0].output_len == 9
    capped = sample_sharegpt_requests(tok, path, 10, np.random.default_rng(0), context_len=7)
    assert [(r.prompt_len, r.output_len) for r in capped] == [(5, 2)]
    chat = sample_sharegpt_requests(tok, path, 10, np.random.default_rng(0), chat_template=True)
    assert all(str(r.prompt).startswith("w1 ") for r in chat)


def test_sharegpt_never_downloads() -> None:
    with pytest.raises(DatasetError, match="--dataset-path"):
        get_dataset(dataset_args("--num-prompts", "2"), WordTokenizer())
    with pytest.raises(DatasetError, match="cannot read"):
        get_dataset(dataset_args("--dataset-path", "/nonexistent/x.json"), WordTokenizer())
