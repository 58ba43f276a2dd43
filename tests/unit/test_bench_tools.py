"""bench_one_batch and bench_offline_throughput on a tiny random Llama (dummy weights): their
command lines (SGLang's flags plus every `radixserve serve` option), the static batch's KV
bookkeeping against a hand-driven reference, and their JSONL records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from radixserve import bench_offline_throughput, bench_one_batch
from radixserve.benchmarking.model_cost import ModelCost
from radixserve.benchmarking.server_cli import parse_with_server_args
from tests.helpers.model_driver import ManualDriver
from tests.helpers.tiny_models import save_word_tokenizer
from tests.unit.tiny_model import TINY_VOCAB, write_tiny_llama


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny-bench"))
    save_word_tokenizer(folder, TINY_VOCAB)
    return folder


def _server_opts(folder: Path) -> list[str]:
    return [
        "--model-path", str(folder), "--load-format", "dummy", "--dtype", "float32",
        "--max-total-tokens", "2048", "--random-seed", "0", "--log-level", "warning",
    ]  # fmt: skip


def test_one_batch_command_line_mixes_bench_and_server_options(tiny_dir: Path) -> None:
    parser = bench_one_batch.build_parser()
    argv = ["--batch-size", "1", "4", "--input-len", "32", "--output-len", "8", "--run-name", "x"]
    ns, server_args = parse_with_server_args(parser, [*argv, *_server_opts(tiny_dir)])
    bench = bench_one_batch.BenchArgs.from_namespace(ns)
    assert bench.batch_size == (1, 4) and bench.input_len == (32,) and bench.output_len == (8,)
    assert bench.run_name == "x" and bench.result_filename == "result.jsonl"
    assert server_args.max_total_tokens == 2048 and server_args.load_format == "dummy"
    with pytest.raises(SystemExit):
        parse_with_server_args(parser, ["--batch-size", "1", "--no-such-option"])


def test_static_batch_matches_a_hand_driven_reference(tiny_dir: Path) -> None:
    from radixserve.model_executor.model_runner import ModelRunner

    _, server_args = parse_with_server_args(bench_one_batch.build_parser(), _server_opts(tiny_dir))
    runner = ModelRunner(server_args)
    cost = ModelCost.from_model(runner.model, runner.model_config, runner.kv_cache.dtype)
    batch = bench_one_batch.StaticBatch(runner, 3, cost)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, TINY_VOCAB, n).tolist() for n in (7, 12, 3)]
    outputs = [[t] for t in batch.greedy(prompts)]
    for _ in range(5):
        step = batch.greedy([[out[-1]] for out in outputs], is_decode=True)
        for out, token in zip(outputs, step, strict=True):
            out.append(token)
    assert batch.last_cost == cost.decode_step([7 + 4, 12 + 4, 3 + 4])  # 4 earlier decode steps
    for prompt, out in zip(prompts, outputs, strict=True):
        driver = ManualDriver(runner.model, runner.model_config, max_tokens=256, max_requests=1)
        assert driver.greedy(prompt, 6) == out
    batch.clear()
    assert batch.allocator.available_size() == runner.plan.max_total_tokens


def test_one_batch_end_to_end_writes_sglang_records(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "result.jsonl"
    argv = ["--batch-size", "1", "2", "--input-len", "16", "--output-len", "4"]
    code = bench_one_batch.main(
        [*argv, "--result-filename", str(out), "--run-name", "tiny", *_server_opts(tiny_dir)]
    )
    assert code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["batch_size"], r["input_len"], r["output_len"]) for r in records] == [
        (1, 16, 4),
        (2, 16, 4),
    ]
    for r in records:
        assert r["run_name"] == "tiny"
        for key in (
            "prefill_latency",
            "prefill_throughput",
            "median_decode_latency",
            "median_decode_throughput",
            "total_latency",
            "overall_throughput",
            "decode_bandwidth_share",
            "prefill_compute_share",
        ):
            assert r[key] > 0, key
    text = capsys.readouterr().out
    assert "Prefill. latency:" in text and "Decode.  median latency:" in text
    assert "CPU features:" in text and "of memory bandwidth" in text


def test_offline_throughput_end_to_end(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "offline.jsonl"
    argv = [
        "--dataset-name", "random", "--num-prompts", "5", "--random-input-len", "12",
        "--random-output-len", "6", "--random-range-ratio", "0.5", "--result-filename",
        str(out), "--skip-warmup", *_server_opts(tiny_dir),
    ]  # fmt: skip
    assert bench_offline_throughput.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["backend"] == "engine" and record["successful_requests"] == 5
    for key in ("request_throughput", "input_throughput", "output_throughput", "total_throughput"):
        assert record[key] > 0
    assert 15 <= record["total_output_tokens"] <= 30  # ignore_eos: exactly the asked lengths
    assert record["forward_steps"] >= 6 and record["bandwidth_share"] > 0
    text = capsys.readouterr().out
    assert "Offline Throughput Benchmark Result" in text and "Compute share:" in text


def test_offline_throughput_refuses_what_it_cannot_do(tiny_dir: Path) -> None:
    with pytest.raises(SystemExit):
        bench_offline_throughput.main(["--profile", *_server_opts(tiny_dir)])
