"""Grammar-constrained decoding: compile a grammar once (cached), then one matcher per request
masks the logits each step and follows the sampled tokens. Backends: xgrammar (default),
llguidance, outlines; see ``registry.create_grammar_backend``.

The matcher and bitmask names load on first use (PEP 562 ``__getattr__``): they import torch,
and the API process, which needs only the request-side names (spec, registry), must not."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
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

# name -> the submodule that defines it (imported on first access)
_LAZY = {
    "MAX_ROLLBACK_TOKENS": "base",
    "GrammarBackend": "base",
    "GrammarMatcher": "base",
    "allocate_bitmask": "bitmask",
    "apply_allowed_mask": "bitmask",
    "bitmask_words": "bitmask",
    "unpack_bitmask": "bitmask",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


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
