"""Grammar backend on llguidance: JSON schema, regex, EBNF (GBNF or Lark) and SGLang's legacy
structural tags, with the vocabulary read by ``llguidance.hf.from_tokenizer``."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch
import torch

from radixserve.sampling.constrained.base import (
    DEFAULT_JSON_WHITESPACE_PATTERN,
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
    unsupported,
)

logger = logging.getLogger(__name__)


class LLGuidanceMatcher(GrammarMatcher):
    """One request's ``llguidance.LLMatcher``.

    llguidance puts a matcher into a permanent error state when it consumes a token the grammar
    refuses, so every token is checked with ``validate_tokens`` (and the id range here) first.
    EOS never reaches llguidance: once the grammar stops (nothing more fits) llguidance takes
    EOS without recording it, so a later rollback would undo the wrong token. Accepting EOS is
    recorded here instead (``_eos_accepted``), allowed whenever the grammar is satisfied.

    A state no token can extend (the grammar needs text the vocabulary cannot produce) also
    puts llguidance into its error state, at the mask fill. That is the request's dead end, not
    a failure of the step: the mask allows nothing and every token is refused, so the scheduler
    ends that request alone. Rolling back out of it (a speculative verify probes states ahead)
    rebuilds the matcher from the pristine template and replays the kept tokens.
    """

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        template: llguidance.LLMatcher | None = None,
    ) -> None:
        super().__init__(vocab_size, eos_token_ids)
        self._matcher = matcher
        self._template = template
        self._eos_accepted = False
        self._dead = False
        self._tokens: list[int] = []  # consumed, for a rebuild after a dead end

    def fill_packed(self, bitmask: torch.Tensor, index: int = 0) -> None:
        if self._eos_accepted:
            write_only(bitmask[index], self.eos_token_ids)
            return
        if not self._dead:
            llguidance.torch.fill_next_token_bitmask(self._matcher, bitmask, index)
            self._dead = self._matcher.is_error()
        if self._dead:
            bitmask[index].zero_()

    def accept_token(self, token_id: int) -> bool:
        if not self._in_vocab(token_id) or self._eos_accepted or self._dead:
            return False
        token_id = int(token_id)
        if token_id in self.eos_token_ids:
            if not self._matcher.is_accepting():
                return False
            self._eos_accepted = True
        elif self._matcher.validate_tokens([token_id]) != 1:
            return False
        elif not self._matcher.consume_token(token_id):
            raise RuntimeError(f"llguidance matcher failed: {self._matcher.get_error()}")
        else:
            self._tokens.append(token_id)
        self._accepted()
        return True

    def is_terminated(self) -> bool:
        return self._eos_accepted

    def _rollback(self, num_tokens: int) -> None:
        if self._eos_accepted:
            self._eos_accepted = False
            num_tokens -= 1
        if not num_tokens:
            return
        del self._tokens[-num_tokens:]
        if self._dead and self._template is not None:
            self._matcher = self._template.deep_copy()
            if self._tokens and not self._matcher.consume_tokens(self._tokens):
                raise RuntimeError(f"llguidance replay failed: {self._matcher.get_error()}")
            self._dead = False
        elif not self._matcher.rollback(num_tokens):
            raise RuntimeError(f"llguidance rollback failed: {self._matcher.get_error()}")


class LLGuidanceBackend(GrammarBackend):
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int, **kwargs: Any) -> None:
        super().__init__(tokenizer, vocab_size, **kwargs)
        self._tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=self.vocab_size, eos_token=list(self.eos_token_ids)
        )
        self._json_options: dict[str, Any] = {"whitespace_flexible": self.any_whitespace}
        if self.whitespace_pattern is not None:
            self._json_options["whitespace_pattern"] = self.whitespace_pattern
        elif self.any_whitespace:  # bounded, not llguidance's default of any run
            self._json_options["whitespace_pattern"] = DEFAULT_JSON_WHITESPACE_PATTERN

    def matcher(self, compiled: object) -> LLGuidanceMatcher:
        if not isinstance(compiled, llguidance.LLMatcher):
            raise ValueError("compiled must come from LLGuidanceBackend.compile.")
        # The compiled object is a pristine matcher that is never advanced; copying it is far
        # cheaper than building the grammar again.
        return LLGuidanceMatcher(
            compiled.deep_copy(), self.vocab_size, self.eos_token_ids, template=compiled
        )

    def _compile(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        grammar = self._grammar_text(spec)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self._tokenizer
        )
        if is_error:
            raise invalid(spec, ValueError("; ".join(messages)))
        template = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if template.is_error():
            raise invalid(spec, ValueError(template.get_error()))
        return template

    def _grammar_text(self, spec: GrammarSpec) -> str:
        try:
            if spec.kind == "json_object":
                return self._json_grammar(JSON_OBJECT_SCHEMA)
            if spec.kind == "json_schema":
                if spec.is_any_json:
                    # "{}" is the schema every JSON value satisfies: what "$$ANY$$" stands for.
                    return self._json_grammar("{}")
                parse_json_schema(spec)
                return self._json_grammar(spec.value)
            if spec.kind == "regex":
                return llguidance.grammar_from("regex", spec.value)
            if spec.kind == "ebnf":
                return llguidance.grammar_from("ebnf", spec.value)
            return self._structural_tag_grammar(spec)
        except GrammarError:
            raise
        except (ValueError, TypeError, KeyError, AssertionError) as exc:
            raise invalid(spec, exc) from exc

    def _json_grammar(self, schema: str) -> str:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=self._json_options)

    def _structural_tag_grammar(self, spec: GrammarSpec) -> str:
        tag = parse_structural_tag(spec)
        if not is_legacy_structural_tag(tag):
            raise unsupported(
                spec, self.name, 'Use the {"structures": [...], "triggers": [...]} form.'
            )
        triggers = [str(t) for t in tag["triggers"]]
        tags = []
        for item in tag["structures"]:
            begin = item["begin"]
            # Each structure needs the trigger that opens it; the longest match is the most
            # specific.
            trigger = max((t for t in triggers if t and begin.startswith(t)), key=len, default="")
            if not trigger:
                raise GrammarError(
                    f"structural_tag: no trigger starts the begin string {begin!r}.",
                    spec.param,
                )
            schema = item.get("schema") or {}
            tags.append(
                llguidance.StructTag(
                    trigger=trigger, begin=begin, grammar=json.dumps(schema), end=item["end"]
                )
            )
        return llguidance.StructTag.to_grammar(tags)
