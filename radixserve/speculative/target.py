"""What speculative decoding needs from the target's serving side, as narrow protocols: the
scheduler hands its StepRunner (managers/step_runner.py) in as `TargetSteps`, so this package
depends on the request type (managers/schedule_batch.Req) and on nothing else of managers/."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.mem_cache.allocator import TokenToKVPoolAllocator
    from radixserve.mem_cache.req_to_token_pool import ReqToTokenPool
    from radixserve.model_executor.model_runner import ModelRunner

# Called with each forward's per-token features: the batch's requests, their first positions
# and token counts, the features ([tokens, feature size]).
FeatureHook = Callable[[Sequence["Req"], Sequence[int], Sequence[int], torch.Tensor], None]
# Each row's greedy token of [rows, vocab] logits (the first index of the largest value):
# the target's own C++ kernel where it is built, handed to the drafters and verification.
RowArgmax = Callable[[torch.Tensor], torch.Tensor]


class TargetKV(Protocol):
    """The target's KV memory: its slots, its request table, and hooks run when a request's
    memory is released or the whole cache is reset (a drafter frees its own then)."""

    allocator: TokenToKVPoolAllocator
    req_to_token_pool: ReqToTokenPool
    release_hooks: list[Callable[[Req], None]]
    reset_hooks: list[Callable[[], None]]


class TargetSteps(Protocol):
    """The target model's step runner: its model and its KV (the drafters run on them), the
    hook its forwards' features go to (EAGLE), and its row-wise argmax."""

    runner: ModelRunner
    kv: TargetKV
    on_features: FeatureHook | None
    argmax: RowArgmax
