"""Grammar-constrained decoding: compile a grammar once (cached), then one matcher per request
masks the logits each step and follows the sampled tokens. Backends: xgrammar (default),
llguidance, outlines; see ``registry.create_grammar_backend``."""

from __future__ import annotations

from radixserve.sampling.constrained.base import (
    MAX_ROLLBACK_TOKENS,
    GrammarBackend,
    GrammarMatcher,
)
from radixserve.sampling.constrained.bitmask import (
    allocate_bitmask,
    apply_allowed_mask,
    bitmask_words,
    unpack_bitmask,
)
from radixserve.sampling.constrained.registry import (
    GRAMMAR_BACKEND_CHOICES,
    GRAMMAR_BACKENDS,
    available_grammar_backends,
    create_grammar_backend,
)
from radixserve.sampling.constrained.spec import (
    ANY_JSON,
    GRAMMAR_KINDS,
    GrammarError,
    GrammarSpec,
    spec_from_sampling_params,
)

__all__ = [
    "ANY_JSON",
    "GRAMMAR_BACKENDS",
    "GRAMMAR_BACKEND_CHOICES",
    "GRAMMAR_KINDS",
    "MAX_ROLLBACK_TOKENS",
    "GrammarBackend",
    "GrammarError",
    "GrammarMatcher",
    "GrammarSpec",
    "allocate_bitmask",
    "apply_allowed_mask",
    "available_grammar_backends",
    "bitmask_words",
    "create_grammar_backend",
    "spec_from_sampling_params",
    "unpack_bitmask",
]
