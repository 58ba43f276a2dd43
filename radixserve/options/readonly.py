"""A read-only, picklable mapping (MappingProxyType cannot cross a process boundary)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class ReadOnlyMapping(Mapping[str, Any]):
    """An immutable view over a private dict copy; pickles as its contents."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data = dict(data or {})

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"ReadOnlyMapping({self._data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ReadOnlyMapping, (self._data,))
