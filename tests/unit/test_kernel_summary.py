"""kernel_summary names the instructions the kernels use on this CPU, not the option's name."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve.kernels import describe


class _Ext:
    def __init__(self, isas: list[str], tiled: bool = True, amx_bf16: bool = False) -> None:
        self._isas = isas
        self._tiled = tiled
        self._amx_bf16 = amx_bf16

    def q8k_isas(self) -> list[str]:
        return self._isas

    def gguf_tiled_enabled(self) -> bool:
        return self._tiled

    def gguf_tiled_amx_enabled(self) -> bool:
        return self._amx_bf16


@pytest.mark.parametrize(
    ("isas", "expected"),
    [
        (["avx2"], "radixserve C++ kernels: avx2, no AMX"),  # Zen 1-3
        (["avx2", "avx512_vnni"], "radixserve C++ kernels: avx512_vnni, no AMX"),
        (["avx2", "avx512_vnni", "amx_int8"], "radixserve C++ kernels: avx512_vnni, AMX tiles"),
    ],
)
def test_summary_names_the_widest_vector_isa_and_tiles(
    monkeypatch: pytest.MonkeyPatch, isas: list[str], expected: str
) -> None:
    monkeypatch.setattr(describe, "load_extension", lambda: _Ext(isas))
    assert describe.kernel_summary(True) == f"{expected}, Q4_1/Q8_0 GEMM fp32 tiles"


@pytest.mark.parametrize(
    ("tiled", "amx_bf16", "gemm"),
    [
        (True, True, "amx_bf16"),  # AMX-BF16 built, granted and enabled
        (True, False, "fp32 tiles"),  # no AMX-BF16, or set_gguf_amx_bf16(False)
        (False, True, "int16 rows"),  # --enable-deterministic-inference: no many-row path
    ],
)
def test_summary_names_the_legacy_gguf_gemm(
    monkeypatch: pytest.MonkeyPatch, tiled: bool, amx_bf16: bool, gemm: str
) -> None:
    ext = _Ext(["avx2", "avx512_vnni", "amx_int8"], tiled=tiled, amx_bf16=amx_bf16)
    monkeypatch.setattr(describe, "load_extension", lambda: ext)
    assert describe.kernel_summary(True).endswith(f", Q4_1/Q8_0 GEMM {gemm}")


def test_summary_without_the_build_or_fast_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    none: Any = None
    monkeypatch.setattr(describe, "load_extension", lambda: none)
    assert describe.kernel_summary(True) == "PyTorch fallbacks of the C++ kernels"
    assert describe.kernel_summary(False) == "reference PyTorch ops"
