"""The grammar layer without a grammar library: specs, bitmasks, the compile cache and its
deadline, the registry (fast; no tokenizer)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from radixserve.sampling.constrained import (
    GrammarBackend,
    GrammarError,
    GrammarMatcher,
    GrammarSpec,
    create_grammar_backend,
    spec_from_sampling_params,
    unpack_bitmask,
)
from radixserve.sampling.constrained.bitmask import (
    add_tokens,
    allocate_bitmask,
    apply_allowed_mask,
    bitmask_words,
    write_only,
)
from radixserve.sampling.sampling_params import SamplingParams


class _Tokenizer:
    eos_token_id = 3


class _Matcher(GrammarMatcher):
    """Allows exactly the token ids 5 then EOS."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(vocab_size, (3,))
        self.tokens: list[int] = []

    def fill_packed(self, bitmask: torch.Tensor, index: int = 0) -> None:
        write_only(bitmask[index], [3] if self.tokens else [5])

    def accept_token(self, token_id: int) -> bool:
        if not self._in_vocab(token_id) or token_id != (3 if self.tokens else 5):
            return False
        self.tokens.append(token_id)
        self._accepted()
        return True

    def is_terminated(self) -> bool:
        return self.tokens[-1:] == [3]

    def _rollback(self, num_tokens: int) -> None:
        del self.tokens[-num_tokens:]


class _Backend(GrammarBackend):
    name = "fake"

    def __init__(self, delay_s: float = 0.0, **kwargs: object) -> None:
        super().__init__(_Tokenizer(), 40, **kwargs)  # type: ignore[arg-type]
        self.delay_s = delay_s
        self.calls = 0
        self.release = threading.Event()

    def _compile(self, spec: GrammarSpec) -> object:
        self.calls += 1
        if self.delay_s:
            self.release.wait(self.delay_s)
        if spec.value == "bad":
            raise GrammarError("Invalid regex: bad", spec.param)
        if spec.value == "boom":
            raise RuntimeError("[12:00:00] /src/x.cc:12: Check failed: (a) is false: it broke")
        return object()

    def matcher(self, compiled: object) -> _Matcher:
        return _Matcher(self.vocab_size)


# --- GrammarSpec and spec_from_sampling_params ---------------------------------------------


def test_spec_from_sampling_params_picks_the_grammar_field() -> None:
    assert spec_from_sampling_params(SamplingParams()) is None
    assert spec_from_sampling_params(SamplingParams(regex="a+")) == GrammarSpec("regex", "a+")
    assert spec_from_sampling_params(SamplingParams(ebnf='root ::= "x"')) == GrammarSpec(
        "ebnf", 'root ::= "x"'
    )
    schema = '{"type": "integer"}'
    spec = spec_from_sampling_params(SamplingParams(json_schema=schema))
    assert spec == GrammarSpec("json_schema", schema)
    assert spec is not None and not spec.is_any_json
    any_json = spec_from_sampling_params(SamplingParams(json_schema="$$ANY$$"))
    assert any_json is not None and any_json.is_any_json
    tag = spec_from_sampling_params(SamplingParams(structural_tag='{"structures": []}'))
    assert tag == GrammarSpec("structural_tag", '{"structures": []}')


def test_spec_from_sampling_params_refuses_two_grammars() -> None:
    params = SamplingParams(regex="a", json_schema="{}")
    with pytest.raises(GrammarError) as info:
        spec_from_sampling_params(params)
    assert info.value.param == "regex"


def test_spec_validates_kind_and_value() -> None:
    with pytest.raises(ValueError, match="kind"):
        GrammarSpec("yaml", "x")
    with pytest.raises(GrammarError) as info:
        GrammarSpec("regex", 5)  # type: ignore[arg-type]
    assert info.value.param == "regex"
    # json_object carries no text; any value is normalised so the cache key is one spec.
    assert GrammarSpec("json_object", "ignored") == GrammarSpec("json_object")
    assert GrammarSpec("json_object").param == "json_schema"


# --- bitmask ---------------------------------------------------------------------------------


def test_bitmask_round_trip_including_the_sign_bit() -> None:
    vocab = 70
    assert bitmask_words(vocab) == 3
    packed = allocate_bitmask(2, vocab)
    ids = [0, 31, 32, 63, 69]
    write_only(packed[0], ids)
    add_tokens(packed[1], [5])
    add_tokens(packed[1], [31])
    allowed = unpack_bitmask(packed, vocab)
    assert allowed.shape == (2, vocab)
    assert allowed[0].nonzero().flatten().tolist() == ids
    assert allowed[1].nonzero().flatten().tolist() == [5, 31]
    write_only(packed[0], [1])
    assert unpack_bitmask(packed[0], vocab).nonzero().flatten().tolist() == [1]


def test_apply_allowed_mask_sets_disallowed_logits_to_minus_inf() -> None:
    logits = torch.zeros(2, 4)
    allowed = torch.tensor([[True, False, True, False], [False, False, False, True]])
    apply_allowed_mask(logits, allowed)
    assert torch.isinf(logits[0, 1]) and logits[0, 0] == 0
    assert logits[1].argmax().item() == 3
    with pytest.raises(ValueError, match="bool"):
        apply_allowed_mask(logits, allowed.int())


# --- matcher base ----------------------------------------------------------------------------


def test_matcher_fill_bitmask_checks_the_buffer_and_rollback_bounds() -> None:
    matcher = _Matcher(40)
    allowed = torch.ones(40, dtype=torch.bool)
    matcher.fill_bitmask(allowed)
    assert allowed.nonzero().flatten().tolist() == [5]
    with pytest.raises(ValueError, match="shape"):
        matcher.fill_bitmask(torch.zeros(41, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        matcher.fill_bitmask(torch.zeros(40))
    with pytest.raises(ValueError, match="token_id"):
        matcher.accept_token("5")  # type: ignore[arg-type]
    assert not matcher.accept_token(99)
    assert matcher.accept_token(5) and matcher.accept_token(3)
    with pytest.raises(ValueError, match="num_tokens"):
        matcher.rollback(3)
    with pytest.raises(ValueError, match="num_tokens"):
        matcher.rollback(-1)
    matcher.rollback(2)
    assert matcher.tokens == []


# --- compile cache and deadline --------------------------------------------------------------


def test_compile_is_cached_per_spec() -> None:
    backend = _Backend()
    spec = GrammarSpec("regex", "a+")
    first = backend.compile(spec)
    assert backend.compile(GrammarSpec("regex", "a+")) is first
    assert backend.calls == 1 and backend.is_cached(spec)
    assert backend.compile(GrammarSpec("ebnf", "a+")) is not first
    backend.clear_cache()
    assert backend.compile(spec) is not first


def test_compile_cache_evicts_least_recently_used() -> None:
    backend = _Backend(cache_size=2)
    a, b, c = (GrammarSpec("regex", v) for v in "abc")
    backend.compile(a)
    backend.compile(b)
    backend.compile(a)  # a is now the most recent
    backend.compile(c)
    assert backend.is_cached(a) and backend.is_cached(c) and not backend.is_cached(b)


def test_compile_errors_name_the_param_and_are_not_cached() -> None:
    backend = _Backend()
    for _ in range(2):
        with pytest.raises(GrammarError) as info:
            backend.compile(GrammarSpec("regex", "bad"))
        assert info.value.param == "regex"
    assert backend.calls == 2
    # An undocumented library failure still becomes a GrammarError, without the C++ prefix.
    with pytest.raises(GrammarError) as info:
        backend.compile(GrammarSpec("ebnf", "boom"))
    assert info.value.param == "ebnf"
    assert "it broke" in str(info.value) and ".cc" not in str(info.value)


def test_slow_compile_times_out_without_blocking_and_is_cached_when_it_ends() -> None:
    backend = _Backend(delay_s=5.0, compile_timeout_s=0.2)
    spec = GrammarSpec("json_schema", '{"type": "string"}')
    start = time.monotonic()
    future = backend.compile_async(spec)
    assert time.monotonic() - start < 0.1 and not future.done()
    with pytest.raises(GrammarError, match="took too long to compile") as info:
        future.result(timeout=2.0)
    assert info.value.param == "json_schema"
    assert 0.15 < time.monotonic() - start < 2.0
    # A second request for the same grammar joins the compile still running.
    second = backend.compile_async(spec)
    backend.release.set()
    assert second.result(timeout=2.0) is not None
    assert backend.calls == 1 and backend.is_cached(spec)


def test_backend_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="compile_timeout_s"):
        _Backend(compile_timeout_s=0)
    with pytest.raises(ValueError, match="eos_token_ids"):
        _Backend(eos_token_ids=[99])
    with pytest.raises(ValueError, match="spec"):
        _Backend().compile("a+")  # type: ignore[arg-type]


# --- registry --------------------------------------------------------------------------------


def test_registry_names() -> None:
    assert create_grammar_backend("none", _Tokenizer(), 40) is None
    with pytest.raises(ValueError, match="--grammar-backend"):
        create_grammar_backend("guidance2", _Tokenizer(), 40)
