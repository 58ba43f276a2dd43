"""The grammar-backend interface the scheduler uses: a backend compiles grammars (cached, off
the caller's thread, with a deadline) and makes one matcher per request.

Per step, for each constrained request the scheduler fills that request's row of the batch's
packed allowed-token mask (``fill_packed``), the sampler masks those logits rows in place
(``mask_apply``), and the scheduler calls ``accept_token`` with the sampled id. ``fill_bitmask``
(one request, unpacked to bool) is for tests and tools. ``rollback`` undoes accepted tokens (up to
``MAX_ROLLBACK_TOKENS``).
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future
from numbers import Integral
from typing import Any, ClassVar

import torch

from radixserve.sampling.constrained.bitmask import bitmask_words, unpack_bitmask
from radixserve.sampling.constrained.compile_cache import CompileCache
from radixserve.sampling.constrained.spec import GrammarError, GrammarSpec

logger = logging.getLogger(__name__)

# How many accepted tokens a matcher can undo (SGLang keeps the same bound).
MAX_ROLLBACK_TOKENS = 200
DEFAULT_COMPILE_TIMEOUT_S = 10.0
DEFAULT_CACHE_SIZE = 256
# JSON whitespace when --constrained-json-whitespace-pattern is not given. "Any whitespace"
# lets a small model fill its token budget with newlines and end with invalid JSON, so between
# two JSON tokens at most one space or tab, or one newline and up to 20 spaces/tabs of indent
# (llama.cpp's JSON grammars bound it the same way). llguidance takes this pattern; xgrammar
# takes a character count (DEFAULT_JSON_MAX_WHITESPACE); outlines keeps its own `[ ]?`.
DEFAULT_JSON_WHITESPACE_PATTERN = r"(?:[ \t]|\n[ \t]{0,20})?"
DEFAULT_JSON_MAX_WHITESPACE = 21


class GrammarMatcher(ABC):
    """The grammar state of one request.

    Invariants: once ``is_terminated()`` (an EOS id was accepted) the only allowed tokens are
    the EOS ids and ``accept_token`` returns False; ids outside ``[0, vocab_size)`` are never
    allowed; a refused token leaves the state unchanged.
    """

    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self._row: torch.Tensor | None = None
        # Accepted tokens that rollback may still undo.
        self._undoable = 0

    @abstractmethod
    def fill_packed(self, bitmask: torch.Tensor, index: int = 0) -> None:
        """Write row ``index`` of a packed int32 bitmask [batch, ceil(vocab_size / 32)]
        (see ``bitmask.allocate_bitmask``): a set bit means the token is allowed next."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by ``token_id``; False (state unchanged) if the grammar does not allow it."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once the grammar has accepted an EOS id."""

    @abstractmethod
    def _rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (already checked to be possible)."""

    def fill_bitmask(self, allowed: torch.Tensor) -> None:
        """Overwrite ``allowed`` (bool [vocab_size], any device) with the tokens allowed next."""
        if not isinstance(allowed, torch.Tensor) or allowed.dtype != torch.bool:
            raise ValueError("allowed must be a bool tensor.")
        if tuple(allowed.shape) != (self.vocab_size,):
            raise ValueError(
                f"allowed must have shape ({self.vocab_size},), got {tuple(allowed.shape)}."
            )
        if self._row is None:
            self._row = torch.zeros(1, bitmask_words(self.vocab_size), dtype=torch.int32)
        self.fill_packed(self._row, 0)
        allowed.copy_(unpack_bitmask(self._row[0], self.vocab_size))

    def check_logits_width(self, width: int) -> None:
        """Raise ValueError unless this matcher's masks fit logits `width` wide."""
        if self.vocab_size != width:
            raise ValueError(
                f"the grammar's vocabulary ({self.vocab_size}) differs from the logits "
                f"width ({width})."
            )

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (an accepted EOS counts as one)."""
        if not _is_int(num_tokens) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative integer, got {num_tokens!r}.")
        if num_tokens > self._undoable:
            raise ValueError(
                f"num_tokens={num_tokens} exceeds the {self._undoable} accepted token(s) that "
                f"can be rolled back (at most {MAX_ROLLBACK_TOKENS})."
            )
        if num_tokens:
            self._rollback(num_tokens)
            self._undoable -= num_tokens

    def _in_vocab(self, token_id: int) -> bool:
        """Type-check ``token_id``; False when it is outside the vocabulary."""
        if not _is_int(token_id):
            raise ValueError(f"token_id must be an integer, got {token_id!r}.")
        return 0 <= token_id < self.vocab_size

    def _accepted(self) -> None:
        self._undoable = min(self._undoable + 1, MAX_ROLLBACK_TOKENS)


class GrammarBackend(ABC):
    """Compiles grammars for one tokenizer and hands out matchers.

    ``vocab_size`` is the width of the model's logits, which may exceed the tokenizer's
    vocabulary (the extra ids are never allowed). ``any_whitespace=False`` (SGLang's
    ``--constrained-json-disable-any-whitespace``) makes JSON compact; ``whitespace_pattern``
    (``--constrained-json-whitespace-pattern``) is a regex for the whitespace JSON may contain,
    honoured by llguidance and outlines. Without either, JSON whitespace is bounded (see
    DEFAULT_JSON_WHITESPACE_PATTERN), never "any". ``eos_token_ids`` overrides the tokenizer's EOS ids
    (SGLang passes the model's generation-config EOS ids).
    """

    name: ClassVar[str] = ""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        *,
        any_whitespace: bool = True,
        whitespace_pattern: str | None = None,
        compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
        eos_token_ids: Sequence[int] | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        if not _is_int(vocab_size) or vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}.")
        if not isinstance(any_whitespace, bool):
            raise ValueError(f"any_whitespace must be a boolean, got {any_whitespace!r}.")
        if whitespace_pattern is not None and not isinstance(whitespace_pattern, str):
            raise ValueError(f"whitespace_pattern must be a string, got {whitespace_pattern!r}.")
        if (
            isinstance(compile_timeout_s, bool)
            or not isinstance(compile_timeout_s, int | float)
            or not math.isfinite(compile_timeout_s)
            or compile_timeout_s <= 0
        ):
            raise ValueError(
                f"compile_timeout_s must be a positive number, got {compile_timeout_s!r}."
            )
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.any_whitespace = any_whitespace
        self.whitespace_pattern = whitespace_pattern
        self.compile_timeout_s = float(compile_timeout_s)
        self.eos_token_ids = resolve_eos_token_ids(tokenizer, eos_token_ids, self.vocab_size)
        self._cache = CompileCache(cache_size)

    def compile(self, spec: GrammarSpec) -> object:
        """The compiled grammar for ``spec`` (cached); raises GrammarError when it is invalid,
        unsupported by this backend, or takes longer than ``compile_timeout_s``. Blocks the
        caller up to that long: a scheduler loop should use ``compile_async``."""
        return self.compile_async(spec).result()

    def compile_async(self, spec: GrammarSpec) -> Future[object]:
        """A future for ``compile(spec)`` that never blocks the caller: already done on a cache
        hit, and settled within ``compile_timeout_s`` otherwise (poll ``done()`` each step)."""
        if not isinstance(spec, GrammarSpec):
            raise ValueError(f"spec must be a GrammarSpec, got {type(spec).__name__}.")
        return self._cache.submit(spec, self._compile_usable, self.compile_timeout_s)

    def _compile_usable(self, spec: GrammarSpec) -> object:
        compiled = self._compile(spec)
        # A grammar that no token of this vocabulary can start (e.g. a regex of a control
        # character no token contains) would leave the sampler an all-masked row: refuse it
        # here, as the client's error, instead of failing mid-generation.
        first = torch.zeros(1, bitmask_words(self.vocab_size), dtype=torch.int32)
        self.matcher(compiled).fill_packed(first, 0)
        if not bool(first.any()):
            raise GrammarError(
                f"The {spec.param} allows no token of this model's vocabulary (it needs text no "
                "token can produce).",
                spec.param,
            )
        return compiled

    def is_cached(self, spec: GrammarSpec) -> bool:
        return spec in self._cache

    def clear_cache(self) -> None:
        self._cache.clear()

    @abstractmethod
    def matcher(self, compiled: object) -> GrammarMatcher:
        """A fresh matcher, independent of every other, for a grammar from ``compile``."""

    @abstractmethod
    def _compile(self, spec: GrammarSpec) -> object:
        """Compile ``spec`` (runs in a worker thread); raise GrammarError when it is unusable."""


def resolve_eos_token_ids(
    tokenizer: Any, eos_token_ids: Sequence[int] | None, vocab_size: int
) -> tuple[int, ...]:
    """The EOS ids the grammar allows at its end: the given ones, else the tokenizer's."""
    if eos_token_ids is None:
        found = getattr(tokenizer, "eos_token_id", None)
        eos_token_ids = [found] if _is_int(found) else list(found or [])
    ids: list[int] = []
    for token_id in eos_token_ids:
        if not _is_int(token_id) or not 0 <= token_id < vocab_size:
            raise ValueError(
                f"eos_token_ids must be token ids in [0, {vocab_size}), got {token_id!r}."
            )
        if int(token_id) not in ids:
            ids.append(int(token_id))
    if not ids:
        raise ValueError(
            "eos_token_ids is empty and the tokenizer has no eos_token_id; a grammar needs an "
            "EOS id to end on."
        )
    return tuple(ids)


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)
