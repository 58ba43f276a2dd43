"""Router top-k: which experts each token goes to, and with what weight.

The arithmetic follows transformers' routers so float32 results match bit for bit: the scores
are computed in float32 (softmax over all experts, or a sigmoid per expert), the top k are
taken, optionally divided by their sum (`norm_topk_prob`; Mixtral always does), and the weights
are cast back to the activations' dtype before they scale the experts' outputs. gpt-oss takes
the top k of the raw logits first and softmaxes over those k only (TOPK_SOFTMAX).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch


class Scoring(enum.Enum):
    SOFTMAX = "softmax"  # Mixtral, Qwen2/3-MoE, OLMoE
    SIGMOID = "sigmoid"  # DeepSeek-V3-style routers
    TOPK_SOFTMAX = "topk_softmax"  # gpt-oss: softmax over the k largest logits only


class RouterSpec(NamedTuple):
    """How a model turns router logits into expert choices."""

    top_k: int
    scoring: Scoring = Scoring.SOFTMAX
    renormalize: bool = False  # divide the chosen scores by their sum
    # Grouped top-k (DeepSeek-V2's "group_limited_greedy"): the experts split into num_groups
    # equal groups, each group ranked by its best expert's score, and the top k chosen only
    # among the experts of the topk_groups best groups. 1 and 1: plain top-k.
    num_groups: int = 1
    topk_groups: int = 1
    # Multiplies the chosen weights after any renormalization (DeepSeek's
    # routed_scaling_factor).
    scaling_factor: float = 1.0


class Routing(NamedTuple):
    weights: torch.Tensor  # [tokens, top_k], the activations' dtype
    experts: torch.Tensor  # [tokens, top_k] int64 expert ids


def route(logits: torch.Tensor, spec: RouterSpec, out_dtype: torch.dtype) -> Routing:
    """logits [tokens, experts] -> each token's top-k experts and their weights."""
    if spec.scoring is Scoring.TOPK_SOFTMAX:
        # The same experts as a full softmax would pick (it is monotonic); the weights are a
        # softmax over the k chosen logits, which already sum to 1 (renormalize is moot).
        chosen, experts = torch.topk(logits.float(), spec.top_k, dim=-1)
        return Routing(torch.softmax(chosen, dim=-1).to(out_dtype), experts)
    if spec.scoring is Scoring.SOFTMAX:
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        scores = torch.sigmoid(logits.float())
    if spec.num_groups > 1:
        scores = _keep_best_groups(scores, spec.num_groups, spec.topk_groups)
    weights, experts = torch.topk(scores, spec.top_k, dim=-1)
    if spec.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if spec.scaling_factor != 1.0:
        weights = weights * spec.scaling_factor
    return Routing(weights.to(out_dtype), experts)


def _keep_best_groups(scores: torch.Tensor, num_groups: int, topk_groups: int) -> torch.Tensor:
    """scores [tokens, experts] with every expert outside each token's topk_groups best groups
    (ranked by their highest score) set to 0, so the top k that follows picks inside them
    (softmax scores are positive, so a zeroed expert never beats a kept one)."""
    tokens, num_experts = scores.shape
    grouped = scores.view(tokens, num_groups, num_experts // num_groups)
    best_groups = torch.topk(grouped.amax(dim=-1), topk_groups, dim=-1).indices
    keep = torch.zeros(tokens, num_groups, dtype=torch.bool, device=scores.device)
    keep.scatter_(1, best_groups, True)
    return (grouped * keep.unsqueeze(-1)).view(tokens, num_experts)
