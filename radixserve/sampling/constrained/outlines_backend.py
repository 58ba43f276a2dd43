"""Grammar backend on outlines-core: JSON schema and regex, both compiled to a regex and then to
a token-level automaton (``outlines_core.Index``). outlines-core has no context-free grammars,
so EBNF and structural tags are refused with GrammarError, as SGLang's outlines backend does.

Known limits (outlines-core 0.2): bounds on ``number`` (non-integer) values are not enforced
(integer bounds are, see ``outlines_schema``); any-JSON (``json_object``, ``"$$ANY$$"``) and
untyped subschemas nest containers to a fixed depth. JSON whitespace defaults to outlines-core's
own (``[ ]?``, at most one space) rather than "any", which also keeps sampling from wandering
into endless whitespace.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import outlines_core
import torch

from radixserve.sampling.constrained.base import (
    MAX_ROLLBACK_TOKENS,
    GrammarBackend,
    GrammarMatcher,
)
from radixserve.sampling.constrained.bitmask import add_tokens, write_only
from radixserve.sampling.constrained.outlines_schema import any_json_regex, schema_to_regex
from radixserve.sampling.constrained.spec import (
    GrammarSpec,
    invalid,
    parse_json_schema,
    unsupported,
)
from radixserve.sampling.constrained.token_bytes import token_bytes_map

logger = logging.getLogger(__name__)


class OutlinesMatcher(GrammarMatcher):
    """One request's ``outlines_core.Guide``.

    outlines-core lists the EOS id among a final state's allowed tokens but has no transition
    for it, so accepting EOS is recorded here (``_eos_accepted``) rather than in the guide.
    """

    def __init__(
        self, index: outlines_core.Index, vocab_size: int, eos_token_ids: Sequence[int]
    ) -> None:
        super().__init__(vocab_size, eos_token_ids)
        self._guide = outlines_core.Guide(index, max_rollback=MAX_ROLLBACK_TOKENS)
        self._eos_accepted = False

    def fill_packed(self, bitmask: torch.Tensor, index: int = 0) -> None:
        row = bitmask[index]
        if self._eos_accepted:
            write_only(row, self.eos_token_ids)
            return
        if not row.is_contiguous() or row.dtype != torch.int32 or row.device.type != "cpu":
            raise ValueError("bitmask must be a contiguous int32 CPU tensor.")
        row.zero_()
        self._guide.write_mask_into(row.data_ptr(), row.numel(), row.element_size())
        if self._guide.is_finished():
            # The guide knows one EOS id; the model may have several.
            add_tokens(row, self.eos_token_ids)

    def accept_token(self, token_id: int) -> bool:
        if not self._in_vocab(token_id) or self._eos_accepted:
            return False
        token_id = int(token_id)
        if token_id in self.eos_token_ids:
            if not self._guide.is_finished():
                return False
            self._eos_accepted = True
        elif self._guide.accepts_tokens([token_id]):
            self._guide.advance(token_id, return_tokens=False)
        else:
            return False
        self._accepted()
        return True

    def is_terminated(self) -> bool:
        return self._eos_accepted

    def _rollback(self, num_tokens: int) -> None:
        if self._eos_accepted:
            self._eos_accepted = False
            num_tokens -= 1
        if num_tokens:
            self._guide.rollback_state(num_tokens)


class OutlinesBackend(GrammarBackend):
    name = "outlines"

    def __init__(self, tokenizer: Any, vocab_size: int, **kwargs: Any) -> None:
        super().__init__(tokenizer, vocab_size, **kwargs)
        vocab = token_bytes_map(tokenizer, self.vocab_size, exclude=self.eos_token_ids)
        self._vocabulary = outlines_core.Vocabulary(self.eos_token_ids[0], vocab)
        if self.whitespace_pattern is not None:
            self._whitespace: str | None = self.whitespace_pattern
        else:
            # None: outlines-core's default; "" means no whitespace at all.
            self._whitespace = None if self.any_whitespace else ""

    def matcher(self, compiled: object) -> OutlinesMatcher:
        if not isinstance(compiled, outlines_core.Index):
            raise ValueError("compiled must come from OutlinesBackend.compile.")
        return OutlinesMatcher(compiled, self.vocab_size, self.eos_token_ids)

    def _compile(self, spec: GrammarSpec) -> outlines_core.Index:
        regex = self._regex(spec)
        try:
            return outlines_core.Index(regex, self._vocabulary)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise invalid(spec, _explain_regex_error(regex, exc)) from exc

    def _regex(self, spec: GrammarSpec) -> str:
        if spec.kind == "regex":
            return spec.value
        if spec.kind not in ("json_schema", "json_object"):
            raise unsupported(spec, self.name, "Use the xgrammar or llguidance backend.")
        if spec.kind == "json_object" or spec.is_any_json:
            return any_json_regex(self._whitespace, object_only=spec.kind == "json_object")
        parse_json_schema(spec)
        try:
            return schema_to_regex(spec.value, self._whitespace)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise invalid(spec, exc) from exc


def _explain_regex_error(regex: str, exc: BaseException) -> BaseException:
    """outlines-core reports every bad regex as "Failed to build DFA"; Python's parser usually
    says what is wrong (the two dialects agree on plain syntax errors)."""
    try:
        re.compile(regex)
    except re.error as py_exc:
        return py_exc
    return exc
