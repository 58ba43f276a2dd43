"""Speculative acceptance keeps the target distribution: greedy acceptance is plain argmax
decoding, and rejection sampling of deterministic drafts emits tokens distributed exactly as the
sampler's (checked by chi-square over many draws, on a small vocabulary and on a tiny model)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.speculative.acceptance import accept_tree, target_probs
from radixserve.speculative.draft_tree import DraftTree
from tests.unit.tiny_model import write_tiny_llama

VOCAB = 6
TRIALS = 5000  # draws per check: the chi-square bound below has a ~0.05% false alarm rate


def chi_square_limit(df: int) -> float:
    """A bound the statistic exceeds with probability well under 0.1% (Wilson-Hilferty)."""
    z = 3.3
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi_square(counts: Counter[int], probs: list[float], total: int) -> tuple[float, int]:
    stat, df = 0.0, -1
    for token, p in enumerate(probs):
        if p == 0:
            assert counts[token] == 0, f"token {token} has probability 0 but was drawn"
            continue
        expected = p * total
        stat += (counts[token] - expected) ** 2 / expected
        df += 1
    return stat, df


def info_for(params: dict[str, Any], rows: int) -> SamplingBatchInfo:
    p = SamplingParams.from_dict(params)
    return SamplingBatchInfo.from_requests([p] * rows, [[]] * rows, VOCAB, "cpu")


def accept_greedy(argmax_rows: list[int], drafts: list[int]) -> list[int]:
    """Tokens a greedy request emits for a chain of drafts."""
    return accept_tree(DraftTree.chain(drafts), argmax_rows, None)[0]


def accept_sampled(probs: torch.Tensor, drafts: list[int], generator: torch.Generator) -> list[int]:
    """Tokens a sampled request emits for a chain of drafts."""
    return accept_tree(DraftTree.chain(drafts), None, probs, generator)[0]


def test_accept_greedy_is_argmax_decoding() -> None:
    assert accept_greedy([4, 5, 6], [4, 5]) == [4, 5, 6]  # all accepted + bonus
    assert accept_greedy([4, 1, 6], [4, 5]) == [4, 1]  # second rejected: target's own token
    assert accept_greedy([2, 5, 6], [4, 5]) == [2]


def test_target_probs_match_the_sampler_filters() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    probs = target_probs(logits, info_for({"temperature": 0.5, "top_k": 3}, 1))[0]
    manual = torch.softmax(logits[0, :3] / 0.5, dim=-1)
    assert torch.allclose(probs[:3], manual) and probs[3:].sum() == 0
    probs = target_probs(logits, info_for({"temperature": 1.0, "top_p": 0.6}, 1))[0]
    # Token 0 holds 0.56 of the mass, so top_p 0.6 keeps tokens 0 and 1, renormalised.
    assert probs[0] == pytest.approx(math.e / (math.e + 1), rel=1e-5)
    assert probs[2:].sum() == 0


@pytest.mark.parametrize("draft", [0, 2, 5])  # the likeliest, a middling, a filtered-out token
def test_rejection_sampling_keeps_the_target_distribution(draft: int) -> None:
    logits = torch.tensor([[1.5, 1.0, 0.8, 0.2, -0.5, -4.0], [0.1, 0.3, 2.0, -1.0, 0.0, 0.5]])
    params = {"temperature": 0.9, "top_k": 5}
    probs = target_probs(logits, info_for(params, 2))
    p0, p1 = probs[0].tolist(), probs[1].tolist()
    gen = torch.Generator().manual_seed(1234 + draft)
    trials = TRIALS
    first: Counter[int] = Counter()
    second: Counter[int] = Counter()
    accepted = 0
    for _ in range(trials):
        out = accept_sampled(probs, [draft], generator=gen)
        first[out[0]] += 1
        if len(out) == 2:  # the draft was accepted: the bonus comes from row 1
            accepted += 1
            second[out[1]] += 1
    stat, df = chi_square(first, p0, trials)
    assert stat < chi_square_limit(df), (stat, df, first, p0)
    assert accepted / trials == pytest.approx(p0[draft], abs=4 * math.sqrt(0.25 / trials))
    if accepted > 300:
        stat, df = chi_square(second, p1, accepted)
        assert stat < chi_square_limit(df), (stat, df, second, p1)


def test_two_draft_chain_keeps_the_joint_distribution() -> None:
    logits = torch.tensor(
        [[1.0, 0.9, 0.0, -0.5, -1, -2], [0.2, 1.2, 0.1, 0.0, -1, -2], [0, 0, 1.0, 0.5, 0, 0]]
    )
    probs = target_probs(logits, info_for({"temperature": 1.0}, 3))
    p = probs.tolist()
    gen = torch.Generator().manual_seed(7)
    trials = TRIALS
    # Draft chain [0, 1]: the second token's law must be p[1] after the first is 0 (accepted).
    second: Counter[int] = Counter()
    n = 0
    for _ in range(trials):
        out = accept_sampled(probs, [0, 1], generator=gen)
        if len(out) >= 2:
            assert out[0] == 0
            second[out[1]] += 1
            n += 1
    stat, df = chi_square(second, p[1], n)
    assert stat < chi_square_limit(df), (stat, df)


@pytest.mark.slow  # ~25 s: 2 x 1200 sampled requests
def test_tiny_model_sampling_with_ngram_matches_plain_sampling(tmp_path: Path) -> None:
    """Two-sample chi-square on the joint law of the first three sampled tokens, with and
    without speculation, over many requests (each its own draw of the global RNG)."""
    model = write_tiny_llama(tmp_path / "tiny")
    prompt = [7, 8, 9, 10] * 6
    params = {"temperature": 1.0, "top_k": 3, "max_new_tokens": 3, "ignore_eos": True}
    counts: list[Counter[tuple[int, ...]]] = []
    drafted = 0
    for spec in (None, "NGRAM"):
        with Engine(
            runtime="thread",
            model_path=str(model),
            load_format="dummy",
            dtype="float32",
            skip_tokenizer_init=True,
            max_total_tokens=16384,
            random_seed=0,
            speculative_algorithm=spec,
            speculative_num_draft_tokens=3,
        ) as engine:
            out = engine.generate(input_ids=[prompt] * 1200, sampling_params=params)
        counts.append(Counter(tuple(r["output_ids"]) for r in out))
        if spec:
            drafted = sum(r["meta_info"]["spec_draft_token_num"] for r in out)
            accepted = sum(r["meta_info"]["spec_accept_token_num"] for r in out)
            assert 0 < accepted < drafted
    plain, spec_counts = counts
    bins = set(plain) | set(spec_counts)
    stat = sum(
        (plain[b] - spec_counts[b]) ** 2 / (plain[b] + spec_counts[b])
        for b in bins
        if plain[b] + spec_counts[b] >= 5
    )
    df = sum(1 for b in bins if plain[b] + spec_counts[b] >= 5) - 1
    assert df >= 3, bins
    assert stat < chi_square_limit(df), (stat, df, plain, spec_counts)
