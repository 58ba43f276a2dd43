"""A bounded picture of the radix tree for the dashboard: which prefixes are shared, how many
tokens each branch holds, and which branches running requests pin.

The tree can hold thousands of nodes; the picture keeps the `max_nodes` heaviest branches
(by tokens under them), expanding the heaviest first, and folds the rest of each parent's
children into an "other" count so the totals stay true.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

PREVIEW_TOKENS = 12


def subtree_tokens(node: Any) -> dict[int, int]:
    """Tokens on each node's edge plus everything below it, by node id (iterative: trees of
    long chains would overflow Python's recursion limit)."""
    order: list[Any] = []
    stack = [node]
    while stack:
        current = stack.pop()
        order.append(current)
        stack.extend(current.children.values())
    totals: dict[int, int] = {}
    for current in reversed(order):
        below = sum(totals[c.id] for c in current.children.values())
        totals[current.id] = len(current.key) + below
    return totals


def tree_snapshot(
    root: Any,
    decode: Callable[[Sequence[int]], str] | None = None,
    max_nodes: int = 120,
) -> dict[str, Any]:
    """{"tokens", "nodes", "shown", "root": {children: [...]}} where every shown node is
    {"id", "tokens" (its edge), "subtree_tokens", "locked", "hits", "text", "children",
    "other_tokens" (tokens under children left out)}."""
    totals = subtree_tokens(root)
    shown = {root.id: _entry(root, totals, decode)}
    # Max-heap on subtree size: the heaviest branches are expanded first.
    frontier: list[tuple[int, int, Any, dict[str, Any]]] = []
    for child in root.children.values():
        heapq.heappush(frontier, (-totals[child.id], child.id, child, shown[root.id]))
    while frontier and len(shown) - 1 < max_nodes:
        _, _, node, parent_entry = heapq.heappop(frontier)
        entry = _entry(node, totals, decode)
        parent_entry["children"].append(entry)
        shown[node.id] = entry
        for child in node.children.values():
            heapq.heappush(frontier, (-totals[child.id], child.id, child, entry))
    for _, _, node, parent_entry in frontier:
        parent_entry["other_tokens"] += totals[node.id]
    for entry in shown.values():
        entry["children"].sort(key=lambda e: -e["subtree_tokens"])
    return {
        "tokens": totals[root.id],
        "nodes": len(totals) - 1,
        "shown": len(shown) - 1,
        "root": shown[root.id],
    }


def _entry(
    node: Any, totals: dict[int, int], decode: Callable[[Sequence[int]], str] | None
) -> dict[str, Any]:
    head = list(node.key[:PREVIEW_TOKENS])
    text = ""
    if decode is not None and head:
        try:
            text = decode(head)
        except Exception:  # a picture, not a contract: an odd id must not break the poll
            text = ""
    return {
        "id": node.id,
        "tokens": len(node.key),
        "subtree_tokens": totals[node.id],
        "locked": node.lock_ref > 0,
        "hits": getattr(node, "hit_count", 0),
        "text": text,
        "children": [],
        "other_tokens": 0,
    }
