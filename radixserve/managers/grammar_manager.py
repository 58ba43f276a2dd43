"""Grammar-constrained requests on the scheduler side: compile in the background (a request
waits in its own queue, so compiling never stalls other requests' decoding), give each request
a matcher, fill the batch's packed vocabulary mask, and follow the sampled tokens."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixserve.managers.background_work import BackgroundQueue
from radixserve.sampling.constrained import (
    GrammarBackend,
    GrammarError,
    spec_from_sampling_params,
)
from radixserve.sampling.constrained.bitmask import allocate_bitmask
from radixserve.sampling.constrained.mask_apply import PackedVocabMask

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req

logger = logging.getLogger(__name__)


class GrammarManager:
    """Owns the requests whose grammar is still compiling."""

    def __init__(self, make_backend: Any) -> None:
        self._make_backend = make_backend  # built on first use: loading vocab info costs time
        self._backend: GrammarBackend | None = None
        self.compiling: BackgroundQueue[Any] = BackgroundQueue((GrammarError,))

    @property
    def backend(self) -> GrammarBackend | None:
        if self._backend is None:
            self._backend = self._make_backend()
        return self._backend

    def needs_grammar(self, req: Req) -> bool:
        return spec_from_sampling_params(req.sampling_params) is not None

    def start(self, req: Req) -> str | None:
        """Start compiling the request's grammar; an error message if it cannot be served."""
        try:
            backend = self.backend
        except ImportError as exc:
            return f"Structured outputs are unavailable: {exc}"
        if backend is None:
            return "Structured outputs are disabled on this server (--grammar-backend none)."
        try:
            spec = spec_from_sampling_params(req.sampling_params)
            assert spec is not None
            self.compiling.add(req, backend.compile_async(spec))
        except GrammarError as exc:
            return str(exc)
        return None

    def collect_ready(self) -> tuple[list[Req], list[tuple[Req, str]]]:
        """Requests whose grammar finished compiling (now with a matcher), and failures."""
        return self.compiling.collect(self._give_matcher)

    def _give_matcher(self, req: Req, compiled: Any) -> None:
        req.grammar = self.backend.matcher(compiled)  # type: ignore[union-attr]

    @staticmethod
    def grammar_mask(reqs: Sequence[Req], vocab_size: int) -> PackedVocabMask | None:
        """The batch's packed mask (int32 [B, ceil(vocab_size / 32)]), each constrained
        request's row filled by its matcher; None when no request in the batch is constrained.
        The sampler applies it in place (``PackedVocabMask.apply_``), so no per-token mask is
        ever built here."""
        rows = tuple(i for i, r in enumerate(reqs) if r.grammar is not None)
        if not rows:
            return None
        # Zeroed, so a row no matcher wrote would allow nothing rather than garbage.
        bitmask = allocate_bitmask(len(reqs), vocab_size)
        for i in rows:
            matcher = reqs[i].grammar
            assert matcher is not None
            matcher.check_logits_width(vocab_size)
            matcher.fill_packed(bitmask, i)
        return PackedVocabMask(bitmask, rows, vocab_size)
