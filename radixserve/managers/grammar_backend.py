"""make_grammar_backend: the --grammar-backend for a tokenizer, built by the scheduler's
GrammarManager and by the API process's TokenizerManager (which compiles each grammar too, to
answer an invalid one with a 400). A module of its own so the API process can name it without
importing the scheduler's mask code, which imports torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixserve.sampling.constrained.registry import create_grammar_backend

if TYPE_CHECKING:
    from radixserve.sampling.constrained.base import GrammarBackend
    from radixserve.server_args import ServerArgs


def make_grammar_backend(
    server_args: ServerArgs, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]
) -> GrammarBackend | None:
    """The configured backend (--grammar-backend), or None when disabled or without a
    tokenizer (grammar requests are then refused)."""
    name = server_args.grammar_backend or "xgrammar"
    if name == "none" or tokenizer is None:
        return None
    return create_grammar_backend(
        name,
        tokenizer,
        vocab_size,
        any_whitespace=not server_args.constrained_json_disable_any_whitespace,
        whitespace_pattern=server_args.constrained_json_whitespace_pattern,
        eos_token_ids=list(eos_token_ids),
    )
