"""Python keyword arguments (``Engine(model_path=..., **kwargs)``) -> {dest: value}.

Keywords are SGLang's dests. SGLang's deprecated spellings are accepted too, spelled as
keywords (``cuda_graph_max_bs=8``), with a DeprecationWarning; anything else is a TypeError.
"""

from __future__ import annotations

import difflib
import functools
import warnings
from collections.abc import Mapping
from typing import Any

from radixserve.options.registry import all_options, dest_table
from radixserve.options.spec import Kind, OptionSpec


@functools.cache
def _deprecated_by_kwarg() -> dict[str, OptionSpec]:
    return {spec.kwarg_name: spec for spec in all_options() if spec.is_deprecated}


def _is_primary_dest(key: str) -> bool:
    info = dest_table().get(key)
    return info is not None and not info.spec.is_deprecated


def _unknown(key: str) -> TypeError:
    known = [dest for dest in dest_table() if _is_primary_dest(dest)]
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return TypeError(f"unexpected keyword argument {key!r}{hint}")


def _apply_deprecated(spec: OptionSpec, key: str, value: Any, values: dict[str, Any]) -> None:
    if spec.kind is Kind.DEPRECATED_ALIAS:
        advice = f"use {spec.dest}= instead"
        if spec.value_map is not None and isinstance(value, str):
            value = spec.value_map.get(value, value)
        values[spec.dest] = value
    elif spec.kind is Kind.DEPRECATED_CONST:
        # An old flag that is its own dest (disable_cuda_graph) can only point at the new flags.
        new = spec.replacement if spec.dest == key else f"{spec.dest}={spec.const!r}"
        advice = f"use {new} instead"
        if value:
            values[spec.dest] = spec.const
    else:
        advice = spec.replacement or "it has no effect"
    warnings.warn(f"{key!r} is deprecated: {advice}", DeprecationWarning, stacklevel=4)


def kwargs_to_values(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Map keywords to dests; an explicit new spelling wins over a deprecated one."""
    values: dict[str, Any] = {}
    deprecated = _deprecated_by_kwarg()
    for key, value in kwargs.items():
        if not _is_primary_dest(key):
            if key not in deprecated:
                raise _unknown(key)
            _apply_deprecated(deprecated[key], key, value, values)
    values.update({key: value for key, value in kwargs.items() if _is_primary_dest(key)})
    return values
