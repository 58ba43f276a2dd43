"""The one interface every drafter (NGRAM, STANDALONE draft model, EAGLE / EAGLE3 head) offers
the speculative worker: drafts for a round, what the round kept, and the request's and the
cache's end. EAGLE's extra need, the target's features, comes through `take_features`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from radixserve.managers.schedule_batch import Req
    from radixserve.speculative.draft_tree import DraftTree


def speculable(req: Req) -> bool:
    """Whether drafts for `req` can be verified exactly by speculative/verify.py's rules (a
    seeded request's draw depends on the step, so it is sampled plainly instead)."""
    return req.sampling_params.sampling_seed is None


class Drafter(Protocol):
    # Whether a constrained request's drafts must be pruned where its grammar refuses them. A
    # drafter whose KV bookkeeping follows the drafted chain (the draft model's chains) keeps
    # them whole; a draft the grammar refuses is then simply never accepted.
    prunes_by_grammar: bool
    # Whether it reads the target's per-token features (take_features); EAGLE only.
    wants_features: bool

    def propose(self, reqs: Sequence[Req], rooms: Sequence[int]) -> list[DraftTree]:
        """Up to rooms[i] draft nodes for each request (0: none)."""
        ...

    def commit(self, req: Req, num_drafts: int, num_kept: int) -> None:
        """The round verified num_kept of the request's num_drafts drafts."""
        ...

    def release(self, req: Req) -> None:
        """The target released the request: free what the drafter holds for it."""
        ...

    def reset(self) -> None:
        """The target's KV bookkeeping was reset (after a failed step): forget every request."""
        ...

    def take_features(
        self,
        reqs: Sequence[Req],
        starts: Sequence[int],
        lengths: Sequence[int],
        features: torch.Tensor,
    ) -> None:
        """A target step's features, flattened over its requests in order: a prefill's new
        tokens, or a verify forward's verified positions."""
        ...


class ReadsNoFeatures:
    """For drafters that draft from tokens alone (NGRAM, a draft model): the target's features
    are never handed to them (wants_features is False), so being handed some is a wiring bug."""

    wants_features = False

    def take_features(
        self,
        reqs: Sequence[Req],
        starts: Sequence[int],
        lengths: Sequence[int],
        features: torch.Tensor,
    ) -> None:
        raise NotImplementedError(f"{type(self).__name__} reads no target features")
