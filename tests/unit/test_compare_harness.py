"""The pure parts of benchmarks/compare.py (no servers, no llama.cpp build)."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def compare() -> ModuleType:
    return _load("compare")


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return _load("compare_report")


def _result(
    engine: str, concurrency: int, tok_s: float, ttft: float, workload: str = "random", **extra: Any
) -> dict[str, Any]:
    metrics = {
        "completed": 16,
        "total_output_tokens": 16 * 64,
        "output_throughput": tok_s,
        "request_throughput": tok_s / 64,
        "mean_ttft_ms": ttft,
        "median_ttft_ms": ttft,
        "p99_ttft_ms": ttft * 2,
        "mean_tpot_ms": 1000 / tok_s,
        "mean_e2e_latency_ms": ttft + 64 * 1000 / tok_s,
        **extra,
    }
    return {
        "workload": workload,
        "engine": engine,
        "concurrency": concurrency,
        "num_prompts": 16,
        "expected_output_len": 64,
        "metrics": metrics,
    }


@pytest.fixture()
def fake_results(report: ModuleType) -> list[dict[str, Any]]:
    results = []
    for concurrency, scale in ((1, 1.0), (8, 4.0)):
        results += [
            _result(report.RADIXSERVE, concurrency, 100 * scale, 50),
            _result(report.LLAMA_CPP, concurrency, 200 * scale, 25),
            _result(report.HF_BF16, concurrency, 50 * scale, 100),
        ]
    results.append(
        {
            "workload": "random",
            "engine": report.HF_FP32,
            "concurrency": 8,
            "num_prompts": 16,
            "expected_output_len": 64,
            "error": "exit code 1",
        }
    )
    results += [
        _result(report.RADIXSERVE, 4, 90, 40, workload="shared-prefix", cache_hit_rate=0.8),
        _result(report.RADIXSERVE_NO_RADIX, 4, 80, 120, workload="shared-prefix"),
        _result(report.LLAMA_CPP, 4, 150, 60, workload="shared-prefix"),
    ]
    return results


def test_defaults_match_the_issue(compare: ModuleType) -> None:
    settings = compare.resolve_settings(compare.build_parser().parse_args([]))
    assert settings.concurrencies == [1, 8, 32, 64]
    assert settings.shapes == [(128, 128)]
    assert settings.gsp["num_groups"] == 16
    assert settings.gsp["system_prompt_len"] == 1024
    assert settings.gsp["question_len"] == 64
    assert [compare.num_prompts_for(settings, c) for c in (1, 8, 64)] == [8, 16, 128]


def test_quick_mode_and_explicit_flags(compare: ModuleType) -> None:
    parser = compare.build_parser()
    quick = compare.resolve_settings(parser.parse_args(["--quick"]))
    assert quick.concurrencies == [1, 8]
    assert (quick.num_prompts, quick.shapes) == (16, [(64, 64)])
    explicit = compare.resolve_settings(
        parser.parse_args(
            [
                "--quick",
                "--concurrencies",
                "2",
                "--output-len",
                "32",
                "--radixserve-args",
                "--dtype bfloat16 --quantization gguf",
            ]
        )
    )
    assert explicit.concurrencies == [2]
    assert explicit.shapes == [(64, 32)]
    assert explicit.radixserve_args == ["--dtype", "bfloat16", "--quantization", "gguf"]


def test_bad_engine_is_refused(compare: ModuleType) -> None:
    with pytest.raises(SystemExit):
        compare.build_parser().parse_args(["--engines", "vllm"])


def test_plan_interleaves_engines(compare: ModuleType, report: ModuleType) -> None:
    settings = compare.resolve_settings(compare.build_parser().parse_args(["--quick"]))
    jobs = compare.plan_jobs(settings)
    random_jobs = [(j.concurrency, j.engine) for j in jobs if j.workload == report.RANDOM]
    engines = list(compare.ENGINES)
    assert random_jobs == [(1, e) for e in engines] + [(8, e) for e in engines]
    shared = [j.engine for j in jobs if j.workload == report.SHARED_PREFIX]
    assert shared == [report.RADIXSERVE, report.RADIXSERVE_NO_RADIX, report.LLAMA_CPP]
    assert all(j.expected_output_len == settings.gsp["output_len"] for j in jobs[-3:])


def test_same_prompts_for_all_engines_new_ones_per_concurrency(compare: ModuleType) -> None:
    settings = compare.resolve_settings(compare.build_parser().parse_args(["--quick"]))
    jobs = [j for j in compare.plan_jobs(settings) if j.workload == "random"]
    seeds = {(j.concurrency, compare.seed_for(settings, j)) for j in jobs}
    assert len(seeds) == len(settings.concurrencies)
    assert len({seed for _, seed in seeds}) == len(settings.concurrencies)


def _shapes_settings(compare: ModuleType, *argv: str) -> Any:
    args = ["--quick", "--shapes", "128:64", "512:128", "2048:32", *argv]
    return compare.resolve_settings(compare.parse_arguments(args))


def test_plan_runs_every_shape_engines_back_to_back(
    compare: ModuleType, report: ModuleType
) -> None:
    settings = _shapes_settings(compare, "--engines", "radixserve", "llama.cpp")
    jobs = [j for j in compare.plan_jobs(settings) if j.workload == report.RANDOM]
    shapes = [report.Shape(128, 64), report.Shape(512, 128), report.Shape(2048, 32)]
    engines = [report.RADIXSERVE, report.LLAMA_CPP]
    assert [(j.shape, j.concurrency, j.engine) for j in jobs] == [
        (shape, concurrency, engine)
        for shape in shapes
        for concurrency in (1, 8)
        for engine in engines
    ]
    assert all(j.expected_output_len == j.shape.output_len for j in jobs)
    assert len({compare.job_slug(j) for j in jobs}) == len(jobs)  # no run overwrites another's


def test_seeds_per_shape_and_concurrency(compare: ModuleType, report: ModuleType) -> None:
    settings = _shapes_settings(compare)
    jobs = [j for j in compare.plan_jobs(settings) if j.workload == report.RANDOM]
    seeds: dict[tuple[Any, int], set[int]] = {}
    for job in jobs:
        seeds.setdefault((job.shape, job.concurrency), set()).add(compare.seed_for(settings, job))
    assert all(len(s) == 1 for s in seeds.values())  # the same prompts for every engine
    assert len({seed for s in seeds.values() for seed in s}) == len(seeds) == 3 * 2
    # The first shape keeps the seeds of a one-shape run.
    one = compare.resolve_settings(compare.parse_arguments(["--quick", "--input-len", "128"]))
    first = next(j for j in jobs if j.shape == (128, 64) and j.concurrency == 8)
    same = next(j for j in compare.plan_jobs(one) if j.concurrency == 8)
    assert compare.seed_for(settings, first) == compare.seed_for(one, same)


def test_llama_slot_context_fits_the_largest_shape(compare: ModuleType, report: ModuleType) -> None:
    settings = _shapes_settings(compare)
    assert compare.llama_ctx_per_slot(settings, report.RANDOM) >= 2048 + 32
    assert compare.llama_ctx_per_slot(settings, report.RANDOM) < 2048 + 32 + 512
    gsp = settings.gsp
    shared = gsp["system_prompt_len"] + gsp["question_len"] + gsp["output_len"]
    assert compare.llama_ctx_per_slot(settings, report.SHARED_PREFIX) >= shared


def test_commands_take_the_job_shape(
    compare: ModuleType, report: ModuleType, tmp_path: Path
) -> None:
    settings = _shapes_settings(compare)
    server = compare.Server("x", [], 1234, tmp_path / "log")
    shape = report.Shape(2048, 32)
    job = compare.Job(report.RANDOM, report.LLAMA_CPP, 8, 16, 32, shape)
    command = compare.bench_serving_command(job, server, settings, tmp_path / "m", tmp_path / "o")
    assert command[command.index("--random-input-len") + 1] == "2048"
    assert command[command.index("--random-output-len") + 1] == "32"
    hf = compare.Job(report.RANDOM, report.HF_FP32, 8, 8, 32, shape)
    command = compare.hf_command(hf, settings, tmp_path / "m.gguf", tmp_path / "o")
    assert command[command.index("--input-len") + 1] == "2048"
    assert command[command.index("--output-len") + 1] == "32"
    assert command[command.index("--seed") + 1] == str(compare.seed_for(settings, hf))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shapes", "128:64", "--input-len", "256"], "drop --input-len/--output-len"),
        (["--shapes", "128:64", "--output-len", "16"], "drop --input-len/--output-len"),
        (["--shapes", "128x64"], "'128x64' is not IN:OUT"),
        (["--shapes", "128:"], "'128:' is not IN:OUT"),
        (["--shapes", "0:64"], "'0:64' is not IN:OUT"),
        (["--shapes", "128:64", "512:8", "128:64"], "lists 128:64 more than once"),
    ],
)
def test_bad_shape_arguments_are_refused(
    compare: ModuleType, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        compare.parse_arguments(argv)
    assert exit_info.value.code == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert message in errors[-1]  # one line says what is wrong


def test_bench_serving_commands(compare: ModuleType, report: ModuleType, tmp_path: Path) -> None:
    settings = compare.resolve_settings(compare.build_parser().parse_args(["--quick"]))
    server = compare.Server("x", [], 1234, tmp_path / "log")
    gguf = tmp_path / "m.gguf"
    ours = compare.Job(report.RANDOM, report.RADIXSERVE, 8, 16, 64, report.Shape(64, 64))
    command = compare.bench_serving_command(ours, server, settings, gguf, tmp_path / "o.jsonl")
    assert command[command.index("--backend") + 1] == "sglang"
    assert "--flush-cache" in command
    assert command[command.index("--random-input-len") + 1] == "64"
    theirs = compare.Job(report.SHARED_PREFIX, report.LLAMA_CPP, 4, 8, 8)
    command = compare.bench_serving_command(theirs, server, settings, gguf, tmp_path / "o.jsonl")
    assert command[command.index("--backend") + 1] == "openai"
    assert '"ignore_eos": true' in command[command.index("--extra-request-body") + 1]
    assert command[command.index("--dataset-name") + 1] == "generated-shared-prefix"
    assert command[command.index("--base-url") + 1] == "http://127.0.0.1:1234"


def test_parse_build_output(compare: ModuleType) -> None:
    stdout = "noise\nLLAMA_SERVER=/c/bin/llama-server\nLLAMA_BENCH=/c/bin/llama-bench\nX=1\n"
    assert compare.parse_build_output(stdout) == {
        "LLAMA_SERVER": "/c/bin/llama-server",
        "LLAMA_BENCH": "/c/bin/llama-bench",
    }


def test_ratios(report: ModuleType, fake_results: list[dict[str, Any]]) -> None:
    assert report.ratio(1.0, 0) is None
    assert report.ratio(None, 2.0) is None
    rows = {row["concurrency"]: row for row in report.random_ratio_rows(fake_results)}
    assert rows[1][f"throughput_vs_{report.LLAMA_CPP}"] == pytest.approx(0.5)
    assert rows[8][f"throughput_vs_{report.HF_BF16}"] == pytest.approx(2.0)
    assert rows[8][f"throughput_vs_{report.HF_FP32}"] is None  # that run failed
    assert rows[1][f"ttft_vs_{report.LLAMA_CPP}"] == pytest.approx(2.0)


def test_render_table(report: ModuleType) -> None:
    table = report.render_table(["A", "B"], [["x", "1"], ["y", "2"]])
    assert table.splitlines() == ["| A | B |", "| :--- | ---: |", "| x | 1 |", "| y | 2 |"]


def test_random_and_shared_tables(report: ModuleType, fake_results: list[dict[str, Any]]) -> None:
    table = report.random_table(fake_results)
    assert "| 8 | radixserve | 400.0 |" in table
    assert "| 8 | hf-float32 | n/a |" in table and "failed" in table
    ratios = report.random_ratio_table(fake_results)
    assert "| 1 | 0.50x | 2.00x | n/a | 2.00x |" in ratios
    shared = report.shared_prefix_table(fake_results)
    assert "| radixserve | 40.0 |" in shared and "80%" in shared
    assert "| radixserve --disable-radix-cache | 120.0 | 120.0 | 240.0 | 3.00x |" in shared


def test_check_result_flags_short_outputs_and_failures(report: ModuleType) -> None:
    good = _result(report.LLAMA_CPP, 1, 100, 10)
    assert report.check_result(good) == []
    short = _result(report.LLAMA_CPP, 1, 100, 10, total_output_tokens=16 * 40)
    assert "40.0 output tokens" in report.check_result(short)[0]
    partial = _result(report.LLAMA_CPP, 1, 100, 10, completed=10, total_output_tokens=640)
    assert "only 10 of 16" in report.check_result(partial)[0]
    failed = {"workload": "random", "engine": "x", "concurrency": 1, "error": "boom"}
    assert report.check_result(failed) == ["x (random, concurrency 1) failed: boom"]


def test_llama_bench_table(report: ModuleType) -> None:
    entries = [
        {"n_prompt": 512, "n_gen": 0, "n_threads": 2, "avg_ts": 1234.5, "stddev_ts": 3.2},
        {"n_prompt": 0, "n_gen": 128, "n_threads": 2, "avg_ts": 99.0, "stddev_ts": 0.5},
    ]
    table = report.llama_bench_table(entries)
    assert "| pp512 | 2 | 1,234.5 | 3.2 |" in table
    assert "| tg128 | 2 | 99.0 | 0.5 |" in table


def test_offline_rows_sit_next_to_llama_bench(
    report: ModuleType, fake_results: list[dict[str, Any]]
) -> None:
    entries = [
        {"n_prompt": 512, "n_gen": 0, "n_threads": 2, "avg_ts": 200.0, "stddev_ts": 3.2},
        {"n_prompt": 0, "n_gen": 128, "n_threads": 2, "avg_ts": 80.0, "stddev_ts": 0.5},
    ]
    table = report.offline_table(entries, {"pp512": 500.0, "tg128": 60.0})
    assert "| pp512 | 200.0 | 500.0 | 2.50x |" in table
    assert "| tg128 | 80.0 | 60.0 | 0.75x |" in table
    assert "| tg128 | n/a | 60.0 | n/a |" in report.offline_table([], {"tg128": 60.0})
    doc = report.render_document(
        [("CPU", "test")], fake_results, {}, entries, [], [], None, None, offline={"tg128": 60.0}
    )
    assert "| tg128 | 80.0 | 60.0 | 0.75x |" in doc


def test_notes_are_kept(report: ModuleType, fake_results: list[dict[str, Any]]) -> None:
    def render(existing: str | None) -> str:
        return report.render_document(
            [("CPU", "test")],
            fake_results,
            {"input_len": 64, "output_len": 64},
            [],
            [],
            [],
            "performance.png",
            existing,
        )

    fresh = render(None)
    assert fresh.rstrip().endswith(report.DEFAULT_NOTES.rstrip())
    edited = fresh.replace(report.DEFAULT_NOTES, "## Notes\n\nradixserve decodes slowly at c=1.\n")
    again = render(edited)
    assert again.count("\n## Notes\n") == 1
    assert again.rstrip().endswith("radixserve decodes slowly at c=1.")
    assert "![output tok/s vs concurrency](performance.png)" in again
    assert "## Notes and more" not in report.split_notes("## Notes and more\ntext")


def _shaped(result: dict[str, Any], input_len: int, output_len: int) -> dict[str, Any]:
    """A random result of one shape, as compare.py records it."""
    return {**result, "input_len": input_len, "expected_output_len": output_len}


def _two_shape_results(report: ModuleType) -> list[dict[str, Any]]:
    """128:64 (radixserve half llama.cpp's speed) then 512:128 (radixserve three times)."""
    results = []
    for concurrency in (1, 8):
        results += [
            _shaped(_result(report.RADIXSERVE, concurrency, 100, 50), 128, 64),
            _shaped(_result(report.LLAMA_CPP, concurrency, 200, 25), 128, 64),
        ]
    for concurrency in (1, 8):
        results += [
            _shaped(_result(report.RADIXSERVE, concurrency, 300, 40), 512, 128),
            _shaped(_result(report.LLAMA_CPP, concurrency, 100, 80), 512, 128),
        ]
    return results


def test_each_shape_is_its_own_section(report: ModuleType) -> None:
    results = _two_shape_results(report)
    doc = report.render_document(
        [("CPU", "test")], results, {"num_prompts_text": "16 prompts per run"}, [], [], [], "p.png"
    )
    first = doc.index("## Random 128 in / 64 out")
    second = doc.index("## Random 512 in / 128 out")
    assert first < second < doc.index("\n## Notes\n")
    assert doc.count("Ratios (radixserve / other") == 2
    # Each ratio table compares its own shape's runs only.
    assert "| 1 | 0.50x | n/a | n/a | 2.00x |" in doc[first:second]
    assert "| 1 | 3.00x | n/a | n/a | 0.50x |" in doc[second:]
    assert "| 8 | radixserve | 300.0 |" in doc[second:]
    assert "| 8 | radixserve | 300.0 |" not in doc[first:second]
    assert doc.count("](p.png)") == 1


def test_a_failed_run_names_its_shape(report: ModuleType) -> None:
    failed = {
        "workload": "random",
        "engine": "x",
        "concurrency": 1,
        "input_len": 512,
        "expected_output_len": 128,
        "error": "boom",
    }
    assert report.check_result(failed) == ["x (random 512:128, concurrency 1) failed: boom"]


def test_old_record_renders(compare: ModuleType, report: ModuleType, tmp_path: Path) -> None:
    """A record written before --shapes: one shape in the settings, none in the results."""
    results = []
    for concurrency in (1, 8):
        for engine, tok_s in ((report.RADIXSERVE, 120.0), (report.LLAMA_CPP, 100.0)):
            result = _result(engine, concurrency, tok_s, 30)
            assert "input_len" not in result
            results.append(result)
    record = {
        "meta": [["CPU", "test"]],
        "settings": {"input_len": 128, "output_len": 64, "hf_batches": 1},
        "results": results,
        "llama_bench": [],
        "radixserve_offline": {},
        "memory": [],
        "warnings": [],
    }
    record_path = tmp_path / "record.json"
    record_path.write_text(json.dumps(record))
    output, plot = tmp_path / "performance.md", tmp_path / "performance.png"
    compare.main(["--render-only", str(record_path), "--output", str(output), "--plot", str(plot)])
    doc = output.read_text()
    assert doc.count("## Random") == 1
    assert "## Random 128 in / 64 out" in doc
    assert "| 8 | radixserve | 120.0 |" in doc
    assert "| 1 | 1.20x |" in doc
    assert plot.stat().st_size > 1000
    # Without --plot the figure goes next to --output (docs/performance.png only by default).
    elsewhere = tmp_path / "other" / "report.md"
    elsewhere.parent.mkdir()
    compare.main(["--render-only", str(record_path), "--output", str(elsewhere)])
    assert (tmp_path / "other" / "report.png").stat().st_size > 1000
    assert compare.parse_arguments([]).plot == compare.REPO / "docs" / "performance.png"


def test_plot_has_a_panel_per_shape(report: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = report.plot_throughput(_two_shape_results(report), tmp_path / "plot.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_is_written(
    report: ModuleType, fake_results: list[dict[str, Any]], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    path = report.plot_throughput(fake_results, tmp_path / "plot.png")
    assert path is not None and path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.plot_throughput([], tmp_path / "none.png") is None


def _safetensors_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * 2048)
    return folder


def test_a_gguf_model_keeps_llama_cpp(compare: ModuleType, tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert compare.gguf_file_of(gguf) == gguf
    folder = tmp_path / "holds-one"
    folder.mkdir()
    (folder / "x.gguf").write_bytes(b"GGUF")
    assert compare.gguf_file_of(folder) == folder / "x.gguf"  # radixserve serves such a folder


def test_a_safetensors_folder_skips_llama_cpp_with_a_note(
    compare: ModuleType, report: ModuleType, tmp_path: Path
) -> None:
    folder = _safetensors_folder(tmp_path)
    assert compare.gguf_file_of(folder) is None
    settings = compare.resolve_settings(compare.parse_arguments(["--quick"]))
    kept, note = compare.skip_llama_cpp(folder, settings)
    assert kept.engines == [report.RADIXSERVE, report.HF_BF16, report.HF_FP32]
    assert "llama.cpp skipped" in note and "tiny-llama" in note
    jobs = compare.plan_jobs(kept)
    assert jobs and all(j.engine != report.LLAMA_CPP for j in jobs)
    assert report.RADIXSERVE_NO_RADIX in {j.engine for j in jobs}  # shared prefix still runs
    only_llama = compare.resolve_settings(compare.parse_arguments(["--engines", "llama.cpp"]))
    with pytest.raises(SystemExit, match="reads GGUF files only"):
        compare.skip_llama_cpp(folder, only_llama)
    assert compare.model_text(folder).startswith("tiny-llama/ (folder, ")
    doc = report.render_document([("CPU", "t")], [], {"notes": [note]}, [], [], [], None)
    assert f"**Note:** {note}" in doc


def test_measure_on_a_folder_runs_every_shape_without_llama_cpp(
    compare: ModuleType, report: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """measure() end to end with the runs faked: no llama.cpp build or job, a note, shaped
    results."""
    folder = _safetensors_folder(tmp_path)

    def no_build(*_: Any) -> None:
        raise AssertionError("llama.cpp must not be built for a model it cannot read")

    def fake_run(job: Any, pool: Any, settings: Any, timeout: float) -> dict[str, Any]:
        assert pool.model == folder and pool.gguf is None
        result = _result(job.engine, job.concurrency, 100, 10, workload=job.workload)
        return {**result, "input_len": job.shape.input_len} if job.shape else result

    monkeypatch.setattr(compare, "ensure_llama_cpp", no_build)
    monkeypatch.setattr(compare, "run_job", fake_run)
    argv = ["--quick", "--model-path", str(folder), "--run-dir", str(tmp_path / "run"),
            "--workloads", "random", "--engines", "radixserve", "llama.cpp",
            "--shapes", "32:8", "64:4"]  # fmt: skip
    args = compare.parse_arguments(argv)
    record = compare.measure(args, compare.resolve_settings(args))
    assert {r["engine"] for r in record["results"]} == {report.RADIXSERVE}
    assert [(r["input_len"], r["concurrency"]) for r in record["results"]] == [
        (32, 1), (32, 8), (64, 1), (64, 8)
    ]  # fmt: skip
    assert record["settings"]["shapes"] == [[32, 8], [64, 4]]
    assert "llama.cpp skipped" in record["settings"]["notes"][0]
    assert record["llama_bench"] == [] and record["radixserve_offline"] == {}
    written = json.loads((tmp_path / "run" / "record.json").read_text())
    assert written["results"] == record["results"]


def test_hf_runner_loads_a_gguf_or_a_folder(tmp_path: Path) -> None:
    hf_static = _load("hf_static")
    folder = _safetensors_folder(tmp_path)
    assert hf_static.pretrained_source(folder) == (str(folder), {})
    gguf = tmp_path / "m.gguf"
    assert hf_static.pretrained_source(gguf) == (str(tmp_path), {"gguf_file": "m.gguf"})
    old_flag = hf_static.parse_args(["--gguf", str(gguf)])
    assert old_flag.model == str(gguf)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_build_script_prints_cached_binaries() -> None:
    """Builds llama.cpp on first use (several minutes), then reuses the cached binaries."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is needed to build llama.cpp")
    done = subprocess.run(
        ["bash", str(BENCHMARKS / "build_llama_cpp.sh")],
        capture_output=True,
        text=True,
        timeout=3600,
        check=True,
    )
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    for key in ("LLAMA_SERVER", "LLAMA_BENCH"):
        assert Path(lines[key]).is_file()
    version = subprocess.run(
        [lines["LLAMA_SERVER"], "--version"], capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0


def test_busy_machine_warning(compare: ModuleType) -> None:
    assert compare.busy_machine_warning(None, 2) is None
    assert compare.busy_machine_warning((0.3, 0.2, 0.1), 2) is None
    warning = compare.busy_machine_warning((1.5, 1.0, 0.5), 2)
    assert warning is not None and "1.50" in warning


def test_hf_runs_whole_static_batches(compare: ModuleType, report: ModuleType) -> None:
    parser = compare.build_parser()
    settings = compare.resolve_settings(parser.parse_args(["--hf-batches", "2"]))
    jobs = {(j.engine, j.concurrency): j.num_prompts for j in compare.plan_jobs(settings)}
    assert jobs[(report.HF_BF16, 8)] == 16
    assert jobs[(report.HF_FP32, 64)] == 128
    assert jobs[(report.RADIXSERVE, 1)] == 8


def test_summary_metrics_drops_details_keeps_errors(compare: ModuleType) -> None:
    record = {"completed": 15, "output_lens": [64] * 15, "errors": ["", "boom\ntrace", ""]}
    record["server_info"] = {"x": 1}
    result: dict[str, Any] = {}
    assert compare.summary_metrics(record, result) == {"completed": 15}
    assert result["request_errors"] == ["boom"]
