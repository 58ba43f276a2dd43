"""The K-quant kernels on int8 activations, the per-row one (csrc/gguf_q8k.cpp) and the panel
GEMM (csrc/gguf_q8k_panel.cpp), in every variant this build has: exact Q8_K arithmetic (equal to
a float64 product of the rounded activations), a row's bits independent of its batch and of
the variant, and the startup choice of paths (layers/kquant_paths.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from radixserve.kernels import gguf_dequant, gguf_types, ops
from radixserve.kernels.build import load_extension
from radixserve.layers import kquant_paths
from radixserve.layers.quantization import GGUFLinearMethod, GGUFWeight, MethodLayer
from tests.helpers.tiny_gguf import random_blocks

Q8K_TYPES = sorted(gguf_types.Q8K_TYPES)
NEVER = kquant_paths.PANEL_NEVER


@pytest.fixture
def ext() -> Iterator[object]:
    """The extension with the process-wide K-quant switches restored after the test."""
    ext = load_extension()
    if ext is None or not ext.q8k_isas():
        pytest.skip("the Q8_K kernels are not built here (they need AVX2)")
    isa = ext.q8k_isa()
    yield ext
    ext.set_kquant_int8(False)
    ext.set_q8k_panel_min_rows(NEVER)
    ext.set_q8k_amx_min_rows(1)
    ext.set_q8k_isa(isa)


def q8k_round(x: torch.Tensor) -> torch.Tensor:
    """x with every 256 values rounded as the kernels quantize them (llama.cpp's Q8_K): int8
    codes of amax / 127, round half to even, in float32 arithmetic."""
    rows, k = x.shape
    blocks = x.reshape(rows, k // 256, 256)
    d = blocks.abs().amax(-1, keepdim=True) / 127.0
    inverse = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    return (torch.round(blocks * inverse).double() * d.double()).reshape(rows, k)


def panel(
    ext: object, isa: str, x: torch.Tensor, blocks: torch.Tensor, qtype: int, n: int
) -> torch.Tensor:
    ext.set_q8k_isa(isa)
    ext.set_q8k_panel_min_rows(1)
    ext.set_q8k_amx_min_rows(1)  # amx_int8: tiles at any row count
    try:
        return ops.gguf_linear(x, blocks, qtype, n)
    finally:
        ext.set_q8k_panel_min_rows(NEVER)


@pytest.mark.parametrize("qtype", Q8K_TYPES, ids=gguf_types.type_name)
@pytest.mark.parametrize("rows", [1, 5, 13, 40])
def test_panel_is_exact_q8k_arithmetic(ext: object, qtype: int, rows: int) -> None:
    """Every variant equals the float64 product of the Q8_K-rounded activations and the
    dequantized weights within float32 rounding (1e-5 of the largest output), on a width that is
    not a multiple of the panel (37 = 2 x 16 + 5) and more rows than one register tile."""
    n, k = 37, 768
    blocks = random_blocks(qtype, n, k, seed=rows)
    w = gguf_dequant.dequantize_rows(blocks, qtype, n).double()
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    expected = q8k_round(x) @ w.T
    scale = expected.abs().max().item()
    ext.set_kquant_int8(True)
    for isa in ext.q8k_isas():
        got = panel(ext, isa, x, blocks, qtype, n).double()
        assert (got - expected).abs().max().item() < 1e-5 * scale, isa
        # and the int8 rounding is really there: float inputs give a different product
        assert (got - x.double() @ w.T).abs().max().item() > 1e-4 * scale, isa
        one = ops.gguf_linear(x[:1].contiguous(), blocks, qtype, n).double()  # per-row kernel
        assert (one - expected[:1]).abs().max().item() < 1e-5 * scale, isa


@pytest.mark.parametrize("qtype", Q8K_TYPES, ids=gguf_types.type_name)
def test_a_row_has_the_same_bits_in_any_batch(ext: object, qtype: int) -> None:
    """The per-row kernels (few rows) and the panel (many rows), in every variant, give a row
    the same bits: a request's logits do not depend on what it is batched with, nor on the
    vector width the CPU runs them at."""
    n, k = 40, 512
    blocks = random_blocks(qtype, n, k, seed=3)
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(3))
    ext.set_kquant_int8(True)
    reference = None
    for isa in ext.q8k_isas():
        ext.set_q8k_isa(isa)
        alone = torch.cat([ops.gguf_linear(x[i : i + 1], blocks, qtype, n) for i in range(len(x))])
        three = ops.gguf_linear(x[:3].contiguous(), blocks, qtype, n)
        assert torch.equal(three, alone[:3]), isa
        for rows in (4, 7, 19, 33, 70):  # amx_int8: one or two tiles of 16 rows, partial ones
            got = panel(ext, isa, x[:rows].contiguous(), blocks, qtype, n)
            assert torch.equal(got, alone[:rows]), (isa, rows)
        reference = alone if reference is None else reference
        assert torch.equal(alone, reference), isa


@pytest.mark.parametrize("qtype", Q8K_TYPES, ids=gguf_types.type_name)
def test_extreme_activation_sums_stay_exact(ext: object, qtype: int) -> None:
    """Rows whose runs of 16 all quantize to +-127 give the largest per-16 sums (+-2032), the
    edge of the AMX kernel's bf16 split of the correction (64 h + l); with Q6_K's signed scales
    too, every variant still gives the per-row kernel's bits, on a K of 2048 (tile layout)."""
    n, k = 21, 2048
    blocks = random_blocks(qtype, n, k, seed=5)
    signs = torch.tensor([1.0, -1.0]).repeat_interleave(16).repeat(k // 32)
    x = torch.stack([torch.ones(k), -torch.ones(k), signs, -signs, torch.randn(k)] * 4)
    ext.set_kquant_int8(True)
    alone = torch.cat([ops.gguf_linear(x[i : i + 1], blocks, qtype, n) for i in range(len(x))])
    for isa in ext.q8k_isas():
        assert torch.equal(panel(ext, isa, x, blocks, qtype, n), alone), isa


def test_min_rows_switches_between_the_paths(ext: object) -> None:
    """Below q8k_panel_min_rows gguf_linear keeps its other paths (float tiles for 40 rows: no
    activation rounding), from it on the panel runs."""
    qtype, n, k = gguf_types.Q4_K, 32, 512
    blocks = random_blocks(qtype, n, k)
    w = gguf_dequant.dequantize_rows(blocks, qtype, n).double()
    x = torch.randn(40, k)
    ext.set_q8k_panel_min_rows(41)
    floats = ops.gguf_linear(x, blocks, qtype, n).double()
    assert (floats - x.double() @ w.T).abs().max().item() < 1e-5 * floats.abs().max().item()
    ext.set_q8k_panel_min_rows(40)
    assert torch.equal(
        ops.gguf_linear(x, blocks, qtype, n), panel(ext, ext.q8k_isa(), x, blocks, qtype, n)
    )


def test_unknown_variant_is_refused(ext: object) -> None:
    with pytest.raises(RuntimeError, match="no Q8_K kernels for sse2"):
        ext.set_q8k_isa("sse2")


class _Layer(MethodLayer):
    def __init__(self, weight: GGUFWeight) -> None:
        super().__init__()
        self.quant_method = GGUFLinearMethod(weight)


def _model(qtype: int = gguf_types.Q4_K, n: int = 64, k: int = 512) -> torch.nn.Module:
    blocks = random_blocks(qtype, n, k)
    return torch.nn.Sequential(_Layer(GGUFWeight(blocks=blocks, qtype=qtype, out_features=n)))


@pytest.mark.parametrize(
    ("mode", "int8", "min_rows"),
    [("1", True, kquant_paths.PANEL_MIN_ROWS), ("0", False, NEVER)],
)
def test_environment_forces_the_paths(
    ext: object, monkeypatch: pytest.MonkeyPatch, mode: str, int8: bool, min_rows: int
) -> None:
    monkeypatch.setenv(kquant_paths.KQUANT_INT8_ENV, mode)
    assert kquant_paths.choose_kquant_paths(_model(), (_Layer,), enabled=True) is int8
    assert ext.kquant_int8() is int8
    assert ext.q8k_panel_min_rows() == min_rows
    # "1" takes the tiles where this machine has them, from AMX_MIN_ROWS; "0" never
    with_tiles = mode == "1" and kquant_paths.AMX_ISA in ext.q8k_isas()
    assert (ext.q8k_isa() == kquant_paths.AMX_ISA) is with_tiles
    if with_tiles:
        assert ext.q8k_amx_min_rows() == kquant_paths.AMX_MIN_ROWS


def test_auto_measures_and_logs_its_choice(
    ext: object, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """auto sets both switches from timings (whatever they pick on this machine, the panel row
    count is one of the three documented values) and logs which paths run."""
    monkeypatch.delenv(kquant_paths.KQUANT_INT8_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger=kquant_paths.__name__):
        small = kquant_paths.choose_kquant_paths(_model(), (_Layer,), enabled=True)
    assert ext.kquant_int8() is small
    allowed = (kquant_paths.PANEL_MIN_ROWS, kquant_paths.PANEL_AFTER_SMALL_BATCHES, NEVER)
    assert ext.q8k_panel_min_rows() in allowed
    assert "for a few rows" in caplog.text and "measured" in caplog.text
    vector = [isa for isa in ext.q8k_isas() if isa != kquant_paths.AMX_ISA][-1]
    if ext.q8k_panel_min_rows() == NEVER:
        assert "measured no faster" in caplog.text
        assert ext.q8k_isa() == vector
    else:
        assert f"panel GEMM ({vector}) from {ext.q8k_panel_min_rows()} rows" in caplog.text
    if ext.q8k_isa() == kquant_paths.AMX_ISA:
        assert f"on AMX-INT8 tiles from {ext.q8k_amx_min_rows()} rows" in caplog.text
        allowed = (kquant_paths.AMX_MIN_ROWS, kquant_paths.AMX_AFTER_MID_BATCHES)
        assert ext.q8k_amx_min_rows() in allowed


def test_disabled_fast_kernels_leave_both_paths_off(
    ext: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(kquant_paths.KQUANT_INT8_ENV, "1")
    assert kquant_paths.choose_kquant_paths(_model(), (_Layer,), enabled=False) is False
    assert not ext.kquant_int8()
    assert ext.q8k_panel_min_rows() == NEVER


@pytest.mark.parametrize(
    ("panel_share_64", "panel_share_8", "expected"),
    [
        (0.3, 0.5, kquant_paths.PANEL_MIN_ROWS),  # faster at 64 and at 8 rows
        (0.3, 1.0, kquant_paths.PANEL_AFTER_SMALL_BATCHES),  # only at 64 rows
        (0.95, 0.5, NEVER),  # not 1.1x faster at 64 rows: never
    ],
)
def test_panel_rows_follow_the_timings(
    ext: object,
    monkeypatch: pytest.MonkeyPatch,
    panel_share_64: float,
    panel_share_8: float,
    expected: int,
) -> None:
    """The row count from which the panel runs, from its time against the other path's at 64
    and 8 rows (timings replaced here: the rule, not this machine, is under test)."""
    shares = iter([panel_share_64, panel_share_8])

    def fake_fastest(calls: dict, rounds: int) -> dict[str, float]:
        assert set(calls) == {"other", "panel"}
        return {"other": 1.0, "panel": next(shares)}

    monkeypatch.setattr(kquant_paths, "interleaved_fastest", fake_fastest)
    weight = _model().get_submodule("0").quant_method.gguf_weight()
    assert kquant_paths._panel_min_rows(ext, weight) == expected
    assert ext.q8k_panel_min_rows() == NEVER  # measuring leaves the switch off


@pytest.mark.parametrize(
    ("amx_share_128", "amx_share_64", "expected"),
    [
        (0.5, 0.8, kquant_paths.AMX_MIN_ROWS),  # faster at 128 and at 64 rows
        (0.5, 1.2, kquant_paths.AMX_AFTER_MID_BATCHES),  # only at 128 rows
        (0.95, 0.5, NEVER),  # not 1.1x faster at 128 rows: never
    ],
)
def test_amx_rows_follow_the_timings(
    ext: object,
    monkeypatch: pytest.MonkeyPatch,
    amx_share_128: float,
    amx_share_64: float,
    expected: int,
) -> None:
    """From how many rows the panel runs on AMX tiles, from their time against the vector
    panel's at 128 and 64 rows (timings replaced: the rule is under test); measuring leaves the
    vector variant selected."""
    if kquant_paths.AMX_ISA not in ext.q8k_isas():
        pytest.skip("no AMX-INT8 here (CPU or OS)")
    shares = iter([amx_share_128, amx_share_64])

    def fake_fastest(calls: dict, rounds: int) -> dict[str, float]:
        assert set(calls) == {"vector", "amx"}
        return {"vector": 1.0, "amx": next(shares)}

    monkeypatch.setattr(kquant_paths, "interleaved_fastest", fake_fastest)
    weight = _model().get_submodule("0").quant_method.gguf_weight()
    assert kquant_paths._amx_min_rows(ext, weight) == expected
    assert ext.q8k_isa() != kquant_paths.AMX_ISA
    assert ext.q8k_panel_min_rows() == NEVER


def test_deterministic_auto_decides_by_the_cpu_not_a_timing(
    ext: object, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under deterministic inference "auto" takes int8 exactly where the Q8_K kernels have a
    VNNI variant, with no timing (a timed choice could differ between starts or TP ranks)."""
    monkeypatch.delenv(kquant_paths.KQUANT_INT8_ENV, raising=False)

    def no_timing(*args: object) -> None:
        raise AssertionError("deterministic inference must not time the K-quant paths")

    monkeypatch.setattr(kquant_paths, "_measure", no_timing)
    vnni = any(isa != "avx2" for isa in ext.q8k_isas())
    with caplog.at_level(logging.INFO, logger=kquant_paths.__name__):
        small = kquant_paths.choose_kquant_paths(
            _model(), (_Layer,), enabled=True, deterministic=True
        )
    assert small is vnni and ext.kquant_int8() is vnni
    assert "deterministic inference" in caplog.text
