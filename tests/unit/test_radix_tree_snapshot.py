"""The dashboard's picture of the radix tree: true totals, shared prefixes as branches, bounded
size, pinned branches marked; served by a real scheduler through Engine.get_radix_tree and
/dashboard/state."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from radixserve.mem_cache.radix_cache import RadixCache
from radixserve.mem_cache.tree_snapshot import tree_snapshot


def _insert(cache: RadixCache, key: list[int], start: int) -> None:
    cache.insert(key, torch.arange(start, start + len(key), dtype=torch.int64))


def _walk(entry: dict[str, Any]) -> list[dict[str, Any]]:
    out = [entry]
    for child in entry["children"]:
        out += _walk(child)
    return out


def test_shared_prefix_is_one_branch_with_two_children() -> None:
    cache = RadixCache()
    _insert(cache, [1, 2, 3, 4, 5, 6], 0)
    _insert(cache, [1, 2, 3, 4, 9, 9, 9], 100)
    snap = tree_snapshot(cache.root, decode=lambda ids: " ".join(map(str, ids)))
    assert snap["tokens"] == 4 + 2 + 3 and snap["nodes"] == 3 and snap["shown"] == 3
    (shared,) = snap["root"]["children"]
    assert shared["tokens"] == 4 and shared["subtree_tokens"] == 9 and shared["text"] == "1 2 3 4"
    assert [c["tokens"] for c in shared["children"]] == [3, 2]  # heaviest first
    assert not any(e["locked"] for e in _walk(snap["root"])[1:])


def test_locked_branch_is_marked() -> None:
    cache = RadixCache()
    _insert(cache, [1, 2, 3], 0)
    _insert(cache, [7, 8], 10)
    match = cache.match_prefix([1, 2, 3])
    cache.inc_lock_ref(match.last_node)
    snap = tree_snapshot(cache.root)
    locked = {e["tokens"]: e["locked"] for e in snap["root"]["children"]}
    assert locked == {3: True, 2: False}


def test_large_tree_is_bounded_and_keeps_true_totals() -> None:
    cache = RadixCache()
    for i in range(300):  # 300 branches of different sizes under one shared 5-token prefix
        _insert(cache, [1, 2, 3, 4, 5, 1000 + i] + [7] * (i % 13), i * 100)
    snap = tree_snapshot(cache.root, max_nodes=40)
    assert snap["nodes"] == 301 and snap["shown"] == 40
    entries = _walk(snap["root"])
    assert len(entries) == 41  # root + the shown nodes
    # Every parent's shown children plus the folded remainder add up to its subtree.
    for e in entries:
        below = sum(c["subtree_tokens"] for c in e["children"]) + e["other_tokens"]
        assert e["subtree_tokens"] == e["tokens"] + below
    assert snap["tokens"] == cache.total_size()
    shown_leaves = sorted(c["subtree_tokens"] for c in entries[1]["children"])
    # Branch sizes are 1..13, 23 of each size 13 and 12: the 39 shown are the largest.
    assert shown_leaves[0] == 12 and shown_leaves[-1] == 13


def test_deep_chain_does_not_recurse() -> None:
    # A 5,000-level chain (a long conversation split at every turn), deeper than Python's
    # recursion limit; nodes built directly, as inserting that many keys would be slow.
    root = SimpleNamespace(id=0, key=[], children={}, lock_ref=0, hit_count=0)
    node = root
    for i in range(1, 5001):
        child = SimpleNamespace(id=i, key=[i, i], children={}, lock_ref=0, hit_count=0)
        node.children[i] = child
        node = child
    snap = tree_snapshot(root, max_nodes=10)
    assert snap["nodes"] == 5000 and snap["shown"] == 10 and snap["tokens"] == 10_000
    assert snap["root"]["children"][0]["subtree_tokens"] == 10_000


def test_engine_serves_the_scheduler_tree(tmp_path: Path) -> None:
    from radixserve.entrypoints.engine import Engine
    from tests.helpers.tiny_models import make_tiny_checkpoint, save_word_tokenizer

    make_tiny_checkpoint(tmp_path, vocab_size=256)
    save_word_tokenizer(tmp_path)
    engine = Engine(
        model_path=str(tmp_path), runtime="thread", dtype="float32", max_total_tokens=1024
    )
    try:
        # w1/w2 are bos/eos and split "w1x"/"w2x" words, so the prompt keeps to w30 and up.
        shared = " ".join(f"w{i}" for i in range(30, 60))
        for tail in ("w70 w71", "w80 w81 w82"):
            engine.generate(prompt=f"{shared} {tail}", sampling_params={"max_new_tokens": 3})
        snap = engine.get_radix_tree()
        assert snap is not None and snap["tokens"] > 30
        (prefix,) = snap["root"]["children"]
        assert prefix["tokens"] >= 30 and len(prefix["children"]) == 2
        assert prefix["text"].startswith("w30 w31")
    finally:
        engine.shutdown()
    with Engine(
        model_path=str(tmp_path),
        runtime="thread",
        dtype="float32",
        max_total_tokens=1024,
        disable_radix_cache=True,
    ) as no_cache:
        assert no_cache.get_radix_tree() is None
