"""Draft tokens as a tree: several candidate continuations verified in one target forward.

Node 0 is the request's last verified token (its KV is not cached yet, as in plain decoding);
nodes 1..n are drafts, each after its parent's token. Nodes are numbered so that a parent comes
before its children, and node i's KV goes to the request's KV position ``kv_len + i`` (a chain,
where node i's parent is i - 1, is the old single-branch layout).

Verification needs every node to attend to the cached context plus its own ancestors, not to
its siblings' branches. The attention kernels know only causal rows (keys [0, prefix + row]), so
the tree is cut into chains (`chains`): each chain is a run of nodes where each is the next's
parent, verified as its own extend row whose table row lists the context's slots, then the
slots of the chain's ancestors, then its own. Every node is computed once; all KV of a layer is
stored before any row of that layer attends, so a chain can read ancestors computed in another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DraftTree:
    """``tokens[i - 1]`` and ``parents[i - 1]`` are draft node i's token and parent (0: the
    root); every parent index is smaller than its child's."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    depths: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("a draft tree needs one parent per token")
        depths = [0]
        for i, parent in enumerate(self.parents, start=1):
            if not 0 <= parent < i:
                raise ValueError(f"draft node {i}: parent {parent} is not an earlier node")
            depths.append(depths[parent] + 1)
        object.__setattr__(self, "depths", tuple(depths))

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> DraftTree:
        return cls(tuple(tokens), tuple(range(len(tokens))))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(parent == i for i, parent in enumerate(self.parents))

    def token(self, node: int) -> int:
        return self.tokens[node - 1]

    def children(self, node: int) -> list[int]:
        return [i for i, parent in enumerate(self.parents, start=1) if parent == node]

    def subtree(self, keep: Sequence[int]) -> DraftTree:
        """The tree of the kept draft nodes (each kept node's parent must be kept or the root),
        renumbered in their order."""
        index = {0: 0}
        tokens: list[int] = []
        parents: list[int] = []
        for node in sorted(keep):
            index[node] = len(tokens) + 1
            tokens.append(self.token(node))
            parents.append(index[self.parents[node - 1]])
        return DraftTree(tuple(tokens), tuple(parents))

    def child_with_token(self, node: int, token: int) -> int | None:
        """The first child of `node` carrying `token` (siblings carry distinct tokens)."""
        for i, (tok, parent) in enumerate(zip(self.tokens, self.parents, strict=True), start=1):
            if parent == node and tok == token:
                return i
        return None

    def path(self, node: int) -> list[int]:
        """Draft nodes from the root's child down to `node` (empty for the root)."""
        nodes: list[int] = []
        while node:
            nodes.append(node)
            node = self.parents[node - 1]
        return nodes[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.token(n) for n in self.path(node)]

    def chains(self) -> list[list[int]]:
        """The tree cut into parent-to-child runs, root's run first; a node continues its
        parent's run when it is the parent's first child, else starts a new run."""
        runs: list[list[int]] = [[0]]
        run_ending_at = {0: 0}
        for node, parent in enumerate(self.parents, start=1):
            run = run_ending_at.pop(parent, None)
            if run is None:
                run = len(runs)
                runs.append([])
            runs[run].append(node)
            run_ending_at[node] = run
        return runs
