"""The typed results (managers/outputs.py): to_json gives SGLang's meta_info and result dicts
exactly (keys, their order, optional groups only when set), TokenizerManager builds them from
scheduler outputs, the Engine's JSON edge closes the typed stream it wraps, and the metrics
read them by attribute."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from radixserve.entrypoints.engine import _ajson_stream, _json_of
from radixserve.managers.outputs import GenerateOutput, MetaInfo
from radixserve.managers.tokenizer_manager import TokenizerManager
from radixserve.messages import FinishReason, ReqOutput
from radixserve.observability.metrics import ServingMetrics
from radixserve.speculative.meta import spec_meta_info

BASE_KEYS = [
    "id",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "num_retractions",
    "e2e_latency",
]


# The base fields meta() builds from, and exactly the JSON they must give.
BASE_FIELDS: dict[str, Any] = {
    "id": "r1",
    "finish_reason": None,
    "prompt_tokens": 3,
    "completion_tokens": 2,
    "cached_tokens": 1,
    "num_retractions": 0,
    "e2e_latency": 0.5,
}


def meta(**overrides: Any) -> MetaInfo:
    return MetaInfo(**{**BASE_FIELDS, **overrides})


def test_plain_meta_info_has_only_the_base_keys_in_order() -> None:
    got = meta().to_json()
    assert list(got) == BASE_KEYS
    assert got == BASE_FIELDS


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (FinishReason("stop", matched=2), {"type": "stop", "matched": 2}),
        (FinishReason("length"), {"type": "length", "matched": None}),
        (
            FinishReason("abort", message="gone", status_code=503),
            {"type": "abort", "message": "gone", "status_code": 503},
        ),
    ],
)
def test_finish_reason_is_sglangs_shape(reason: FinishReason, expected: dict[str, Any]) -> None:
    info = meta(finish_reason=reason)
    assert info.to_json()["finish_reason"] == expected
    assert info.finished and info.aborted == (reason.type == "abort")


def test_optional_groups_appear_when_set_in_sglangs_order() -> None:
    lp = [[-0.5, 7, None]]
    top = [[[-0.5, 7, None]]]
    info = meta(
        cached_tokens_details={"device": 1, "host": 0, "storage": 0},
        routed_experts="AAAA",
        spec=spec_meta_info(verify_ct=2, accepted=3, drafted=4, completion_tokens=6),
        output_token_logprobs=lp,
        output_top_logprobs=top,
        input_token_logprobs=[],
        input_top_logprobs=[],
        output_token_ids_logprobs=top,
        input_token_ids_logprobs=[],
        weight_version="v2",
    )
    got = info.to_json()
    assert list(got) == [
        *BASE_KEYS,
        "cached_tokens_details",
        "routed_experts",
        "spec_verify_ct",
        "spec_accept_rate",
        "spec_accept_length",
        "spec_accept_token_num",
        "spec_draft_token_num",
        "output_token_logprobs",
        "output_top_logprobs",
        "input_token_logprobs",
        "input_top_logprobs",
        "output_token_ids_logprobs",
        "input_token_ids_logprobs",
        "weight_version",
    ]
    assert got["spec_accept_rate"] == 0.75 and got["spec_accept_length"] == 3.0
    assert got["spec_accept_token_num"] == 3 and got["spec_draft_token_num"] == 4
    assert got["output_token_logprobs"] is lp  # the request's list, not a copy


def test_spec_counts_are_left_out_before_the_first_verify_round() -> None:
    got = meta(spec=spec_meta_info(0, 0, 0, 1)).to_json()
    assert got["spec_verify_ct"] == 0
    assert got["spec_accept_rate"] == 0.0 and got["spec_accept_length"] == 0.0
    assert "spec_accept_token_num" not in got and "spec_draft_token_num" not in got


def test_logprobs_without_token_ids_logprob_have_four_lists() -> None:
    info = meta(
        output_token_logprobs=[],
        output_top_logprobs=[],
        input_token_logprobs=[],
        input_top_logprobs=[],
    )
    assert list(info.to_json())[len(BASE_KEYS) :] == [
        "output_token_logprobs",
        "output_top_logprobs",
        "input_token_logprobs",
        "input_top_logprobs",
    ]


def test_generate_output_json_shapes() -> None:
    text = GenerateOutput(meta(), text="ab", output_ids=[5, 6])
    assert list(text.to_json()) == ["text", "output_ids", "meta_info"]
    assert text.to_json()["meta_info"] == meta().to_json()
    empty = GenerateOutput(meta(), text="", output_ids=[])
    assert empty.to_json()["text"] == "" and empty.to_json()["output_ids"] == []
    embedding = GenerateOutput(meta(), embedding=[0.6, 0.8])
    assert list(embedding.to_json()) == ["embedding", "meta_info"]


class _Tok:
    eos_token_id = 2

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1] + [b + 3 for b in text.encode()]


def test_tokenizer_manager_builds_typed_chunks_and_the_final_result() -> None:
    manager = TokenizerManager(_Tok(), vocab_size=300, context_len=64)
    msg, state = manager.build_request(
        prompt="hi",
        input_ids=None,
        sampling_params={"max_new_tokens": 4},
        rid="r",
        return_logprob=True,
        logprob_start_len=0,
    )
    first = ReqOutput("r", [10], None, 3, 1, 0, output_token_logprobs=[(-0.1, 10)], text="a")
    chunk = manager.apply_output(state, first)
    assert chunk.text == "a" and chunk.output_ids == [10]
    assert chunk.meta_info.finish_reason is None
    assert chunk.meta_info.output_token_logprobs == [[-0.1, 10, None]]
    assert chunk.meta_info.output_token_ids_logprobs is None  # token_ids_logprob not named
    last = ReqOutput(
        "r",
        [11],
        FinishReason("length"),
        3,
        2,
        1,
        output_token_logprobs=[(-0.2, 11)],
        cached_tokens_details={"device": 1, "host": 0, "storage": 0},
        text="b",
    )
    manager.apply_output(state, last)
    final = manager.final_result(state, last)
    assert final.text == "ab" and final.output_ids == [10, 11]
    body = final.to_json()
    assert list(body) == ["text", "output_ids", "meta_info"]
    assert list(body["meta_info"]) == [
        *BASE_KEYS,
        "cached_tokens_details",
        "output_token_logprobs",
        "output_top_logprobs",
        "input_token_logprobs",
        "input_top_logprobs",
    ]
    info = body["meta_info"]
    assert info["id"] == msg.rid == "r"
    assert info["finish_reason"] == {"type": "length", "matched": None}
    assert (info["prompt_tokens"], info["completion_tokens"], info["cached_tokens"]) == (3, 2, 1)
    assert info["output_token_logprobs"] == [[-0.1, 10, None], [-0.2, 11, None]]


def test_an_embedding_result_has_no_text() -> None:
    manager = TokenizerManager(_Tok(), vocab_size=300, context_len=64)
    _, state = manager.build_request(
        prompt=None, input_ids=[5, 6], sampling_params={"max_new_tokens": 0}, embedding=True
    )
    out = ReqOutput("r", [], FinishReason("length"), 2, 0, 0, embedding=[1.0, 0.0])
    result = manager.final_result(state, out)
    assert result.to_json().keys() == {"embedding", "meta_info"}


def test_the_engines_json_stream_closes_the_typed_stream() -> None:
    closed: list[str] = []

    def chunks() -> Iterator[GenerateOutput]:
        try:
            yield GenerateOutput(meta(), text="a", output_ids=[5])
            yield GenerateOutput(meta(), text="b", output_ids=[6])
        finally:
            closed.append("sync")

    stream = _json_of(chunks())
    assert isinstance(stream, Iterator)
    assert next(stream)["text"] == "a"
    stream.close()  # the reader stopped early: the engine's stream must hear of it
    assert closed == ["sync"]

    async def achunks() -> AsyncIterator[GenerateOutput]:
        try:
            yield GenerateOutput(meta(), text="a", output_ids=[5])
            yield GenerateOutput(meta(), text="b", output_ids=[6])
        finally:
            closed.append("async")

    async def read_one() -> dict[str, Any]:
        wrapped = _ajson_stream(achunks())
        first = await wrapped.__anext__()
        await wrapped.aclose()
        return first

    assert asyncio.run(read_one())["output_ids"] == [5]
    assert closed == ["sync", "async"]


def test_metrics_count_an_aborted_result_by_attribute() -> None:
    metrics = ServingMetrics("m")
    metrics.observe_finished(meta(finish_reason=FinishReason("length")), 0.1)
    metrics.observe_finished(meta(finish_reason=FinishReason("abort", message="x")), 0.1)
    text = metrics.render().decode()
    assert 'sglang:num_requests_total{model_name="m"} 2.0' in text
    assert 'sglang:num_aborted_requests_total{model_name="m"} 1.0' in text
    assert 'sglang:prompt_tokens_total{model_name="m"} 6.0' in text
