"""NGRAM speculative decoding on the real default model (float32): greedy output equals plain
decoding token for token, drafts really are accepted on a copy-the-prompt request, stop strings
end inside drafts exactly as without speculation, and grammar-constrained requests are drafted
under their grammar's masks (output unchanged and valid, drafts accepted)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve import Engine
from tests.unit.test_spec_tree import oracle_trees

PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the "
    "wick, polished the great lens, and wrote the weather in a leather logbook. Ships passed "
    "safely through the narrow channel because the light never failed."
)
QUESTIONS = [
    f"Repeat this text exactly, word for word:\n\n{PASSAGE}",
    f"Repeat this text, but change 'evening' to 'morning':\n\n{PASSAGE}",
    "What is the capital of France?",
    "List the days of the week, one per line.",
    "Write a Python function that returns the sum of a list.",
]
MAX_NEW = 64
# ~3 min on 2 loaded cores; the default run covers the same behaviours on a tiny model
# (tests/unit/test_speculative.py).
pytestmark = pytest.mark.slow


def _engine(gguf: Path, **kwargs: Any) -> Engine:
    return Engine(
        model_path=str(gguf),
        dtype="float32",
        quantization="unquant",
        max_total_tokens=16384,
        runtime="thread",
        **kwargs,
    )


@pytest.fixture(scope="module")
def engines(default_gguf: Path) -> Iterator[tuple[Engine, Engine]]:
    with (
        _engine(default_gguf) as plain,
        _engine(
            default_gguf, speculative_algorithm="NGRAM", speculative_num_draft_tokens=6
        ) as spec,
    ):
        spec.scheduler.check_kv_each_step = True
        yield plain, spec


def chat(engine: Engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )


def test_greedy_output_equals_plain_decoding(engines: tuple[Engine, Engine]) -> None:
    plain, spec = engines
    prompts = [chat(plain, q) for q in QUESTIONS]
    params = {"temperature": 0, "max_new_tokens": MAX_NEW}
    want = plain.generate(prompt=prompts, sampling_params=params)
    got = spec.generate(prompt=prompts, sampling_params=params)
    for w, g in zip(want, got, strict=True):
        assert g["output_ids"] == w["output_ids"]
        assert g["meta_info"]["finish_reason"] == w["meta_info"]["finish_reason"]
    copy = got[0]["meta_info"]
    # Copying the prompt: most drafts are accepted, several tokens per target forward.
    assert copy["spec_accept_token_num"] > copy["spec_draft_token_num"] // 2
    assert copy["spec_accept_length"] > 2.0
    # One at a time too (no batch neighbours to share the n-gram cache with in this round).
    alone = spec.generate(prompt=prompts[1], sampling_params=params)
    assert alone["output_ids"] == want[1]["output_ids"]


def test_stop_strings_inside_drafts(engines: tuple[Engine, Engine]) -> None:
    plain, spec = engines
    prompt = chat(plain, QUESTIONS[0])
    for stop in (["logbook"], ["stairs", "lens"], ["channel because"]):
        params = {"temperature": 0, "max_new_tokens": MAX_NEW, "stop": stop}
        want = plain.generate(prompt=prompt, sampling_params=params)
        got = spec.generate(prompt=prompt, sampling_params=params)
        assert got["text"] == want["text"]
        assert got["output_ids"] == want["output_ids"]
        assert got["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
        assert got["meta_info"]["finish_reason"]["type"] == "stop"
        assert got["meta_info"]["spec_accept_token_num"] > 0


def test_grammar_requests_are_drafted_and_equal_plain_decoding(
    engines: tuple[Engine, Engine],
) -> None:
    plain, spec = engines
    record = {"name": "Ada Lovelace", "born": 1815, "fields": ["mathematics", "computing"]}
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "born": {"type": "integer"},
            "fields": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "born", "fields"],
        "additionalProperties": False,
    }
    prompts = [
        chat(plain, f"Repeat this JSON exactly:\n{json.dumps(record)}"),
        chat(plain, "Describe a person as JSON."),
        chat(plain, QUESTIONS[0]),
        chat(plain, "Count from 1 to 12, separated by commas."),
    ]
    params = [
        {"temperature": 0, "max_new_tokens": 60, "json_schema": json.dumps(schema)},
        {"temperature": 0, "max_new_tokens": 60, "json_schema": json.dumps(schema)},
        {"temperature": 0, "max_new_tokens": 40},
        {"temperature": 0, "max_new_tokens": 40, "regex": r"(\d{1,2}, ){11}\d{1,2}"},
    ]
    want = plain.generate(prompt=prompts, sampling_params=params)
    got = spec.generate(prompt=prompts, sampling_params=params)
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    assert json.loads(got[0]["text"]) == record
    # The copied JSON is drafted from the prompt and mostly accepted under the grammar's masks.
    copy = got[0]["meta_info"]
    assert copy["spec_accept_token_num"] > copy["spec_draft_token_num"] // 2 > 0
    assert got[3]["text"].count(",") == 11
    # Sampled constrained requests: rejection sampling over masked rows stays inside the grammar.
    sampled = spec.generate(
        prompt=[prompts[0]] * 3,
        sampling_params={
            "temperature": 0.7,
            "max_new_tokens": 60,
            "json_schema": json.dumps(schema),
        },
    )
    for result in sampled:
        assert set(json.loads(result["text"])) == set(record)
    assert sum(r["meta_info"]["spec_accept_token_num"] for r in sampled) > 0


@pytest.mark.parametrize("topk", [1, 3], ids=["chain", "tree"])
def test_standalone_with_the_same_model_as_draft(
    engines: tuple[Engine, Engine], default_gguf: Path, topk: int
) -> None:
    plain, _ = engines
    prompts = [chat(plain, q) for q in QUESTIONS[1:4]]
    # ignore_eos: drafts past an EOS are verified but not kept, so they would not count as
    # accepted.
    params = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}
    # The chain under deterministic inference: the draft's decode steps and the target's
    # verification then give the same bits, so every draft must be accepted (without it a
    # near-tie between the two kernels' float sums now and then rejects one).
    exact = {"enable_deterministic_inference": True} if topk == 1 else {}
    if exact:
        with _engine(default_gguf, **exact) as reference:
            want = reference.generate(prompt=prompts, sampling_params=params)
    else:
        want = plain.generate(prompt=prompts, sampling_params=params)
    tree = {"speculative_eagle_topk": 3, "speculative_num_draft_tokens": 8} if topk > 1 else {}
    with _engine(
        default_gguf,
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=str(default_gguf),
        speculative_num_steps=4,
        **tree,
        **exact,
    ) as spec:
        spec.scheduler.check_kv_each_step = True
        got = spec.generate(prompt=prompts, sampling_params=params)
        draft = spec.scheduler.spec.draft
        assert draft.allocator.available_size() == draft.allocator.size
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    for g in got:
        m = g["meta_info"]
        if topk == 1:
            assert m["spec_accept_token_num"] == m["spec_draft_token_num"] > 0
        else:
            # The tree holds the draft's greedy path as deep as that path scores high enough
            # against the siblings: several drafts accepted per round.
            assert m["spec_accept_length"] > 2.0


def test_continuation_on_a_later_branch_is_accepted_with_its_kv(
    engines: tuple[Engine, Engine],
) -> None:
    """Drafts that hide the plain output on the root's second branch (under a wrong first
    one): accepting it moves that branch's KV into place, and the logprobs of every later
    token, which read that KV, stay those of plain decoding."""
    plain, spec = engines
    prompts = [chat(plain, q) for q in QUESTIONS[2:5]]
    params = {"temperature": 0, "max_new_tokens": 24}
    want = plain.generate(prompt=prompts, sampling_params=params, return_logprob=True)
    outputs = {}
    for prompt, w in zip(prompts, want, strict=True):
        outputs[tuple(plain.tokenizer.encode(prompt))] = w["output_ids"]
    worker = spec.scheduler.spec
    propose = worker.propose
    worker.propose = oracle_trees(outputs)
    try:
        got = spec.generate(prompt=prompts, sampling_params=params, return_logprob=True)
    finally:
        worker.propose = propose
    for g, w in zip(got, want, strict=True):
        assert g["output_ids"] == w["output_ids"]
        assert g["meta_info"]["spec_accept_token_num"] > 0
        glps = [lp for lp, *_ in g["meta_info"]["output_token_logprobs"]]
        wlps = [lp for lp, *_ in w["meta_info"]["output_token_logprobs"]]
        assert glps == pytest.approx(wlps, abs=2e-3)


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_eagle_head_keeps_greedy_output(
    engines: tuple[Engine, Engine], default_gguf: Path, tmp_path: Path, algorithm: str
) -> None:
    """A random head in the default model's shapes (EAGLE3: its default feature layers 2, 15
    and 27 of 30, a 4,096-token draft vocabulary): drafts are proposed, and the output is plain
    decoding's."""
    from tests.unit.eagle_heads import write_eagle3_head, write_eagle_head

    plain, _ = engines
    target_dir = plain.scheduler.step_runner.runner.model_dir
    if algorithm == "EAGLE":
        head = write_eagle_head(tmp_path / "head", target_dir)
    else:
        head = write_eagle3_head(tmp_path / "head", target_dir, draft_vocab=4096)
    prompts = [chat(plain, q) for q in QUESTIONS[1:4]]
    params = {"temperature": 0, "max_new_tokens": 32}
    with _engine(
        default_gguf,
        speculative_algorithm=algorithm,
        speculative_draft_model_path=str(head),
        speculative_eagle_topk=2,
        speculative_num_steps=3,
        speculative_num_draft_tokens=5,
    ) as spec:
        spec.scheduler.check_kv_each_step = True
        got = spec.generate(prompts, params)
    want = plain.generate(prompts, params)
    assert [r["text"] for r in got] == [r["text"] for r in want]
    assert all(r["meta_info"]["spec_draft_token_num"] > 0 for r in got)


def test_ngram_on_gguf_blocks_under_deterministic_inference(default_gguf: Path) -> None:
    """On the file's Q4_1/Q8_0 blocks a verify of several rows runs the few-row integer kernel
    (csrc/gguf_paired_rows.cpp on AVX512 hosts) and a decode step the one-row kernel; with
    --enable-deterministic-inference (one query row per attention item, no float tiles) they
    give the same bits, so NGRAM's greedy output equals plain decoding token for token, alone
    and in a batch."""
    prompts = [
        "<|im_start|>user\nRepeat this text exactly, word for word:\n\n"
        f"{PASSAGE}<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nList the days of the week, one per line.<|im_end|>\n"
        "<|im_start|>assistant\n",
    ]
    params = {"temperature": 0, "max_new_tokens": 48}
    common: dict[str, Any] = {
        "model_path": str(default_gguf),
        "enable_deterministic_inference": True,
        "max_total_tokens": 8192,
        "runtime": "thread",
    }
    with Engine(**common) as plain:
        want = plain.generate(prompt=prompts, sampling_params=params)
    with Engine(**common, speculative_algorithm="NGRAM", speculative_num_draft_tokens=8) as spec:
        got = spec.generate(prompt=prompts, sampling_params=params)
        alone = spec.generate(prompt=prompts[0], sampling_params=params)
    assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
    assert alone["output_ids"] == want[0]["output_ids"]
    assert got[0]["meta_info"]["spec_accept_length"] > 2.0  # drafts really were verified
