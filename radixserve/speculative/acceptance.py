"""Which draft tokens the target model accepts, from the verify pass's logits.

For a request with drafts d_1..d_k the verify pass yields k + 1 distributions: row j is the
target's distribution of the token after (last verified token, d_1..d_j). Walking j = 0..k-1:

* greedy rows accept d_{j+1} when it is the argmax (so the output equals plain greedy decoding);
* sampled rows accept d_{j+1} with probability p_j(d_{j+1}); on a rejection the token is drawn
  from p_j with d_{j+1} removed and renormalised. The n-gram / chain drafts are deterministic
  given the context (a point mass q = delta(d)), and for q = delta(d) this is exactly
  speculative sampling's min(1, p/q) test with the residual max(p - q, 0): every emitted token
  is distributed as p_j, the target distribution.

The first rejection ends the walk with the replacement token; if all k are accepted a bonus
token is drawn from row k. So each round emits between 1 and k + 1 tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixserve.sampling.sampler import _filter_sorted, _scale
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo


def target_probs(processed: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """[rows, vocab] float32 probabilities each row would be sampled from, given its processed
    logits (`info.process_logits`: penalties, logit bias, masks; rows without any of these are
    their raw logits): temperature, then top-k / top-p / min-p as the sampler applies them,
    renormalised."""
    probs = torch.softmax(_scale(processed, info), dim=-1)
    if info.need_top_k or info.need_top_p:
        probs_sorted, order = probs.sort(dim=-1, descending=True, stable=True)
        kept = _filter_sorted(probs_sorted, info)
        probs = torch.zeros_like(probs).scatter_(-1, order, kept)
    elif info.need_min_p:
        threshold = probs.amax(dim=-1, keepdim=True) * info.min_ps.view(-1, 1)
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def accept_greedy(argmax_rows: Sequence[int], drafts: Sequence[int]) -> list[int]:
    """Tokens emitted for a greedy request: the matching draft prefix, then the target's
    own token at the first mismatch (or the bonus token after the last draft)."""
    out: list[int] = []
    for j, draft in enumerate(drafts):
        target = argmax_rows[j]
        out.append(target)
        if target != draft:
            return out
    out.append(argmax_rows[len(drafts)])
    return out


def accept_sampled(
    probs: torch.Tensor, drafts: Sequence[int], generator: torch.Generator | None = None
) -> list[int]:
    """Tokens emitted for a sampled request; probs is [len(drafts) + 1, vocab]."""
    out: list[int] = []
    uniforms = torch.rand(len(drafts) + 1, generator=generator).tolist()
    for j, draft in enumerate(drafts):
        row = probs[j]
        if uniforms[j] < float(row[draft]):
            out.append(draft)
            continue
        residual = row.clone()
        residual[draft] = 0.0
        if float(residual.sum()) <= 0.0:  # p(draft) == 1 up to rounding: nothing else to draw
            out.append(draft)
            continue
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(drafts)], 1, generator=generator)))
    return out
