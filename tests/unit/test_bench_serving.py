"""bench_serving end to end against the fake engine's HTTP app on a localhost port, and its
command line (SGLang's flags)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve import bench_serving
from radixserve.benchmarking.datasets import get_dataset
from radixserve.entrypoints.http_server import create_app
from tests.helpers.thread_server import free_port, serve_app
from tests.unit.test_bench_datasets import WordTokenizer
from tests.unit.test_http_fakes import FakeEngine, server_args

SGLANG_FIELDS = (
    "backend",
    "dataset_name",
    "request_rate",
    "max_concurrency",
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "concurrency",
    "cache_hit_rate",
    *(
        f"{stat}_{name}_ms"
        for name in ("ttft", "tpot", "itl", "e2e_latency")
        for stat in ("mean", "median", "p99")
    ),
)


@pytest.fixture(scope="module")
def fake_server() -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine()
    with serve_app(create_app(engine, server_args(enable_cache_report=True)), "error") as base:
        yield base, engine


def _args(base: str, tmp_path: Path, *extra: str) -> Any:
    return bench_serving.build_parser().parse_args(
        [
            "--base-url", base, "--dataset-name", "random", "--num-prompts", "6",
            "--random-input-len", "8", "--random-output-len", "5", "--random-range-ratio", "0.5",
            "--output-file", str(tmp_path / "out.jsonl"), "--disable-tqdm", *extra,
        ]
    )  # fmt: skip


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat", "vllm"])
def test_end_to_end_against_a_fake_server(
    fake_server: tuple[str, FakeEngine], tmp_path: Path, backend: str
) -> None:
    base, _ = fake_server
    args = _args(base, tmp_path, "--backend", backend, "--max-concurrency", "3")
    result = bench_serving.run_benchmark(args, tokenizer=WordTokenizer())
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    for name in SGLANG_FIELDS:
        assert name in record, name
    assert record["backend"] == backend and record["dataset_name"] == "random"
    assert record["completed"] == 6 and record["max_concurrency"] == 3
    rows = get_dataset(args, WordTokenizer())
    assert record["total_input_tokens"] == sum(r.prompt_len for r in rows)
    # ignore_eos: every request generates exactly its output length.
    assert record["total_output_tokens"] == sum(r.output_len for r in rows)
    assert record["mean_ttft_ms"] > 0 and record["mean_e2e_latency_ms"] >= record["mean_ttft_ms"]
    # The warmup sent the first prompt once already: the fake engine caches repeated prompts.
    assert 0 < record["cache_hit_rate"] < 1
    assert result["completed"] == 6


def test_request_rate_output_details_and_ids(
    fake_server: tuple[str, FakeEngine], tmp_path: Path
) -> None:
    base, engine = fake_server
    engine.calls.clear()
    args = _args(
        base, tmp_path, "--request-rate", "200", "--output-details", "--dataset-name",
        "random-ids", "--disable-stream", "--warmup-requests", "0",
    )  # fmt: skip
    result = bench_serving.run_benchmark(args, tokenizer=WordTokenizer())
    assert result["completed"] == 6 and result["request_rate"] == 200
    assert len(result["itls"]) == 6 and all(e == "" for e in result["errors"])
    assert all(call["input_ids"] is not None for call in engine.calls)
    # Not streamed: TTFT is the whole latency.
    assert result["mean_ttft_ms"] == pytest.approx(result["mean_e2e_latency_ms"])


def test_failed_requests_are_counted_not_raised(
    fake_server: tuple[str, FakeEngine], tmp_path: Path
) -> None:
    base, _ = fake_server
    # 40 words (~200 bytes) do not fit the fake model's 128-token context: every request is
    # answered 400.
    too_long = ("--random-input-len", "40", "--random-range-ratio", "1")
    args = _args(base, tmp_path, *too_long, "--warmup-requests", "0")
    result = bench_serving.run_benchmark(args, tokenizer=WordTokenizer())
    assert result["completed"] == 0 and result["failed"] == 6
    with pytest.raises(bench_serving.BenchmarkError, match=r"Warmup failed.*context length"):
        bench_serving.run_benchmark(_args(base, tmp_path, *too_long), tokenizer=WordTokenizer())


def test_parser_takes_sglang_flags() -> None:
    args = bench_serving.build_parser().parse_args(
        [
            "--backend", "sglang-oai", "--host", "127.0.0.1", "--port", "30001",
            "--model", "m", "--tokenizer", "t", "--dataset-name", "generated-shared-prefix",
            "--dataset-path", "x.json", "--num-prompts", "10", "--random-input-len", "64",
            "--random-output-len", "16", "--random-range-ratio", "0.5", "--gsp-num-groups", "2",
            "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "32",
            "--gsp-question-len", "8", "--gsp-output-len", "4", "--request-rate", "4",
            "--max-concurrency", "2", "--seed", "7", "--output-file", "o.jsonl",
            "--warmup-requests", "2", "--disable-tqdm", "--disable-stream",
            "--disable-ignore-eos", "--extra-request-body", '{"top_p": 0.9}',
            "--apply-chat-template", "--tokenize-prompt", "--flush-cache", "--tag", "t1",
        ]
    )  # fmt: skip
    assert args.backend == "sglang-oai" and args.port == 30001 and args.request_rate == 4.0
    assert (args.gsp_num_groups, args.gsp_output_len, args.seed) == (2, 4, 7)
    assert args.disable_stream and args.disable_ignore_eos and args.flush_cache
    defaults = bench_serving.build_parser().parse_args([])
    assert defaults.backend == "sglang" and defaults.dataset_name == "sharegpt"
    assert defaults.request_rate == float("inf") and defaults.num_prompts == 1000
    assert (defaults.random_input_len, defaults.random_output_len) == (1024, 1024)
    assert defaults.random_range_ratio == 0.0 and defaults.warmup_requests == 1
    assert defaults.max_concurrency is None and defaults.seed == 1
    assert bench_serving._base_url(defaults) == "http://127.0.0.1:30000"


def test_lora_name_picks_an_adapter_per_request() -> None:
    from radixserve.benchmarking.backends import (
        CHAT,
        COMPLETIONS,
        NATIVE,
        RequestSpec,
        build_payload,
    )

    def payload(kind: str, lora: str | None) -> dict[str, Any]:
        spec = RequestSpec("http://x", kind, "base", "hi", 1, 4, lora_name=lora)
        return build_payload(spec)

    assert payload(NATIVE, "a")["lora_path"] == "a"
    assert "lora_path" not in payload(NATIVE, None)
    for kind in (COMPLETIONS, CHAT):
        assert payload(kind, "a")["model"] == "a"  # SGLang's bench: the adapter as the model
        assert payload(kind, None)["model"] == "base"
        assert "lora_path" not in payload(kind, "a")


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai"])
def test_lora_name_reaches_the_server(
    fake_server: tuple[str, FakeEngine], tmp_path: Path, backend: str
) -> None:
    # The fake server serves no adapters. /generate's lora_path names one explicitly: refused,
    # all fail. The OpenAI route's `model` only selects an adapter where one of that name is
    # loaded, else the base model answers (as SGLang does): all complete.
    base, _ = fake_server
    args = _args(
        base, tmp_path, "--backend", backend, "--lora-name", "a", "b", "--warmup-requests", "0"
    )
    result = bench_serving.run_benchmark(args, tokenizer=WordTokenizer())
    if backend == "sglang":
        assert result["completed"] == 0
    else:
        assert result["completed"] > 0 and result["failed"] == 0


def test_unsupported_flags_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_serving.main(["--profile", "--port", str(free_port())]) == 2
    assert "--profile" in capsys.readouterr().err
    with pytest.raises(bench_serving.BenchmarkError, match="tokenize-prompt"):
        bench_serving.run_benchmark(
            bench_serving.build_parser().parse_args(
                ["--backend", "openai-chat", "--tokenize-prompt"]
            )
        )


def test_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    args = _args(f"http://127.0.0.1:{free_port()}", tmp_path)
    with pytest.raises(bench_serving.BenchmarkError, match="Cannot reach"):
        bench_serving.run_benchmark(args, tokenizer=WordTokenizer())
