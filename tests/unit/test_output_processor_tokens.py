"""OutputProcessor.apply_tokens, the one path every step's tokens take: appended one by one
through the finish checks, stopping at the first that ends the request; after a speculative
round the KV of positions not kept is trimmed first and the drafter hears what was kept."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from radixserve.managers.finish_checker import FinishChecker
from radixserve.managers.output_processor import OutputProcessor
from radixserve.managers.schedule_batch import Req, SchedulerStats
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.sampling.token_result import TokenResult
from radixserve.speculative.draft_tree import DraftTree

EOS = 2


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def trim(self, req: Req, new_kv_len: int) -> None:
        self.calls.append(("trim", new_kv_len, len(req.output_ids)))

    def release(self, req: Req) -> None:
        self.calls.append(("release",))

    def committed(self, req: Req, num_drafts: int, num_kept: int) -> None:
        self.calls.append(("committed", num_drafts, num_kept))


def _processor(rec: _Recorder) -> tuple[OutputProcessor, SchedulerStats]:
    stats = SchedulerStats()
    sessions = SimpleNamespace(on_finish=lambda req, computed: None)
    processor = OutputProcessor(
        SimpleNamespace(running=[]),  # type: ignore[arg-type]
        rec,  # type: ignore[arg-type]
        FinishChecker([EOS], context_len=100, tokenizer=None),
        sessions,  # type: ignore[arg-type]
        stats,
        SimpleNamespace(),  # type: ignore[arg-type]
        SimpleNamespace(),  # type: ignore[arg-type]
        rec,  # type: ignore[arg-type]
        radix_enabled=False,
        stream_interval=1,
        log_time_stats=False,
    )
    return processor, stats


def _req(max_new_tokens: int = 10) -> Req:
    req = Req("r", [5, 6, 7], SamplingParams(max_new_tokens=max_new_tokens))
    req.req_pool_idx = 0
    req.kv_len = 3 + 4  # the round ran the last token and 3 drafts
    return req


def _tokens(*ids: int) -> list[TokenResult]:
    return [TokenResult(t, 0.0) for t in ids]


def test_a_round_keeps_its_tokens_trims_then_commits() -> None:
    rec = _Recorder()
    processor, stats = _processor(rec)
    req = _req()
    assert processor.apply_tokens(req, _tokens(11, 12, 13), DraftTree.chain([11, 12, 9]))
    assert req.output_ids == [11, 12, 13]
    # KV holds the inputs of the kept tokens (the newest's is computed next round).
    assert rec.calls == [("trim", 5, 3), ("committed", 3, 2)]
    assert (req.spec_verify_ct, req.spec_draft_tokens, req.spec_accepted_tokens) == (1, 3, 2)
    assert (stats.spec_verify_rounds, stats.generated_tokens) == (1, 3)


def test_a_round_stops_at_the_token_that_ends_the_request() -> None:
    rec = _Recorder()
    processor, stats = _processor(rec)
    req = _req()
    assert not processor.apply_tokens(req, _tokens(11, EOS, 13), DraftTree.chain([11, EOS]))
    assert req.output_ids == [11, EOS]
    assert req.finished_reason is not None and req.finished_reason.type == "stop"
    # Trimmed (and committed) before the finished request's KV is released.
    assert rec.calls == [("trim", 4, 2), ("committed", 2, 2), ("release",)]
    assert stats.generated_tokens == 2


def test_plain_decoding_appends_one_token_without_a_round() -> None:
    rec = _Recorder()
    processor, stats = _processor(rec)
    req = _req()
    assert processor.apply_tokens(req, _tokens(11), None)
    assert processor.apply_token(req, TokenResult(12, 0.0))
    assert req.output_ids == [11, 12]
    assert rec.calls == []
    assert (req.spec_verify_ct, stats.spec_verify_rounds, stats.generated_tokens) == (0, 0, 2)
