"""The one ordered table of every option, assembled from the area modules.

Lookups by option string and by dest live here so that the parser, the config file reader,
ServerArgs and the docs generator all agree on what exists.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from typing import Any, NamedTuple

from radixserve.options import (
    cache,
    cuda_graph,
    deprecated,
    device,
    disaggregation,
    http_api,
    kernels,
    logging_metrics,
    lora,
    mamba,
    misc,
    model,
    moe,
    multimodal,
    parallel,
    quantization,
    scheduling,
    speculative,
    weights,
)
from radixserve.options.spec import NOT_APPLICABLE, Kind, OptionSpec, Support

# Order of the groups in --help and docs/options.md: what most users touch first.
_AREA_MODULES: tuple[ModuleType, ...] = (
    model,
    quantization,
    scheduling,
    parallel,
    device,
    http_api,
    logging_metrics,
    kernels,
    cuda_graph,
    speculative,
    moe,
    mamba,
    cache,
    multimodal,
    lora,
    disaggregation,
    weights,
    misc,
    deprecated,
)


class DestInfo(NamedTuple):
    """What a dest (a ServerArgs attribute) defaults to and how well it is supported."""

    default: Any
    support: Support
    spec: OptionSpec


def _stamp(module: ModuleType) -> list[OptionSpec]:
    return [dataclasses.replace(spec, area=module.AREA) for spec in module.OPTIONS]


def _dest_info(
    primary: list[OptionSpec], deprecated_specs: list[OptionSpec]
) -> dict[str, DestInfo]:
    info = {spec.dest: DestInfo(spec.default, spec.support, spec) for spec in primary}
    for spec in deprecated_specs:
        if spec.kind is Kind.DEPRECATED_NOOP or spec.dest in info:
            continue
        # An old flag whose target has no option of its own (SGLang's --disable-cuda-graph).
        default = False if spec.const is True else None
        info[spec.dest] = DestInfo(default, NOT_APPLICABLE, spec)
    return info


@functools.cache
def _build() -> tuple[tuple[OptionSpec, ...], dict[str, DestInfo]]:
    specs = [spec for module in _AREA_MODULES for spec in _stamp(module)]
    primary = [spec for spec in specs if not spec.is_deprecated]
    old = [spec for spec in specs if spec.is_deprecated]
    info = _dest_info(primary, old)
    old = [_with_target_support(spec, info) for spec in old]
    _check_unique(primary + old)
    return tuple(primary + old), info


def _with_target_support(spec: OptionSpec, info: dict[str, DestInfo]) -> OptionSpec:
    # A deprecated spelling is exactly as supported as the option it stands for; one that
    # stores nothing has no effect at all.
    target = info.get(spec.dest)
    support = target.support if target is not None else NOT_APPLICABLE
    return dataclasses.replace(spec, support=support)


def _check_unique(specs: list[OptionSpec]) -> None:
    seen: dict[str, str] = {}
    for spec in specs:
        for option in spec.option_strings:
            if option in seen:
                raise ValueError(f"option {option} declared twice ({seen[option]}, {spec.area})")
            seen[option] = spec.area


def all_options() -> tuple[OptionSpec, ...]:
    """Every option in help order: primary options by area, then deprecated spellings."""
    return _build()[0]


def areas() -> tuple[str, ...]:
    """Area titles in help order."""
    return tuple(module.AREA for module in _AREA_MODULES)


@functools.cache
def by_option_string() -> Mapping[str, OptionSpec]:
    """Every accepted spelling (aliases included, ``--no-x`` excluded) to its spec."""
    return MappingProxyType({s: spec for spec in all_options() for s in spec.option_strings})


def dest_table() -> Mapping[str, DestInfo]:
    """Every dest that holds a value, with its default and support level."""
    return MappingProxyType(_build()[1])


def spec_for_dest(dest: str) -> OptionSpec:
    """The primary spec that owns ``dest``; KeyError when no option stores into it."""
    return _build()[1][dest].spec


def defaults() -> dict[str, Any]:
    """A fresh dict of dest -> default value for every dest."""
    return {dest: info.default for dest, info in _build()[1].items()}
