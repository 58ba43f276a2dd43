"""Which draft tokens the target model accepts, from the verify pass's logits.

Drafts form a tree (draft_tree.py; a chain is a tree with one child per node). The verify pass
yields one distribution per node: node n's row is the target's distribution of the token after
the last verified token and n's path of drafts. Walking from the root:

* a greedy request emits the row's argmax (so the output equals plain greedy decoding);
* a sampled request emits a token drawn from the row's distribution p_n;

and if that token is one of the node's draft children the walk moves to that child, else it
ends. Every emitted token is therefore drawn from the target's distribution given everything
emitted before it, exactly as plain decoding draws it. Drafts are a deterministic function of
the context (a point mass q = delta(d) per candidate), for which this is speculative sampling's
min(1, p/q) test with the residual max(p - q, 0), generalised to several distinct candidates:
accepting candidate d has probability p(d), and a rejected walk's replacement follows p with the
candidates removed, renormalised.

If the walk reaches a leaf, the leaf's row gives a bonus token. So each round emits between 1
and depth + 1 tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixserve.sampling.sampler import filter_sorted, scale_by_temperature
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.speculative.draft_tree import DraftTree


def target_probs(processed: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """[rows, vocab] float32 probabilities each row would be sampled from, given its processed
    logits (`info.process_logits`: penalties, logit bias, masks; rows without any of these are
    their raw logits): temperature, then top-k / top-p / min-p as the sampler applies them,
    renormalised."""
    probs = torch.softmax(scale_by_temperature(processed, info), dim=-1)
    if info.need_top_k or info.need_top_p:
        probs_sorted, order = probs.sort(dim=-1, descending=True, stable=True)
        kept = filter_sorted(probs_sorted, info)
        probs = torch.zeros_like(probs).scatter_(-1, order, kept)
    elif info.need_min_p:
        threshold = probs.amax(dim=-1, keepdim=True) * info.min_ps.view(-1, 1)
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def accept_tree(
    tree: DraftTree,
    argmax_rows: Sequence[int] | None,
    probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> tuple[list[int], list[int]]:
    """Walk the tree; row n (of argmax_rows for a greedy request, else of probs [len(tree) + 1,
    vocab]) belongs to node n. Returns the emitted tokens and the path of accepted draft nodes
    (every emitted token but the last is an accepted draft)."""
    tokens: list[int] = []
    path: list[int] = []
    node = 0
    while True:
        if argmax_rows is not None:
            token = int(argmax_rows[node])
        else:
            assert probs is not None
            token = int(torch.multinomial(probs[node], 1, generator=generator))
        tokens.append(token)
        child = tree.child_with_token(node, token)
        if child is None:
            return tokens, path
        path.append(child)
        node = child
