"""What a request asks the grammar layer for: ``GrammarSpec``, ``GrammarError`` and the mapping
from SGLang's sampling parameters (``regex`` / ``json_schema`` / ``ebnf`` / ``structural_tag``).

SGLang's conventions, kept here:
- ``json_schema == "$$ANY$$"`` means *any JSON value* (SGLang compiles xgrammar's builtin JSON
  grammar, which also allows an array or a scalar at the root).
- OpenAI's ``response_format={"type": "json_object"}`` means *any JSON object*; SGLang sends it
  as ``json_schema='{"type": "object"}'``. Here that request is ``GrammarSpec("json_object")``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixserve.errors import InvalidRequestError

if TYPE_CHECKING:
    from radixserve.sampling.sampling_params import SamplingParams

# SGLang's sentinel for "any JSON value" in the json_schema field.
ANY_JSON = "$$ANY$$"
# The schema OpenAI's json_object mode stands for (what SGLang sends for it).
JSON_OBJECT_SCHEMA = '{"type": "object"}'

GRAMMAR_KINDS = ("json_schema", "json_object", "regex", "ebnf", "structural_tag")
# The request parameter an error about each kind names (json_object arrives as json_schema).
_PARAM_OF_KIND = {
    "json_schema": "json_schema",
    "json_object": "json_schema",
    "regex": "regex",
    "ebnf": "ebnf",
    "structural_tag": "structural_tag",
}
# Grammar libraries prefix C++ errors with "[hh:mm:ss] /path/file.cc:123: Check failed: (...) is
# false: "; a client only needs the reason after it.
_NATIVE_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*(Check failed:.*?is false:\s*)?")


class GrammarError(InvalidRequestError):
    """A grammar that cannot be used: invalid regex / schema / EBNF / structural tag, a feature
    the chosen backend lacks, or a compile that took too long. The API layer reports it as a
    400 naming ``param``."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message, param)


@dataclass(frozen=True)
class GrammarSpec:
    """One grammar request; hashable, so it is also the compile-cache key.

    ``kind`` is one of ``GRAMMAR_KINDS``; ``value`` is the schema JSON text, the regex or the
    grammar text (ignored for ``json_object``, which is normalised to ``""``).
    """

    kind: str
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(
                f"GrammarSpec.kind must be one of {', '.join(GRAMMAR_KINDS)}; got {self.kind!r}."
            )
        if not isinstance(self.value, str):
            raise GrammarError(
                f"{self.param} must be a string, got {type(self.value).__name__}.", self.param
            )
        if self.kind == "json_object" and self.value:
            object.__setattr__(self, "value", "")

    @property
    def param(self) -> str:
        """The request parameter an error about this grammar names."""
        return _PARAM_OF_KIND[self.kind]

    @property
    def is_any_json(self) -> bool:
        return self.kind == "json_schema" and self.value == ANY_JSON


def spec_from_sampling_params(params: SamplingParams) -> GrammarSpec | None:
    """The grammar a request's sampling parameters ask for, or None when unconstrained.

    At most one of regex / json_schema / ebnf may be set (``SamplingParams.verify`` checks it,
    checked again here so a caller that skipped it gets a clear error); ``structural_tag`` is
    used only when none of them is, as in SGLang."""
    chosen = [
        (kind, getattr(params, kind))
        for kind in ("json_schema", "regex", "ebnf")
        if getattr(params, kind, None) is not None
    ]
    if len(chosen) > 1:
        raise GrammarError("Only one of regex, json_schema, or ebnf can be set.", chosen[1][0])
    if chosen:
        kind, value = chosen[0]
        return GrammarSpec(kind, value)
    tag = getattr(params, "structural_tag", None)
    if tag is not None:
        return GrammarSpec("structural_tag", tag)
    return None


def parse_json_schema(spec: GrammarSpec) -> Any:
    """The schema of a ``json_schema`` spec as Python data; raises GrammarError when it is not
    JSON or not a schema (an object or a boolean)."""
    try:
        schema = json.loads(spec.value)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise GrammarError(f"json_schema is not valid JSON: {exc}", spec.param) from exc
    if not isinstance(schema, dict | bool):
        raise GrammarError(
            f"json_schema must be a JSON object (a JSON Schema), got {type(schema).__name__}.",
            spec.param,
        )
    return schema


def parse_structural_tag(spec: GrammarSpec) -> dict[str, Any]:
    """The structural tag as a dict; raises GrammarError when it is not a JSON object."""
    try:
        tag = json.loads(spec.value)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise GrammarError(f"structural_tag is not valid JSON: {exc}", spec.param) from exc
    if not isinstance(tag, dict):
        raise GrammarError("structural_tag must be a JSON object.", spec.param)
    return tag


def is_legacy_structural_tag(tag: dict[str, Any]) -> bool:
    """SGLang's original shape: {"structures": [{"begin", "schema", "end"}], "triggers": [...]}
    (the newer xgrammar shape is {"type": "structural_tag", "format": {...}})."""
    return "structures" in tag and "triggers" in tag


def clean_native_error(exc: BaseException) -> str:
    """A library's error text without the native file/line prefix, on one line."""
    text = str(exc).strip()
    text = _NATIVE_PREFIX.sub("", text)
    return " ".join(text.split()) or type(exc).__name__


def invalid(spec: GrammarSpec, exc: BaseException, what: str | None = None) -> GrammarError:
    """The GrammarError for a library that rejected ``spec``."""
    label = what or {"json_object": "json_schema"}.get(spec.kind, spec.kind)
    return GrammarError(f"Invalid {label}: {clean_native_error(exc)}", spec.param)


def unsupported(spec: GrammarSpec, backend: str, hint: str = "") -> GrammarError:
    """The GrammarError for a kind of grammar a backend cannot express."""
    extra = f" {hint}" if hint else ""
    return GrammarError(
        f"The {backend} grammar backend does not support {spec.param} constraints.{extra}",
        spec.param,
    )
