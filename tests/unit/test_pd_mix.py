"""benchmarks/pd_mix.py without servers: its arguments, the mixed schedule and the report maths."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from radixserve.benchmarking.metrics import RequestOutput

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def wl() -> ModuleType:
    return _load("pd_mix_workload")


@pytest.fixture(scope="module")
def cli() -> ModuleType:
    return _load("pd_mix")


def _mix(wl: ModuleType, **overrides: object) -> object:
    base = dict(
        duration_s=10.0,
        short_rate=2.0,
        short_input=8,
        short_output=4,
        long_interval_s=4.0,
        long_input=50,
        long_output=3,
        long_offset_s=1.0,
        seed=0,
    )
    base.update(overrides)
    return wl.MixConfig(**base)


def test_schedule_counts_times_and_lengths(wl: ModuleType) -> None:
    arrivals = wl.schedule(_mix(wl))
    shorts = [a for a in arrivals if a.kind == wl.SHORT]
    longs = [a for a in arrivals if a.kind == wl.LONG]
    assert [a.at_s for a in shorts] == [i / 2 for i in range(20)]
    assert [a.at_s for a in longs] == [1.0, 5.0, 9.0]
    assert [a.at_s for a in arrivals] == sorted(a.at_s for a in arrivals)
    assert {len(a.prompt) for a in shorts} == {8} and {a.output_len for a in shorts} == {4}
    assert {len(a.prompt) for a in longs} == {50} and {a.output_len for a in longs} == {3}
    low, high = wl.TOKEN_ID_RANGE
    assert all(low <= t <= high for a in arrivals for t in a.prompt)


def test_schedule_same_seed_same_prompts_other_seed_other(wl: ModuleType) -> None:
    first, again = wl.schedule(_mix(wl)), wl.schedule(_mix(wl))
    other = wl.schedule(_mix(wl, seed=1))
    assert first == again
    assert [a.prompt for a in first] != [a.prompt for a in other]
    # Random prompts: no two requests share a first token run long enough to hit the cache.
    assert len({a.prompt[:4] for a in first}) == len(first)


@pytest.mark.parametrize(
    "field,value", [("duration_s", 0.0), ("short_rate", -1.0), ("long_input", 0)]
)
def test_mix_config_refuses_bad_values(wl: ModuleType, field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        _mix(wl, **{field: value})


def _out(ttft: float, latency: float, tokens: int, ok: bool = True) -> RequestOutput:
    return RequestOutput(success=ok, ttft=ttft, latency=latency, output_len=tokens)


def test_summarize_kind_median_p90_and_tpot(wl: ModuleType) -> None:
    outputs = [_out(t / 10, t / 10 + 0.9, 10) for t in range(1, 11)]  # TPOT 0.1 s each
    outputs.append(_out(5.0, 9.0, 10, ok=False))  # a failure counts as sent, not measured
    outputs.append(_out(0.05, 0.05, 1))  # one token: a TTFT but no TPOT
    s = wl.summarize_kind("short", outputs)
    assert (s.sent, s.completed) == (12, 11)
    ttfts = sorted([t * 100 for t in range(1, 11)] + [50])
    assert s.ttft_median_ms == pytest.approx(ttfts[5])
    assert s.ttft_p90_ms == pytest.approx(ttfts[9])  # numpy's linear rule lands on a sample here
    assert s.tpot_median_ms == pytest.approx(100.0) and s.tpot_p90_ms == pytest.approx(100.0)


def test_summarize_kind_with_nothing_done(wl: ModuleType) -> None:
    s = wl.summarize_kind("long", [_out(1, 2, 3, ok=False)])
    assert s.completed == 0 and s.ttft_median_ms is None and s.tpot_p90_ms is None


def test_summarize_run_splits_kinds_and_counts_throughput(wl: ModuleType) -> None:
    arrivals = wl.schedule(_mix(wl, duration_s=2.0, long_offset_s=0.2))  # 4 short, 1 long
    kinds = [a.kind for a in arrivals]
    outputs = [_out(2.0 if k == wl.LONG else 0.1, 3.0, 3 if k == wl.LONG else 4) for k in kinds]
    run = wl.summarize_run("pd", 1, arrivals, outputs, 4.0, (1.5, 2.5))
    assert (run.short.sent, run.long.sent) == (4, 1)
    assert run.long.ttft_median_ms == pytest.approx(2000.0)
    assert run.short.ttft_median_ms == pytest.approx(100.0)
    assert run.output_tokens_per_s == pytest.approx((4 * 4 + 3) / 4.0)
    assert run.requests_per_s == pytest.approx(5 / 4.0)
    table = wl.markdown_table([run]).splitlines()
    assert len({line.count("|") for line in table}) == 1  # every row has the header's columns
    assert "| pd | 1 | 100 / 100 |" in table[2] and "1.5 → 2.5" in table[2]
    with pytest.raises(ValueError, match="arrivals"):
        wl.summarize_run("pd", 1, arrivals, outputs[:-1], 4.0, (0.0, 0.0))


def test_args_defaults_and_errors(cli: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.parse_args([])
    assert args.configs == ["single", "pd", "router2"] and args.cores == [0, 1]
    assert args.mix.long_input == 1500 and args.mix.short_output == 64
    assert cli.parse_args(["--cores", "2-3"]).cores == [2, 3]
    bad_args = {
        ("--cores", "0"): "--cores",
        ("--cores", "1,1"): "--cores",
        ("--cores", "x"): "--cores",
        ("--duration", "0"): "duration_s must be positive",
        ("--repeats", "0"): "--repeats",
    }
    for bad, message in bad_args.items():
        with pytest.raises(SystemExit) as exc:
            cli.parse_args(list(bad))
        assert exc.value.code == 2
        assert message in capsys.readouterr().err.splitlines()[-1]
    with pytest.raises(SystemExit):
        cli.parse_args(["--configs", "tp2"])
