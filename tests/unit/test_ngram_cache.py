"""The n-gram trie behind NGRAM speculation: what it proposes, depth and capacity limits."""

from __future__ import annotations

from radixserve.speculative.ngram_cache import Frontier, NgramCache


def chain(cache: NgramCache, frontier: Frontier, num_tokens: int) -> list[int]:
    """Drafts at BFS breadth 1: the most frequent continuation, token after token."""
    return list(cache.propose_tree(frontier, num_tokens, 1, 1).tokens)


def test_proposes_what_followed_the_longest_matching_context() -> None:
    cache = NgramCache(max_depth=6, capacity=10_000)
    text = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    frontier = cache.sync(None, text)
    assert chain(cache, frontier, 4) == [4, 5, 6, 7]
    # Appending tokens only inserts the new ones; the draft follows the new context.
    frontier = cache.sync(frontier, [*text, 4, 5, 6, 7, 1])
    assert frontier.num_tokens == 15
    assert chain(cache, frontier, 3) == [2, 3, 4]


def test_nothing_to_propose_for_an_unseen_context() -> None:
    cache = NgramCache(max_depth=4, capacity=10_000)
    frontier = cache.sync(None, [1, 2, 3, 4])
    assert chain(cache, frontier, 5) == []  # 4 never had a successor; no unigram guesses


def test_shared_across_sequences_and_recency_breaks_ties() -> None:
    cache = NgramCache(max_depth=4, capacity=10_000)
    cache.sync(None, [9, 1, 2, 3])
    cache.sync(None, [8, 1, 2, 5])
    other = cache.sync(None, [7, 1, 2])
    # Both 3 and 5 followed [1, 2] once; the more recent (5) wins.
    assert chain(cache, other, 1) == [5]


def test_depth_bounds_the_context_and_capacity_clears() -> None:
    cache = NgramCache(max_depth=3, capacity=10_000)
    frontier = cache.sync(None, list(range(50)))
    assert max(node.depth for node in frontier.nodes) == 2  # contexts of max_depth - 1 tokens
    small = NgramCache(max_depth=4, capacity=20)
    frontier = small.sync(None, list(range(30)))
    assert small.num_nodes == 0 and chain(small, frontier, 3) == []  # cleared when over
    # A stale frontier rebuilds from its whole sequence on the next sync.
    frontier = small.sync(frontier, [1, 2, 3, 1, 2])
    assert chain(small, frontier, 1) == [3]
