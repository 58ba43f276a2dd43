"""Verification of a round's drafts from the verify forward's logits (the step runner calls it
for the requests that have drafts; the others are sampled by the plain sampler in the same
pass).

Each verify row is processed as plain decoding would process that position: penalties and
min_new_tokens see the request's output plus the drafts on the node's path, a grammar-
constrained request's row is masked by the grammar state after those drafts
(grammar_drafts.py), a custom logit processor sees the request with those drafts appended, and
a logprob request gets each emitted token's logprob from its row. Acceptance (acceptance.py)
then walks each tree and emits 1..depth+1 tokens along one branch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from radixserve.sampling.constrained.bitmask import allocate_bitmask
from radixserve.sampling.constrained.mask_apply import PackedVocabMask
from radixserve.sampling.custom_logit_processor import apply_processors
from radixserve.sampling.sampler import chosen_logprobs, scale_by_temperature
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.token_result import TokenResult
from radixserve.speculative.acceptance import accept_tree, target_probs
from radixserve.speculative.grammar_drafts import fill_tree_masks

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.speculative.draft_tree import DraftTree
    from radixserve.speculative.target import RowArgmax


@dataclass(frozen=True)
class Verified:
    """One request's outcome: the tokens to append, in order (every one but the last is an
    accepted draft), and the accepted draft nodes (whose KV must end up at kv_len + 1, ...)."""

    tokens: list[TokenResult]
    path: list[int]


def verify_drafts(
    reqs: Sequence[Req],
    trees: Sequence[DraftTree],
    logits: torch.Tensor,
    node_rows: Sequence[Sequence[int]],
    eos_token_ids: Sequence[int],
    argmax: RowArgmax,
) -> list[Verified]:
    """Per request (each with a non-empty tree): what the target accepts. node_rows[i][n] is
    the logits row of request i's node n; `argmax` takes each row's greedy token (the target's
    kernel; torch's argmax ran ~1.6 GB/s, ~1 ms for 9 rows of a 49,152-word vocabulary)."""
    rows = [r for per_req in node_rows for r in per_req]
    block = logits[rows]  # the requests' nodes, in node order
    if any(req.custom_logit_processor is not None for req in reqs):
        # Each node's row sees the request as plain decoding would at that position.
        views = [
            PathView(req, tree.path_tokens(n))
            for req, tree in zip(reqs, trees, strict=True)
            for n in range(len(tree) + 1)
        ]
        apply_processors(block, list(range(len(rows))), views)
    params = [
        req.sampling_params
        for req, tree in zip(reqs, trees, strict=True)
        for _ in range(len(tree) + 1)
    ]
    mask = _verify_grammar_mask(reqs, trees, block.shape[-1])
    raw = all(
        req.sampling_params.samples_raw_argmax(len(req.output_ids) + depth)
        for req, tree in zip(reqs, trees, strict=True)
        for depth in tree.depths
    )
    want_logprobs = any(req.return_logprob for req in reqs)
    probs = None
    scaled = None
    if mask is None and raw and not want_logprobs:
        greedy = argmax(block).tolist()
    else:
        # Node n's row sees the output plus the drafts on n's path (penalty counts,
        # min_new_tokens), as plain decoding would at that position.
        outputs = [
            req.output_ids + tree.path_tokens(n)
            for req, tree in zip(reqs, trees, strict=True)
            for n in range(len(tree) + 1)
        ]
        info = SamplingBatchInfo.from_requests(
            params,
            outputs,
            vocab_size=block.shape[-1],
            device=block.device,
            eos_token_ids=list(eos_token_ids),
            grammar_mask=mask,
        )
        processed = info.process_logits(block)
        greedy = argmax(processed).tolist()
        if not all(p.is_greedy for p in params):
            probs = target_probs(processed, info).cpu()
        if want_logprobs:
            scaled = scale_by_temperature(processed, info)
    out: list[Verified] = []
    offset = 0
    for req, tree in zip(reqs, trees, strict=True):
        width = len(tree) + 1
        if req.sampling_params.is_greedy or probs is None:
            tokens, path = accept_tree(tree, greedy[offset : offset + width], None)
        else:
            tokens, path = accept_tree(tree, None, probs[offset : offset + width])
        if req.return_logprob:
            assert scaled is not None
            emitting = [offset + n for n in [0, *path][: len(tokens)]]
            out.append(Verified(_with_logprobs(req, tokens, scaled[emitting]), path))
        else:
            out.append(Verified([TokenResult(t, 0.0) for t in tokens], path))
        offset += width
    return out


def _verify_grammar_mask(
    reqs: Sequence[Req], trees: Sequence[DraftTree], vocab_size: int
) -> PackedVocabMask | None:
    """The packed grammar mask of the verify rows (the requests' nodes, in node order); None
    when no request is constrained."""
    if all(req.grammar is None for req in reqs):
        return None
    bitmask = allocate_bitmask(sum(len(tree) + 1 for tree in trees), vocab_size)
    masked: list[int] = []
    offset = 0
    for req, tree in zip(reqs, trees, strict=True):
        matcher = req.grammar
        if matcher is not None:
            matcher.check_logits_width(vocab_size)
            filled = fill_tree_masks(matcher, tree, bitmask, offset)
            masked.extend(offset + node for node in filled)
        offset += len(tree) + 1
    return PackedVocabMask(bitmask, tuple(sorted(masked)), vocab_size)


class PathView:
    """A request as a custom logit processor sees it at one verify row: its output ids plus
    the drafts on the row's path; everything else (and any error the processor leaves, e.g.
    `custom_logit_error`) is the request's own."""

    def __init__(self, req: Req, drafts: list[int]) -> None:
        object.__setattr__(self, "_req", req)
        object.__setattr__(self, "output_ids", req.output_ids + drafts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._req, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._req, name, value)


def _with_logprobs(req: Req, tokens: list[int], scaled: torch.Tensor) -> list[TokenResult]:
    """Tokens emitted from consecutive verify rows with the logprobs (and top logprobs) the
    sampler reports: row j's processed, temperature-scaled logits, as plain decoding's step at
    that position would have them."""
    k = req.top_logprobs_num
    chosen = chosen_logprobs(scaled, torch.tensor(tokens), k)
    logprobs = chosen.logprobs.tolist()
    results = [TokenResult(t, lp) for t, lp in zip(tokens, logprobs, strict=True)]
    if k and chosen.top_logprobs is not None:
        values, ids = chosen.top_logprobs
        for j, result in enumerate(results):
            result.top_logprobs = list(zip(values[j].tolist(), ids[j].tolist(), strict=True))
    named = list(req.token_ids_logprob or ()) if req.return_logprob else []
    if named:  # token_ids_logprob: the same rows, read at the request's named ids
        rows = torch.log_softmax(scaled.float(), dim=-1)[:, named].tolist()
        for result, row in zip(results, rows, strict=True):
            result.ids_logprobs = list(zip(row, named, strict=True))
    return results
