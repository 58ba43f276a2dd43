"""Per-request sampling parameters, named, defaulted and validated as SGLang does.

Validation happens in two places, like SGLang: construction (``__post_init__``, reached by
``from_dict`` too) checks types and normalises shapes (a single stop string becomes a list,
JSON's string keys in ``logit_bias`` become ints); ``verify(vocab_size)`` checks value ranges
that the API layer reports as a 400. Every failure is a ``SamplingParamsError`` whose ``param``
names the offending field.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from radixserve.errors import InvalidRequestError

# Below this a temperature means greedy (SGLang turns it into temperature=1, top_k=1).
SAMPLING_EPS = 1e-6
# SGLang has no cap on n; we bound it because each sample is a full request in the batch.
MAX_N = 128
# SGLang has no cap either; the detokenizer scans every stop string after every token, so a
# bound keeps one request from making that scan arbitrarily slow. Generous on purpose.
MAX_STOP_ENTRIES = 256
# Seeds are hashed as 64-bit words, so anything representable in 64 bits is accepted.
_SEED_MIN = -(1 << 63)
_SEED_MAX = (1 << 64) - 1

_INT_FIELDS = ("min_new_tokens", "top_k", "n")
_OPTIONAL_INT_FIELDS = ("max_new_tokens", "stream_interval", "sampling_seed")
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
_BOOL_FIELDS = (
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
)
_OPTIONAL_STR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
# Keys accepted by from_dict besides the field names, mapped to the field they set.
_ALIASES = {"seed": "sampling_seed"}


class SamplingParamsError(InvalidRequestError):
    """A sampling parameter has the wrong type or an out-of-range value."""


def _is_int(value: Any) -> bool:
    # bool is an int subclass in Python; a JSON `true` must not pass as 1.
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _type_error(name: str, expected: str, value: Any) -> SamplingParamsError:
    return SamplingParamsError(
        f"{name} must be {expected}, got {value!r} ({type(value).__name__}).", name
    )


@dataclass
class SamplingParams:
    """Sampling parameters of one request (SGLang's names and defaults).

    ``top_k == -1`` (or any value >= the vocabulary) means the whole vocabulary.
    ``max_new_tokens=None`` means no limit other than the context length.
    A temperature below 1e-6 or ``top_k == 1`` means greedy (exact argmax).
    """

    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = dataclasses.field(default_factory=list)
    stop_token_ids: set[int] | None = None
    stop_regex: list[str] = dataclasses.field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    logit_bias: dict[int, float] | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    custom_params: dict[str, Any] | None = None
    stream_interval: int | None = None

    def __post_init__(self) -> None:
        self._check_scalar_types()
        self.stop = _normalize_str_list("stop", self.stop)
        self.stop_regex = _normalize_str_list("stop_regex", self.stop_regex)
        for pattern in self.stop_regex:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SamplingParamsError(
                    f"stop_regex {pattern!r} is not a valid regular expression: {exc}.",
                    "stop_regex",
                ) from exc
        self.stop_token_ids = _normalize_stop_token_ids(self.stop_token_ids)
        self.logit_bias = _normalize_logit_bias(self.logit_bias)
        if self.custom_params is not None and not isinstance(self.custom_params, Mapping):
            raise _type_error("custom_params", "an object (dict) or null", self.custom_params)
        if self.custom_params is not None:
            self.custom_params = dict(self.custom_params)

    def _check_scalar_types(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not _is_int(value):
                raise _type_error(name, "an integer", value)
            setattr(self, name, int(value))
        for name in _OPTIONAL_INT_FIELDS:
            value = getattr(self, name)
            if value is not None and not _is_int(value):
                raise _type_error(name, "an integer or null", value)
            if value is not None:
                setattr(self, name, int(value))
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not _is_real(value):
                raise _type_error(name, "a number", value)
            setattr(self, name, float(value))
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise _type_error(name, "a boolean", value)
        for name in _OPTIONAL_STR_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise _type_error(name, "a string or null", value)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SamplingParams:
        """Build from a request's ``sampling_params`` object.

        ``None`` values mean "use the default" (for ``max_new_tokens``, whose SGLang type is
        Optional, an explicit ``None`` means "no limit"). ``seed`` is accepted as an alias of
        ``sampling_seed``. Unknown keys are rejected.
        """
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise _type_error("sampling_params", "an object (dict) or null", d)
        field_names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            if not isinstance(key, str):
                raise SamplingParamsError(f"sampling parameter names must be strings, got {key!r}.")
            name = _ALIASES.get(key, key)
            if name not in field_names:
                raise SamplingParamsError(f"Unknown sampling parameter {key!r}.", key)
            if value is None and name != "max_new_tokens":
                continue
            if name in kwargs and kwargs[name] != value:
                raise SamplingParamsError(
                    f"{key!r} conflicts with {name!r}: both are set to different values.", key
                )
            kwargs[name] = value
        return cls(**kwargs)

    def verify(self, vocab_size: int, *, with_custom_processor: bool = False) -> None:
        """Check value ranges (SGLang's rules); raise ``SamplingParamsError`` naming the field."""
        if not _is_int(vocab_size) or vocab_size <= 0:
            raise SamplingParamsError(f"vocab_size must be a positive integer, got {vocab_size!r}.")
        self._verify_distribution()
        self._verify_lengths()
        self._verify_stops()
        self._verify_logit_bias(vocab_size)
        if self.custom_params and not with_custom_processor:
            # Nothing would read them: refuse rather than silently drop what the client asked.
            raise SamplingParamsError(
                "custom_params needs a custom_logit_processor (and the server's "
                "--enable-custom-logit-processor): nothing else reads them.",
                "custom_params",
            )
        grammars = [g for g in ("json_schema", "regex", "ebnf") if getattr(self, g) is not None]
        if len(grammars) > 1:
            raise SamplingParamsError(
                "Only one of regex, json_schema, or ebnf can be set.", grammars[1]
            )

    def _verify_distribution(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0.0:
            _range_error("temperature", "a non-negative finite number", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            _range_error("top_p", "in (0, 1]", self.top_p)
        if not (self.top_k == -1 or self.top_k >= 1):
            _range_error("top_k", "-1 (disable) or at least 1", self.top_k)
        if not 0.0 <= self.min_p <= 1.0:
            _range_error("min_p", "in [0, 1]", self.min_p)
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                _range_error(name, "in [-2, 2]", getattr(self, name))
        if not 0.0 < self.repetition_penalty <= 2.0:
            _range_error(
                "repetition_penalty", "in (0, 2] (1.0 = no penalty)", self.repetition_penalty
            )

    def _verify_lengths(self) -> None:
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            _range_error("max_new_tokens", "at least 0", self.max_new_tokens)
        upper = self.max_new_tokens
        if self.min_new_tokens < 0 or (upper is not None and self.min_new_tokens > upper):
            bound = "max_new_tokens" if upper is None else f"max_new_tokens({upper})"
            _range_error("min_new_tokens", f"in [0, {bound}]", self.min_new_tokens)
        if not 1 <= self.n <= MAX_N:
            _range_error("n", f"in [1, {MAX_N}]", self.n)
        if self.stream_interval is not None and self.stream_interval < 1:
            _range_error("stream_interval", "at least 1", self.stream_interval)
        if self.sampling_seed is not None and not _SEED_MIN <= self.sampling_seed <= _SEED_MAX:
            _range_error("sampling_seed", "representable in 64 bits", self.sampling_seed)

    def _verify_stops(self) -> None:
        for name in ("stop", "stop_regex"):
            values: list[str] = getattr(self, name)
            if len(values) > MAX_STOP_ENTRIES:
                _range_error(name, f"at most {MAX_STOP_ENTRIES} entries", f"{len(values)} entries")
            if any(v == "" for v in values):
                # An empty stop string matches everywhere and would end every request at once.
                _range_error(name, "non-empty strings", "an empty string")

    def _verify_logit_bias(self, vocab_size: int) -> None:
        for token_id, bias in (self.logit_bias or {}).items():
            if not 0 <= token_id < vocab_size:
                _range_error("logit_bias", f"keyed by token ids in [0, {vocab_size - 1}]", token_id)
            if not math.isfinite(bias):
                _range_error("logit_bias", "finite biases", f"{bias} for token {token_id}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @property
    def has_penalty(self) -> bool:
        """A repetition, frequency or presence penalty: the output's token counts matter."""
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    def samples_raw_argmax(self, num_output_tokens: int) -> bool:
        """Whether a row with these parameters, after num_output_tokens generated tokens,
        samples the argmax of its raw logits (greedy; no penalty, logit bias or pending
        min_new_tokens)."""
        return (
            self.is_greedy
            and not self.logit_bias
            and not self.has_penalty
            and num_output_tokens >= self.min_new_tokens
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict that ``from_dict`` turns back into an equal object."""
        out = dataclasses.asdict(self)
        out["stop"] = list(self.stop)
        out["stop_regex"] = list(self.stop_regex)
        out["stop_token_ids"] = (
            sorted(self.stop_token_ids) if self.stop_token_ids is not None else None
        )
        out["logit_bias"] = (
            {str(k): v for k, v in self.logit_bias.items()} if self.logit_bias is not None else None
        )
        return out


def _range_error(name: str, expected: str, value: Any) -> None:
    raise SamplingParamsError(f"{name} must be {expected}, got {value}.", name)


def _normalize_str_list(name: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list | tuple):
        raise _type_error(name, "a string or a list of strings", value)
    for item in value:
        if not isinstance(item, str):
            raise _type_error(name, "a string or a list of strings", item)
    return list(value)


def _normalize_stop_token_ids(value: Any) -> set[int] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes | Mapping) or not hasattr(value, "__iter__"):
        raise _type_error("stop_token_ids", "a list of integers", value)
    ids: set[int] = set()
    for item in value:
        if item is None:  # SGLang drops None entries rather than failing
            continue
        if not _is_int(item) or item < 0:
            raise _type_error("stop_token_ids", "a list of non-negative integers", item)
        ids.add(int(item))
    return ids or None


def _normalize_logit_bias(value: Any) -> dict[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _type_error("logit_bias", "an object mapping token ids to biases", value)
    out: dict[int, float] = {}
    for key, bias in value.items():
        token_id = _parse_token_key(key)
        if not _is_real(bias):
            raise _type_error("logit_bias", f"a number for token {key!r}", bias)
        out[token_id] = float(bias)
    return out


def _parse_token_key(key: Any) -> int:
    # JSON object keys are always strings, so "42" must map to token 42.
    if _is_int(key):
        return int(key)
    if isinstance(key, str) and re.fullmatch(r"\s*-?\d+\s*", key):
        return int(key)
    raise SamplingParamsError(
        f"logit_bias keys must be token ids (integers or integer strings), got {key!r}.",
        "logit_bias",
    )
