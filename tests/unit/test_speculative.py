"""NGRAM speculative decoding on a tiny random model: greedy output equals plain decoding token
for token through every scheduler path, requests that finish inside a draft end exactly right,
KV is conserved after every step, and the spec counters reach meta_info and the server info."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from radixserve import Engine
from radixserve.options.errors import ServerArgsError
from radixserve.sampling.constrained.base import GrammarBackend, GrammarMatcher
from radixserve.sampling.constrained.bitmask import write_only
from radixserve.sampling.constrained.spec import GrammarSpec
from radixserve.sampling.custom_logit_processor import CustomLogitProcessor
from radixserve.server_args import ServerArgs
from tests.unit.tiny_model import TINY_VOCAB, tiny_engines, write_tiny_llama

NGRAM = {"speculative_algorithm": "NGRAM"}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-spec"))


@pytest.fixture
def make(tiny_model_dir: Path) -> Iterator[Any]:
    with tiny_engines(tiny_model_dir) as factory:
        yield factory


def prompts() -> list[list[int]]:
    rng = random.Random(0)
    out = [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randint(5, 60))] for _ in range(5)]
    # Repetitive prompts, so the n-gram drafts have something to copy (and to get wrong).
    out.append(list(range(10, 30)) * 4)
    out.append([7, 8, 9, 7, 8, 9, 7, 8] * 5)
    return out


def greedy(max_new: int = 40, **extra: Any) -> dict[str, Any]:
    return {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True, **extra}


def ids(results: list[dict[str, Any]]) -> list[list[int]]:
    return [r["output_ids"] for r in results]


def assert_idle(engine: Engine) -> None:
    info = engine.get_server_info()
    assert info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
    assert info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]


@pytest.fixture(scope="module")
def baseline(tiny_model_dir: Path) -> list[list[int]]:
    with Engine(
        runtime="thread",
        model_path=str(tiny_model_dir),
        load_format="dummy",
        dtype="float32",
        skip_tokenizer_init=True,
        max_total_tokens=4096,
        random_seed=0,
    ) as engine:
        return ids(engine.generate(input_ids=prompts(), sampling_params=greedy()))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"page_size": 4},
        {"disable_radix_cache": True},
        {"chunked_prefill_size": 16},
        {"speculative_num_draft_tokens": 3, "speculative_ngram_max_trie_depth": 4},
        {"speculative_adaptive": True},
    ],
)
def test_greedy_ngram_equals_plain_decoding(
    make: Any, baseline: list[list[int]], kwargs: dict[str, Any]
) -> None:
    engine = make(**NGRAM, **kwargs)
    results = engine.generate(input_ids=prompts(), sampling_params=greedy())
    assert ids(results) == baseline
    metas = [r["meta_info"] for r in results]
    drafted = sum(m["spec_draft_token_num"] for m in metas)
    accepted = sum(m["spec_accept_token_num"] for m in metas)
    # Drafts were both accepted and rejected, so both paths of the verify ran.
    assert 0 < accepted < drafted
    for m in metas:
        # completion tokens = the prefill's token + one per verify round + accepted drafts.
        assert m["completion_tokens"] == 1 + m["spec_verify_ct"] + m["spec_accept_token_num"]
        assert m["spec_accept_length"] == pytest.approx(
            m["completion_tokens"] / m["spec_verify_ct"]
        )
    info = engine.get_server_info()
    assert info["spec_accept_length"] > 1.0 and 0.0 < info["spec_accept_rate"] < 1.0
    assert_idle(engine)


def test_finishing_inside_a_draft(make: Any, baseline: list[list[int]]) -> None:
    engine = make(**NGRAM)
    plain = make()
    for max_new in (1, 2, 3, 5, 9, 17):
        got = engine.generate(input_ids=prompts(), sampling_params=greedy(max_new))
        assert ids(got) == [b[:max_new] for b in baseline]
        assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in got)
    # A stop token that the repetitive outputs reach inside an accepted draft.
    for i, out in enumerate(baseline):
        stop = out[len(out) // 2]
        params = greedy(stop_token_ids=[stop])
        got = engine.generate(input_ids=prompts()[i], sampling_params=params)
        want = plain.generate(input_ids=prompts()[i], sampling_params=params)
        assert got["output_ids"] == want["output_ids"] == out[: out.index(stop) + 1]
        assert got["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert_idle(engine)


def test_streaming_and_n(make: Any, baseline: list[list[int]]) -> None:
    engine = make(**NGRAM)
    chunks = list(engine.generate(input_ids=prompts()[5], sampling_params=greedy(), stream=True))
    streamed = [t for c in chunks for t in c["output_ids"]]
    assert streamed == baseline[5]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    many = engine.generate(input_ids=prompts()[6], sampling_params=greedy(n=3))
    assert ids(many) == [baseline[6]] * 3
    assert_idle(engine)


def test_retraction_under_a_tiny_pool(make: Any) -> None:
    rng = random.Random(5)
    inputs = [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randint(5, 60))] for _ in range(16)]
    want = ids(make().generate(input_ids=inputs, sampling_params=greedy()))
    # Too small for every request's draft slots at once: requests are retracted and resume.
    small = make(**NGRAM, max_total_tokens=256, page_size=4)
    got = small.generate(input_ids=inputs, sampling_params=greedy())
    assert ids(got) == want
    assert sum(r["meta_info"]["num_retractions"] for r in got) > 0
    assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in got)
    assert_idle(small)


def test_sampled_requests_run_and_free_their_kv(make: Any) -> None:
    engine = make(**NGRAM)
    params = {"temperature": 0.8, "top_k": 5, "top_p": 0.9, "max_new_tokens": 30}
    results = engine.generate(input_ids=prompts(), sampling_params=params)
    assert all(len(r["output_ids"]) <= 30 for r in results)
    assert sum(r["meta_info"]["spec_draft_token_num"] for r in results) > 0
    # Requests that are never speculated (seeded, logprobs) share the batch with drafted ones
    # (a penalised greedy request and a plain one).
    mixed = [
        {"temperature": 0.7, "sampling_seed": 3, "max_new_tokens": 20, "ignore_eos": True},
        {"temperature": 0, "frequency_penalty": 0.5, "max_new_tokens": 20, "ignore_eos": True},
        greedy(20),
    ]
    plain = make()
    inputs = prompts()[4:7]
    got = engine.generate(input_ids=inputs, sampling_params=mixed)
    want = plain.generate(input_ids=inputs, sampling_params=mixed)
    assert ids(got) == ids(want)
    assert got[0]["meta_info"]["spec_draft_token_num"] == 0
    assert got[1]["meta_info"]["spec_draft_token_num"] > 0
    lp = engine.generate(input_ids=inputs[0], sampling_params=greedy(10), return_logprob=True)
    assert len(lp["meta_info"]["output_token_logprobs"]) == 10
    assert_idle(engine)


def test_no_spec_fields_without_speculation(make: Any) -> None:
    engine = make()
    meta = engine.generate(input_ids=prompts()[0], sampling_params=greedy(3))["meta_info"]
    assert not any(key.startswith("spec_") for key in meta)
    assert "spec_accept_length" not in engine.get_server_info()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"speculative_algorithm": "EAGLE"}, "needs a trained draft head"),
        ({"speculative_algorithm": "EAGLE3"}, "needs a trained draft head"),
        ({"speculative_algorithm": "NEXTN"}, "multi-token-prediction layers"),
        (
            {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": "/m", "tp_size": 2},
            "--tp-size: EAGLE speculation runs with --tp-size 1 only",
        ),
        ({"speculative_algorithm": "MAGIC"}, "not supported"),
        ({"speculative_algorithm": "STANDALONE"}, "needs a draft model"),
        ({**NGRAM, "speculative_draft_model_path": "/m"}, "only used with STANDALONE"),
        ({**NGRAM, "speculative_num_steps": 3, "speculative_num_draft_tokens": 6}, "chain"),
        ({**NGRAM, "speculative_num_draft_tokens": 1}, "must be >= 2"),
        ({**NGRAM, "speculative_ngram_match_type": "PROB"}, "PROB"),
        ({"speculative_adaptive": True}, "--speculative-adaptive: needs --speculative-algorithm"),
    ],
)
def test_refused_settings(tiny_model_dir: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ServerArgsError) as err:
        ServerArgs.from_kwargs(model_path=str(tiny_model_dir), **kwargs)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_adaptive_drafts_less_where_drafts_miss(
    make: Any, baseline: list[list[int]], tmp_path: Path
) -> None:
    """A draft model unlike the target (few drafts accepted): with --speculative-adaptive each
    request drafts fewer tokens for the same output. (The tiny models with tied embeddings
    repeat their last token, so an untied LM head is what makes this draft guess differently.)"""
    draft = write_tiny_llama(tmp_path / "draft", num_hidden_layers=1, tie_word_embeddings=False)
    spec = {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": str(draft)}
    fixed = make(**spec, speculative_num_steps=4)
    adaptive = make(**spec, speculative_num_steps=4, speculative_adaptive=True)
    counts = []
    for engine in (fixed, adaptive):
        results = engine.generate(input_ids=prompts(), sampling_params=greedy())
        assert ids(results) == baseline
        metas = [r["meta_info"] for r in results]
        counts.append(
            (
                sum(m["spec_draft_token_num"] for m in metas),
                sum(m["spec_accept_token_num"] for m in metas),
            )
        )
        assert_idle(engine)
    (fixed_drafts, fixed_accepted), (adaptive_drafts, _) = counts
    assert fixed_accepted < fixed_drafts / 2  # the premise: most drafts miss
    assert adaptive_drafts < fixed_drafts / 2


def write_other_tiny_llama(folder: Path, vocab: int = TINY_VOCAB) -> Path:
    """A different tiny model (one layer, so other dummy weights) with the given vocabulary."""
    return write_tiny_llama(
        folder,
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )


def draft_idle(engine: Engine) -> bool:
    draft = engine.scheduler.spec.draft
    return draft.allocator.available_size() == draft.allocator.size


def test_standalone_same_model_accepts_every_draft(
    make: Any, baseline: list[list[int]], tiny_model_dir: Path
) -> None:
    engine = make(
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=str(tiny_model_dir),
        speculative_num_steps=3,
    )
    results = engine.generate(input_ids=prompts(), sampling_params=greedy())
    assert ids(results) == baseline
    for r in results:
        m = r["meta_info"]
        assert m["spec_draft_token_num"] > 0
        assert m["spec_accept_token_num"] == m["spec_draft_token_num"]
        assert m["spec_accept_length"] > 3.0
    assert_idle(engine)
    assert draft_idle(engine)


def test_standalone_other_draft_model_keeps_output(
    make: Any, baseline: list[list[int]], tmp_path: Path
) -> None:
    draft = write_other_tiny_llama(tmp_path / "draft")
    engine = make(
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=str(draft),
        speculative_num_draft_tokens=4,
        page_size=4,
    )
    results = engine.generate(input_ids=prompts(), sampling_params=greedy())
    assert ids(results) == baseline
    drafted = sum(r["meta_info"]["spec_draft_token_num"] for r in results)
    assert drafted > 0
    for max_new in (1, 2, 5):
        got = engine.generate(input_ids=prompts(), sampling_params=greedy(max_new))
        assert ids(got) == [b[:max_new] for b in baseline]
    sampled = engine.generate(
        input_ids=prompts(), sampling_params={"temperature": 1.0, "max_new_tokens": 20}
    )
    assert all(1 <= len(r["output_ids"]) <= 20 for r in sampled)
    assert_idle(engine)
    assert draft_idle(engine)


def test_standalone_under_retraction_and_vocab_mismatch(make: Any, tmp_path: Path) -> None:
    rng = random.Random(5)
    inputs = [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randint(5, 60))] for _ in range(16)]
    want = ids(make().generate(input_ids=inputs, sampling_params=greedy()))
    draft = write_other_tiny_llama(tmp_path / "draft")
    small = make(
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=str(draft),
        max_total_tokens=256,
    )
    got = small.generate(input_ids=inputs, sampling_params=greedy())
    assert ids(got) == want
    assert sum(r["meta_info"]["num_retractions"] for r in got) > 0
    assert_idle(small)
    assert draft_idle(small)
    other_vocab = write_other_tiny_llama(tmp_path / "other-vocab", vocab=300)
    with pytest.raises(Exception, match="vocabulary"):
        make(speculative_algorithm="STANDALONE", speculative_draft_model_path=str(other_vocab))


def test_a_request_filling_the_whole_pool_still_finishes(make: Any) -> None:
    """Draft slots are only reserved up to a request's remaining tokens, so a request that
    needs the whole KV pool is not aborted for want of room for drafts it cannot use."""
    engine = make(**NGRAM, max_total_tokens=64, disable_radix_cache=True)
    plain = make(max_total_tokens=64, disable_radix_cache=True)
    prompt = [7, 8, 9, 10] * 10
    want = plain.generate(input_ids=prompt, sampling_params=greedy(24))
    got = engine.generate(input_ids=prompt, sampling_params=greedy(24))
    assert got["meta_info"]["finish_reason"]["type"] == "length"
    assert got["output_ids"] == want["output_ids"]
    assert_idle(engine)


def test_metrics_report_spec_gauges(make: Any) -> None:
    from prometheus_client import generate_latest

    from radixserve.observability.metrics import ServingMetrics

    engine = make(**NGRAM)
    engine.generate(input_ids=prompts()[5], sampling_params=greedy())
    metrics = ServingMetrics("tiny")
    metrics.snapshot = engine.get_server_info()  # what the server's scrape reads
    text = generate_latest(metrics.registry).decode()
    info = metrics.snapshot
    assert f'sglang:spec_accept_length{{model_name="tiny"}} {info["spec_accept_length"]}' in text
    assert f'sglang:spec_accept_rate{{model_name="tiny"}} {info["spec_accept_rate"]}' in text
    assert info["spec_accept_length"] > 1.0
    metrics.snapshot = make().get_server_info()
    assert "spec_accept_length" not in generate_latest(metrics.registry).decode()


class _CycleMatcher(GrammarMatcher):
    """A toy grammar over the tiny vocabulary: after token t (or at the start) the next token
    is one of CYCLE's two successors of t's place in it, so outputs repeat (n-gram drafts hit)
    yet the model still chooses (drafts also miss, and some are refused by the grammar)."""

    CYCLE: ClassVar[list[int]] = list(range(40, 52))

    def __init__(self) -> None:
        super().__init__(TINY_VOCAB, (2,))
        self.tokens: list[int] = []

    def allowed(self, after: int | None) -> list[int]:
        place = self.CYCLE.index(after) if after in self.CYCLE else -1
        n = len(self.CYCLE)
        return [self.CYCLE[(place + 1) % n], self.CYCLE[(place + 2) % n]]

    def fill_packed(self, bitmask: torch.Tensor, index: int = 0) -> None:
        write_only(bitmask[index], self.allowed(self.tokens[-1] if self.tokens else None))

    def accept_token(self, token_id: int) -> bool:
        if token_id not in self.allowed(self.tokens[-1] if self.tokens else None):
            return False
        self.tokens.append(token_id)
        self._accepted()
        return True

    def is_terminated(self) -> bool:
        return False

    def _rollback(self, num_tokens: int) -> None:
        del self.tokens[-num_tokens:]


class _CycleBackend(GrammarBackend):
    name = "cycle"

    def __init__(self) -> None:
        tokenizer = type("T", (), {"eos_token_id": 2})()
        super().__init__(tokenizer, TINY_VOCAB)

    def _compile(self, spec: GrammarSpec) -> object:
        return spec

    def matcher(self, compiled: object) -> GrammarMatcher:
        return _CycleMatcher()


def _with_cycle_grammar(engine: Any) -> Any:
    # The token-ids-only tiny engine has no tokenizer, hence no grammar backend: both the API
    # side (which checks the grammar) and the scheduler get the toy one.
    backend = _CycleBackend()
    engine.tokenizer_manager._grammar_backend = backend
    engine.scheduler.grammars._backend = backend
    return engine


def test_grammar_requests_are_drafted_and_verified_under_their_masks(make: Any) -> None:
    plain = _with_cycle_grammar(make())
    spec = _with_cycle_grammar(make(**NGRAM))
    propose = spec.scheduler.spec.propose
    branched: list[bool] = []

    def spying(reqs: Any) -> Any:
        trees = propose(reqs)
        pairs = zip(reqs, trees, strict=True)
        branched.extend(not t.is_chain for r, t in pairs if r.grammar is not None)
        return trees

    spec.scheduler.spec.propose = spying
    inputs = prompts()
    constrained = greedy(60, regex="cycle")
    params = [constrained if i % 2 == 0 else greedy(60) for i in range(len(inputs))]
    want = plain.generate(input_ids=inputs, sampling_params=params)
    got = spec.generate(input_ids=inputs, sampling_params=params)
    assert ids(got) == ids(want)
    assert any(branched)  # constrained requests verified branching trees, pruned and masked
    for i, result in enumerate(got):
        if i % 2:
            continue
        out = result["output_ids"]
        checker = _CycleMatcher()
        assert all(checker.accept_token(t) for t in out), out
        meta = result["meta_info"]
        assert meta["spec_draft_token_num"] > meta["spec_accept_token_num"] > 0
    # Sampled constrained requests (rejection sampling on masked rows) stay in the grammar.
    sampled = spec.generate(
        input_ids=inputs[:3], sampling_params={**constrained, "temperature": 0.8}
    )
    for result in sampled:
        checker = _CycleMatcher()
        assert all(checker.accept_token(t) for t in result["output_ids"])
    assert sum(r["meta_info"]["spec_accept_token_num"] for r in sampled) > 0
    assert_idle(spec)


def test_penalties_and_min_new_tokens_are_drafted_exactly(
    make: Any, baseline: list[list[int]]
) -> None:
    """Verify row j applies penalties and min_new_tokens as of the output plus drafts 1..j, so
    greedy output with them equals plain decoding's, with drafts proposed and accepted."""
    plain = make()
    spec = make(**NGRAM)
    inputs = prompts()
    stops = [out[len(out) // 3] for out in baseline]  # reached early: min_new_tokens matters
    params = [
        greedy(repetition_penalty=1.3),
        greedy(frequency_penalty=0.4, presence_penalty=0.2),
        greedy(stop_token_ids=[stops[2]], min_new_tokens=30, ignore_eos=False),
        greedy(repetition_penalty=1.1, min_new_tokens=25, stop_token_ids=[stops[3]]),
        greedy(presence_penalty=-0.5),
        greedy(frequency_penalty=-0.3),
        greedy(repetition_penalty=0.9),
    ]
    want = plain.generate(input_ids=inputs, sampling_params=params)
    got = spec.generate(input_ids=inputs, sampling_params=params)
    assert ids(got) == ids(want)
    assert [g["meta_info"]["finish_reason"] for g in got] == [
        w["meta_info"]["finish_reason"] for w in want
    ]
    metas = [g["meta_info"] for g in got]
    assert all(m["spec_draft_token_num"] > 0 for m in metas)
    assert sum(m["spec_accept_token_num"] for m in metas) > 0
    assert_idle(spec)


def test_logprob_requests_are_drafted_with_their_logprobs(make: Any) -> None:
    """Each emitted token's logprob and top logprobs come from its verify row: the same tokens
    as plain decoding, logprobs equal up to float rounding (extend vs decode kernels)."""
    plain = make()
    spec = make(**NGRAM)
    inputs = prompts()[4:7]
    for params in (greedy(30), greedy(30, temperature=0.0, frequency_penalty=0.3)):
        named = {"top_logprobs_num": 3, "token_ids_logprob": [5, 7]}
        want = plain.generate(
            input_ids=inputs, sampling_params=params, return_logprob=True, **named
        )
        got = spec.generate(input_ids=inputs, sampling_params=params, return_logprob=True, **named)
        assert ids(got) == ids(want)
        assert sum(g["meta_info"]["spec_accept_token_num"] for g in got) > 0
        for g, w in zip(got, want, strict=True):
            gm, wm = g["meta_info"], w["meta_info"]
            assert len(gm["output_token_logprobs"]) == len(g["output_ids"])
            for (glp, gid, *_), (wlp, wid, *_) in zip(
                gm["output_token_logprobs"], wm["output_token_logprobs"], strict=True
            ):
                assert gid == wid and glp == pytest.approx(wlp, abs=1e-4)
            for gtop, wtop in zip(
                gm["output_top_logprobs"], wm["output_top_logprobs"], strict=True
            ):
                assert [t[1] for t in gtop] == [t[1] for t in wtop]
                assert [t[0] for t in gtop] == pytest.approx([t[0] for t in wtop], abs=1e-4)
            # token_ids_logprob: the named ids' logprobs from the same rows.
            gnamed, wnamed = gm["output_token_ids_logprobs"], wm["output_token_ids_logprobs"]
            assert len(gnamed) == len(wnamed) == len(g["output_ids"])
            for gpos, wpos in zip(gnamed, wnamed, strict=True):
                assert [t[1] for t in gpos] == [t[1] for t in wpos] == [5, 7]
                assert [t[0] for t in gpos] == pytest.approx([t[0] for t in wpos], abs=1e-4)
    assert_idle(spec)


class ForceAfter(CustomLogitProcessor):
    """From the request's `after`-th output token on, only `token` may follow: a processor
    that reads the request's output, so each verify row must show it the drafts before it."""

    def __call__(self, logits: torch.Tensor, custom_param_list: Any = None) -> torch.Tensor:
        assert custom_param_list is not None
        out = logits.clone()
        for row, params in enumerate(custom_param_list):
            if len(params["__req__"].output_ids) >= params["after"]:
                out[row] = float("-inf")
                out[row, params["token"]] = 0.0
        return out


def test_custom_logit_processors_see_each_rows_drafts(make: Any) -> None:
    plain = make(enable_custom_logit_processor=True)
    spec = make(**NGRAM, enable_custom_logit_processor=True)
    inputs = prompts()[:4]
    params = [greedy(30, custom_params={"after": 6 + i, "token": 77 + i}) for i in range(4)]
    processor = ForceAfter.to_str()
    kwargs = {"input_ids": inputs, "sampling_params": params}
    want = plain.generate(**kwargs, custom_logit_processor=[processor] * 4)
    got = spec.generate(**kwargs, custom_logit_processor=[processor] * 4)
    assert ids(got) == ids(want)
    for i, result in enumerate(got):
        assert set(result["output_ids"][6 + i :]) == {77 + i}
    # The forced runs repeat, so their drafts land, through the processor's rows.
    assert sum(r["meta_info"]["spec_accept_token_num"] for r in got) > 0
    assert_idle(spec)
