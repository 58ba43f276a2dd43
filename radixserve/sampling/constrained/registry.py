"""``--grammar-backend`` names to backend classes; each library is imported only when its
backend is chosen, so an engine without (say) outlines-core still starts with xgrammar."""

from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # base imports torch; only a created backend needs it
    from radixserve.sampling.constrained.base import GrammarBackend

logger = logging.getLogger(__name__)

# name -> (module, class, the package that provides the library)
_BACKENDS: dict[str, tuple[str, str, str]] = {
    "xgrammar": ("xgrammar_backend", "XGrammarBackend", "xgrammar"),
    "llguidance": ("llguidance_backend", "LLGuidanceBackend", "llguidance"),
    "outlines": ("outlines_backend", "OutlinesBackend", "outlines_core"),
}
GRAMMAR_BACKENDS = tuple(_BACKENDS)
GRAMMAR_BACKEND_CHOICES = (*GRAMMAR_BACKENDS, "none")


def available_grammar_backends() -> tuple[str, ...]:
    """The backends whose library is installed."""
    return tuple(
        name for name, (_, _, lib) in _BACKENDS.items() if importlib.util.find_spec(lib) is not None
    )


def describe_grammar_backend(name: str | None) -> tuple[int, str]:
    """A startup log line (level, message) saying which backend structured outputs use."""
    installed = available_grammar_backends()
    listed = ", ".join(installed) or "none"
    if name is None or name == "none":
        return logging.INFO, "Structured outputs are disabled (--grammar-backend none)."
    if name not in installed:
        package = _BACKENDS[name][2] if name in _BACKENDS else name
        return logging.WARNING, (
            f"Grammar backend {name} is not installed (installed: {listed}): structured-output "
            f"requests will be refused; install {package} or pick another --grammar-backend."
        )
    return logging.INFO, f"Structured outputs use the {name} grammar backend (installed: {listed})."


def create_grammar_backend(
    name: str | None, tokenizer: Any, vocab_size: int, **kwargs: Any
) -> GrammarBackend | None:
    """The backend ``name`` for ``tokenizer`` and a logits width of ``vocab_size``; None for
    "none" (or None). ``kwargs`` go to the backend (any_whitespace, whitespace_pattern,
    compile_timeout_s, eos_token_ids, cache_size). Raises ValueError for an unknown name and
    ImportError, naming the package, when the library is missing."""
    if name is None or name == "none":
        return None
    if name not in _BACKENDS:
        raise ValueError(
            f"--grammar-backend {name!r} is not supported; choose one of: "
            f"{', '.join(GRAMMAR_BACKEND_CHOICES)}"
        )
    module_name, class_name, library = _BACKENDS[name]
    if importlib.util.find_spec(library) is None:
        raise ImportError(
            f"--grammar-backend {name} needs the {library.replace('_', '-')} package; install it "
            f"or choose another backend."
        )
    module = importlib.import_module(f"radixserve.sampling.constrained.{module_name}")
    backend_cls: type[GrammarBackend] = getattr(module, class_name)
    backend = backend_cls(tokenizer, vocab_size, **kwargs)
    logger.info("Grammar backend %s ready (vocab_size=%d)", name, vocab_size)
    return backend
