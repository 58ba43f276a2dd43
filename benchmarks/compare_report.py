"""The pure half of benchmarks/compare.py: results -> ratios, markdown tables, the plot.

No servers, no subprocesses: everything here takes plain dicts, so tests can feed it fakes.
A result is a dict with "workload", "engine", "concurrency", "expected_output_len" and either
"metrics" (SGLang bench_serving's field names) or "error" (a string). A random result also has
"input_len": with "expected_output_len" its shape. Records written before compare.py took several
shapes lack it; their one input length is in the settings ("input_len").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

RANDOM = "random"
SHARED_PREFIX = "shared-prefix"

RADIXSERVE = "radixserve"
RADIXSERVE_NO_RADIX = "radixserve --disable-radix-cache"
LLAMA_CPP = "llama.cpp"
HF_BF16 = "hf-bfloat16"
HF_FP32 = "hf-float32"

NOTES_HEADER = "## Notes"
DEFAULT_NOTES = (
    f"{NOTES_HEADER}\n\n"
    "(Text below this header is kept when compare.py rewrites this file: add analysis here.)\n"
)

Result = dict[str, Any]


class Shape(NamedTuple):
    """A random workload's prompt and output lengths, in tokens."""

    input_len: int
    output_len: int

    def __str__(self) -> str:
        return f"{self.input_len}:{self.output_len}"


def result_shape(result: Result, settings_input_len: int | None = None) -> Shape | None:
    """A random result's shape; an old record's results take the input length from its settings
    (`settings_input_len`). None when neither says (not a random result, or a bare fake)."""
    input_len = result.get("input_len", settings_input_len)
    output_len = result.get("expected_output_len")
    if input_len is None or output_len is None:
        return None
    return Shape(int(input_len), int(output_len))


def random_groups(
    results: Sequence[Result], settings_input_len: int | None = None
) -> list[tuple[Shape | None, list[Result]]]:
    """The random results split by shape, in the order the shapes first ran (the plan's order)."""
    groups: dict[Shape | None, list[Result]] = {}
    for result in results:
        if result["workload"] == RANDOM:
            shape = result_shape(result, settings_input_len)
            groups.setdefault(shape, []).append(result)
    return list(groups.items())


def shape_title(shape: Shape | None) -> str:
    if shape is None:
        return "Random prompts"
    return f"Random {shape.input_len} in / {shape.output_len} out"


def metric(result: Result | None, name: str) -> float | None:
    """A finite metric of a result, or None (missing result, failed run, missing field)."""
    if not result or "metrics" not in result:
        return None
    value = result["metrics"].get(name)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return None
    return float(value)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def find(
    results: Iterable[Result], workload: str, engine: str, concurrency: int | None = None
) -> Result | None:
    for result in results:
        if result["workload"] != workload or result["engine"] != engine:
            continue
        if concurrency is None or result["concurrency"] == concurrency:
            return result
    return None


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: bool = True
) -> str:
    """A GitHub markdown table; the first column left-aligned, the others right-aligned when
    `numeric` (left-aligned otherwise)."""
    align = [":---"] + [("---:" if numeric else ":---")] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def mean_output_len(result: Result | None) -> float | None:
    completed = metric(result, "completed")
    total = metric(result, "total_output_tokens")
    return ratio(total, completed)


def check_result(result: Result, num_prompts: int | None = None) -> list[str]:
    """Warnings about a result that does not measure what it should (failures, short outputs)."""
    workload = result["workload"]
    if workload == RANDOM and "input_len" in result:
        workload += f" {result_shape(result)}"  # which of several shapes
    name = f"{result['engine']} ({workload}, concurrency {result['concurrency']})"
    if "error" in result:
        return [f"{name} failed: {result['error']}"]
    warnings = []
    completed = metric(result, "completed") or 0
    expected_prompts = num_prompts or result.get("num_prompts")
    if expected_prompts and completed < expected_prompts:
        first = (result.get("request_errors") or ["no error message recorded"])[0]
        warnings.append(
            f"{name}: only {completed:.0f} of {expected_prompts} requests completed "
            f"(first error: {first})"
        )
    expected_len = result.get("expected_output_len")
    produced = mean_output_len(result)
    if expected_len and produced is not None and abs(produced - expected_len) > 0.5:
        warnings.append(
            f"{name}: {produced:.1f} output tokens per request on average, not {expected_len}"
        )
    return warnings


def engines_in(results: Iterable[Result], workload: str) -> list[str]:
    seen: list[str] = []
    for result in results:
        if result["workload"] == workload and result["engine"] not in seen:
            seen.append(result["engine"])
    return seen


def concurrencies_in(results: Iterable[Result], workload: str) -> list[int]:
    return sorted({r["concurrency"] for r in results if r["workload"] == workload})


def random_table(results: Sequence[Result]) -> str:
    headers = [
        "Concurrency",
        "Engine",
        "Output tok/s",
        "Req/s",
        "Mean TTFT (ms)",
        "Mean TPOT (ms)",
        "Mean E2E (ms)",
        "Out tokens/req",
        "Completed",
    ]
    rows = []
    for concurrency in concurrencies_in(results, RANDOM):
        for engine in engines_in(results, RANDOM):
            result = find(results, RANDOM, engine, concurrency)
            if result is None:
                continue
            rows.append(
                [
                    str(concurrency),
                    engine,
                    fmt(metric(result, "output_throughput")),
                    fmt(metric(result, "request_throughput"), 2),
                    fmt(metric(result, "mean_ttft_ms")),
                    fmt(metric(result, "mean_tpot_ms"), 2),
                    fmt(metric(result, "mean_e2e_latency_ms")),
                    fmt(mean_output_len(result)),
                    "failed" if "error" in result else fmt(metric(result, "completed"), 0),
                ]
            )
    return render_table(headers, rows)


def random_ratio_rows(results: Sequence[Result]) -> list[dict[str, Any]]:
    """Per concurrency: radixserve's output tok/s over each anchor's, and its TTFT ratio."""
    rows = []
    for concurrency in concurrencies_in(results, RANDOM):
        ours = find(results, RANDOM, RADIXSERVE, concurrency)
        row: dict[str, Any] = {"concurrency": concurrency}
        for anchor in (LLAMA_CPP, HF_BF16, HF_FP32):
            theirs = find(results, RANDOM, anchor, concurrency)
            row[f"throughput_vs_{anchor}"] = ratio(
                metric(ours, "output_throughput"), metric(theirs, "output_throughput")
            )
        llama = find(results, RANDOM, LLAMA_CPP, concurrency)
        row[f"ttft_vs_{LLAMA_CPP}"] = ratio(
            metric(ours, "mean_ttft_ms"), metric(llama, "mean_ttft_ms")
        )
        row[f"tpot_vs_{LLAMA_CPP}"] = ratio(
            metric(ours, "mean_tpot_ms"), metric(llama, "mean_tpot_ms")
        )
        rows.append(row)
    return rows


def random_ratio_table(results: Sequence[Result]) -> str:
    headers = [
        "Concurrency",
        "tok/s vs llama.cpp",
        "tok/s vs HF bf16",
        "tok/s vs HF fp32",
        "TTFT vs llama.cpp",
        "TPOT vs llama.cpp",
    ]
    rows = [
        [
            str(row["concurrency"]),
            fmt_ratio(row[f"throughput_vs_{LLAMA_CPP}"]),
            fmt_ratio(row[f"throughput_vs_{HF_BF16}"]),
            fmt_ratio(row[f"throughput_vs_{HF_FP32}"]),
            fmt_ratio(row[f"ttft_vs_{LLAMA_CPP}"]),
            fmt_ratio(row[f"tpot_vs_{LLAMA_CPP}"]),
        ]
        for row in random_ratio_rows(results)
    ]
    return render_table(headers, rows)


def shared_prefix_table(results: Sequence[Result]) -> str:
    headers = [
        "Engine",
        "Mean TTFT (ms)",
        "Median TTFT (ms)",
        "P99 TTFT (ms)",
        "TTFT vs radixserve",
        "Output tok/s",
        "Cache hit rate",
        "Completed",
    ]
    ours = metric(find(results, SHARED_PREFIX, RADIXSERVE), "mean_ttft_ms")
    rows = []
    for engine in engines_in(results, SHARED_PREFIX):
        result = find(results, SHARED_PREFIX, engine)
        hit = metric(result, "cache_hit_rate")
        rows.append(
            [
                engine,
                fmt(metric(result, "mean_ttft_ms")),
                fmt(metric(result, "median_ttft_ms")),
                fmt(metric(result, "p99_ttft_ms")),
                fmt_ratio(ratio(metric(result, "mean_ttft_ms"), ours)),
                fmt(metric(result, "output_throughput")),
                "n/a" if hit is None else f"{hit:.0%}",
                "failed"
                if result is None or "error" in result
                else fmt(metric(result, "completed"), 0),
            ]
        )
    return render_table(headers, rows)


def llama_bench_table(entries: Sequence[dict[str, Any]]) -> str:
    """llama-bench -o json entries -> | test | t/s |."""
    rows = []
    for entry in entries:
        rows.append(
            [
                llama_bench_test(entry),
                str(entry.get("n_threads", "")),
                fmt(entry.get("avg_ts"), 1),
                fmt(entry.get("stddev_ts"), 1),
            ]
        )
    return render_table(["Test", "Threads", "Tokens/s", "Std dev"], rows)


def llama_bench_test(entry: dict[str, Any]) -> str:
    """llama-bench's name for an entry's test: ppN for a prompt of N tokens, else tgN."""
    n_prompt, n_gen = int(entry.get("n_prompt", 0)), int(entry.get("n_gen", 0))
    return f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"


def offline_table(llama_bench: Sequence[dict[str, Any]], offline: dict[str, float]) -> str:
    """| test | llama-bench | radixserve | ratio | for the tests both measured."""
    theirs = {llama_bench_test(entry): entry.get("avg_ts") for entry in llama_bench}
    rows = []
    for test, ours in offline.items():
        other = theirs.get(test)
        ratio = f"{ours / other:.2f}x" if other else "n/a"
        rows.append([test, fmt(other, 1), fmt(ours, 1), ratio])
    return render_table(
        ["Test", "llama-bench tok/s", "radixserve tok/s", "radixserve / llama.cpp"], rows
    )


def key_value_table(items: Sequence[tuple[str, str]]) -> str:
    return render_table(["", ""], [[k, v] for k, v in items], numeric=False)


def split_notes(existing: str | None) -> str:
    """The '## Notes' section of an earlier performance.md (kept verbatim), or a fresh one."""
    if not existing:
        return DEFAULT_NOTES
    positions = _header_positions(existing)
    return existing[positions[0] :].rstrip() + "\n" if positions else DEFAULT_NOTES


def _header_positions(text: str) -> list[int]:
    """Offsets of the lines that are exactly the notes header (trailing blanks allowed)."""
    positions, offset = [], 0
    for line in text.splitlines(keepends=True):
        if line.rstrip() == NOTES_HEADER:
            positions.append(offset)
        offset += len(line)
    return positions


def render_document(
    meta: Sequence[tuple[str, str]],
    results: Sequence[Result],
    settings: dict[str, Any],
    llama_bench: Sequence[dict[str, Any]],
    memory: Sequence[tuple[str, str]],
    warnings: Sequence[str],
    plot_name: str | None,
    existing: str | None = None,
    offline: dict[str, float] | None = None,
) -> str:
    parts = [
        "# Performance: radixserve vs llama.cpp vs HF transformers",
        "",
        "Written by `benchmarks/compare.py`; rerun it to refresh everything above "
        f"`{NOTES_HEADER}`. Same model file for all engines, same prompts for the two "
        "servers (SGLang's `bench_serving` generator: `radixserve.bench_serving`), engines run "
        "back to back for each workload, shape and concurrency so machine noise hits them alike.",
        "",
        # Why an engine is missing (e.g. llama.cpp on a safetensors folder); old records have none.
        *[f"**Note:** {note}\n" for note in settings.get("notes") or []],
        "## Machine and versions",
        "",
        key_value_table(meta),
        "",
    ]
    parts += random_sections(results, settings, plot_name)
    if any(r["workload"] == SHARED_PREFIX for r in results):
        parts += [
            "## Shared prefix",
            "",
            settings.get("shared_prefix_text", ""),
            "",
            shared_prefix_table(results),
            "",
        ]
    if llama_bench:
        parts += [
            "## llama-bench",
            "",
            f"`{settings.get('llama_bench_command', 'llama-bench')}`",
            "",
            llama_bench_table(llama_bench),
            "",
        ]
        if offline:
            parts += [
                "radixserve in the same shapes, right after it (`radixserve.bench_one_batch` "
                "with the radixserve args above, batch 1: pp512 a 512-token prefill, tg128 128 "
                "decode steps from a 1-token prompt, every step counted):",
                "",
                offline_table(llama_bench, offline),
                "",
            ]
    if memory:
        parts += ["## Memory (idle, after startup)", "", key_value_table(memory), ""]
    if warnings:
        parts += ["## Warnings", ""] + [f"- {w}" for w in warnings] + [""]
    parts.append(split_notes(existing))
    return "\n".join(parts)


def random_sections(
    results: Sequence[Result], settings: dict[str, Any], plot_name: str | None
) -> list[str]:
    """One section per random shape: its engines x concurrencies table and its ratio table. The
    method is described once, in the first; the plot (a panel per shape) follows the last."""
    groups = random_groups(results, settings.get("input_len"))
    parts: list[str] = []
    for index, (shape, group) in enumerate(groups):
        parts += [f"## {shape_title(shape)}", ""]
        parts += [random_method_text(settings) if index == 0 else "Same method as above.", ""]
        parts += [
            random_table(group),
            "",
            "Ratios (radixserve / other; > 1 means radixserve is faster for tok/s, slower for "
            "TTFT/TPOT):",
            "",
            random_ratio_table(group),
            "",
        ]
    if groups and plot_name:
        parts += [f"![output tok/s vs concurrency]({plot_name})", ""]
    return parts


def random_method_text(settings: dict[str, Any]) -> str:
    return (
        "Servers: continuous batching, `--max-concurrency` = concurrency, "
        f"{settings.get('num_prompts_text', '')}. HF transformers: "
        f"{settings.get('hf_batches', 1)} static batch(es) of `concurrency` prompts through "
        "`model.generate` (greedy, min = max new tokens, a GGUF's weights dequantized); "
        "its TTFT is the batch's prefill and its latency the batch's. torch's bfloat16 "
        "matmuls are slow fallbacks on CPUs without avx512_bf16/AMX, hence the float32 row."
    )


def plot_throughput(
    results: Sequence[Result], path: Path, settings_input_len: int | None = None
) -> Path | None:
    """Output tok/s vs concurrency per engine, a panel per random shape (their throughputs differ
    by too much to share an axis), plus shared-prefix TTFT bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = random_groups(results, settings_input_len)
    shared = [r for r in results if r["workload"] == SHARED_PREFIX and "metrics" in r]
    panels = len(groups) + (1 if shared else 0)
    if not panels:
        return None
    columns = min(panels, 2)
    rows = math.ceil(panels / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns + 1, 4.5 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    # One colour per engine in every panel, so a line reads the same across shapes.
    colours = {engine: f"C{i}" for i, engine in enumerate(engines_in(results, RANDOM))}
    for ax, (shape, group) in zip(flat, groups, strict=False):
        _throughput_axis(ax, group, shape, colours)
    if shared:
        _shared_prefix_axis(flat[len(groups)], shared)
    for ax in flat[panels:]:
        ax.set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _throughput_axis(
    ax: Any, results: Sequence[Result], shape: Shape | None, colours: dict[str, str]
) -> None:
    ticks = concurrencies_in(results, RANDOM)
    for engine in engines_in(results, RANDOM):
        points = [(c, metric(find(results, RANDOM, engine, c), "output_throughput")) for c in ticks]
        xs = [c for c, v in points if v is not None]
        ys = [v for _, v in points if v is not None]
        if xs:
            ax.plot(xs, ys, marker="o", label=engine, color=colours.get(engine))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{shape_title(shape)}: output throughput")
    ax.grid(True, alpha=0.3)
    if ax.lines:  # every run of this shape failed: no legend to draw
        ax.legend()


def _shared_prefix_axis(ax: Any, shared: Sequence[Result]) -> None:
    names = [r["engine"] for r in shared]
    values = [metric(r, "mean_ttft_ms") or 0.0 for r in shared]
    ax.bar(range(len(names)), values, color="tab:orange")
    ax.set_xticks(range(len(names)), [n.replace(" --", "\n--") for n in names], fontsize=8)
    ax.set_ylabel("mean TTFT (ms)")
    ax.set_title("Shared prefix: mean time to first token")
    ax.grid(True, axis="y", alpha=0.3)
