"""kernel_summary names the instructions the kernels use on this CPU, not the option's name."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve.kernels import describe


class _Ext:
    def __init__(self, isas: list[str]) -> None:
        self._isas = isas

    def q8k_isas(self) -> list[str]:
        return self._isas


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
    assert describe.kernel_summary(True) == expected


def test_summary_without_the_build_or_fast_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    none: Any = None
    monkeypatch.setattr(describe, "load_extension", lambda: none)
    assert describe.kernel_summary(True) == "PyTorch fallbacks of the C++ kernels"
    assert describe.kernel_summary(False) == "reference PyTorch ops"
