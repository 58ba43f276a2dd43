"""Grammar backend on xgrammar (SGLang's default): JSON schema, regex, EBNF (GBNF-style) and
structural tags, with the vocabulary read by ``xgrammar.TokenizerInfo.from_huggingface``."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import torch
import xgrammar as xgr

from radixserve.sampling.constrained.base import (
    DEFAULT_JSON_MAX_WHITESPACE,
    GrammarBackend,
    GrammarMatcher,
)
from radixserve.sampling.constrained.bitmask import write_only
from radixserve.sampling.constrained.spec import (
    JSON_OBJECT_SCHEMA,
    GrammarError,
    GrammarSpec,
    invalid,
    is_legacy_structural_tag,
    parse_json_schema,
    parse_structural_tag,
)
from radixserve.sampling.constrained.token_bytes import special_token_ids

logger = logging.getLogger(__name__)

# xgrammar bounds JSON whitespace only by a count of [ \n\r\t] per gap, which still lets a
# model emit runs of blank lines ("key"\n  \n\n\n:). Its schema grammar is rewritten so that
# every gap is the default pattern of base.py instead (one space or tab, or one newline and up
# to 20 spaces/tabs), as llguidance applies it.
_WHITESPACE_RUN = re.compile(rf"\bwhitespace(?:_\d+)?\{{0, {DEFAULT_JSON_MAX_WHITESPACE}\}}")
_GAP_RULE = "json_gap"
_GAP_EBNF = (
    f'{_GAP_RULE} ::= ("" | [ \\t] | ("\\n" [ \\t]{{0, {DEFAULT_JSON_MAX_WHITESPACE - 1}}}))'
)

# Errors xgrammar raises for a bad grammar (RuntimeError from its C++ checks, pydantic's
# ValidationError, a ValueError subclass, for structural tags).
_GRAMMAR_ERRORS = (RuntimeError, ValueError, TypeError, KeyError)


class XGrammarMatcher(GrammarMatcher):
    """One request's ``xgrammar.GrammarMatcher``."""

    def __init__(
        self, compiled: xgr.CompiledGrammar, vocab_size: int, eos_token_ids: Sequence[int]
    ) -> None:
        super().__init__(vocab_size, eos_token_ids)
        self._matcher = xgr.GrammarMatcher(compiled)

    def fill_packed(self, bitmask: torch.Tensor, index: int = 0) -> None:
        if self._matcher.is_terminated():
            # xgrammar refuses to compute a mask after its stop token; the contract is EOS only.
            write_only(bitmask[index], self.eos_token_ids)
            return
        self._matcher.fill_next_token_bitmask(bitmask, index)

    def accept_token(self, token_id: int) -> bool:
        if not self._in_vocab(token_id) or self._matcher.is_terminated():
            return False
        if not self._matcher.accept_token(int(token_id)):
            return False
        self._accepted()
        return True

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def _rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, **kwargs: Any) -> None:
        super().__init__(tokenizer, vocab_size, **kwargs)
        if self.whitespace_pattern is not None:
            logger.warning(
                "xgrammar ignores --constrained-json-whitespace-pattern (only llguidance and "
                "outlines use it); JSON whitespace is %s",
                f"at most {DEFAULT_JSON_MAX_WHITESPACE} characters between tokens"
                if self.any_whitespace
                else "compact",
            )
        info = _tokenizer_info(tokenizer, self.vocab_size, self.eos_token_ids)
        # Our CompileCache already caches per spec; xgrammar's own cache would hold a copy.
        self._compiler = xgr.GrammarCompiler(
            info, max_threads=max(1, min(8, os.cpu_count() or 1)), cache_enabled=False
        )

    def matcher(self, compiled: object) -> XGrammarMatcher:
        if not isinstance(compiled, xgr.CompiledGrammar):
            raise ValueError("compiled must come from XGrammarBackend.compile.")
        return XGrammarMatcher(compiled, self.vocab_size, self.eos_token_ids)

    def _compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        try:
            if spec.kind == "json_object":
                return self._json_schema(JSON_OBJECT_SCHEMA)
            if spec.kind == "json_schema":
                if spec.is_any_json:
                    # SGLang's "$$ANY$$": any JSON value, arrays and scalars at the root too
                    # (the empty schema, so that whitespace is bounded as elsewhere).
                    return self._json_schema("{}")
                parse_json_schema(spec)
                return self._json_schema(spec.value)
            if spec.kind == "regex":
                return self._compiler.compile_regex(spec.value)
            if spec.kind == "ebnf":
                return self._compiler.compile_grammar(spec.value)
            return self._structural_tag(spec)
        except GrammarError:
            raise
        except _GRAMMAR_ERRORS as exc:
            raise invalid(spec, exc) from exc

    def _json_schema(self, schema: str) -> xgr.CompiledGrammar:
        # With whitespace allowed, each gap between two JSON tokens is the default pattern
        # (bounded_gaps); otherwise compact JSON.
        if not self.any_whitespace:
            return self._compiler.compile_json_schema(schema, any_whitespace=False)
        grammar = xgr.Grammar.from_json_schema(
            schema, any_whitespace=True, max_whitespace_cnt=DEFAULT_JSON_MAX_WHITESPACE
        )
        bounded = bounded_gaps(grammar)
        return self._compiler.compile_grammar(bounded if bounded is not None else grammar)

    def _structural_tag(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        tag = parse_structural_tag(spec)
        if not is_legacy_structural_tag(tag):
            return self._compiler.compile_structural_tag(spec.value)
        items = [
            xgr.StructuralTagItem(
                begin=item["begin"],
                # SGLang treats a missing schema as "any JSON".
                schema=json.dumps(item.get("schema") or {}),
                end=item["end"],
            )
            for item in tag["structures"]
        ]
        converted = xgr.StructuralTag.from_legacy_structural_tag(items, list(tag["triggers"]))
        return self._compiler.compile_structural_tag(converted)


def bounded_gaps(grammar: xgr.Grammar) -> xgr.Grammar | None:
    """`grammar` (a JSON schema's, with whitespace runs of at most DEFAULT_JSON_MAX_WHITESPACE)
    with every run replaced by the default gap, or None where its EBNF does not have the
    expected shape (another xgrammar version): then the count bound alone applies."""
    text, runs = _WHITESPACE_RUN.subn(_GAP_RULE, str(grammar))
    if runs == 0:
        logger.debug("xgrammar's JSON grammar has no whitespace runs to bound; keeping it")
        return None
    try:
        return xgr.Grammar.from_ebnf(f"{text}\n{_GAP_EBNF}\n")
    except _GRAMMAR_ERRORS as exc:
        logger.debug("bounding xgrammar's JSON whitespace failed (%s); keeping its count", exc)
        return None


def _tokenizer_info(tokenizer: Any, vocab_size: int, eos: Sequence[int]) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary, with special tokens kept out of text.

    ``from_huggingface`` reads the vocabulary type and prefix-space handling, but treats
    special tokens such as ``<|im_start|>`` as their literal text, so a JSON string could
    contain one (and the detokenizer would then drop it). xgrammar never allows a token whose
    text is empty, so the info is rebuilt with the special tokens' text blanked.
    """
    info = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos)
    )
    special = special_token_ids(tokenizer) - set(eos)
    if not special or getattr(tokenizer, "backend_tokenizer", None) is None:
        return info
    encoded = [""] * vocab_size
    for token, token_id in tokenizer.get_vocab().items():
        if 0 <= token_id < vocab_size and token_id not in special:
            encoded[token_id] = token
    return xgr.TokenizerInfo(
        encoded,
        info.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=list(eos),
        add_prefix_space=info.add_prefix_space,
    )
