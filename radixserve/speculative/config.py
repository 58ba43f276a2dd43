"""The speculative decoding settings the scheduler runs with, resolved from ServerArgs once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Verify width when neither --speculative-num-draft-tokens nor --speculative-num-steps is given:
# the last verified token plus seven drafts. A CPU forward over 8 tokens costs about what one
# over 1 does (weights dominate).
DEFAULT_NUM_DRAFT_TOKENS = 8


@dataclass(frozen=True)
class SpecConfig:
    """``num_draft_tokens`` counts every token of a verify pass (SGLang's meaning): the last
    verified token plus up to ``num_draft_tokens - 1`` drafts per request, as a chain or, with
    ``eagle_topk`` > 1 (STANDALONE) or an n-gram BFS breadth > 1 (NGRAM), as a tree."""

    algorithm: str
    num_draft_tokens: int
    num_steps: int = 0  # STANDALONE: draft model steps per round (the tree's depth)
    eagle_topk: int = 1  # STANDALONE: candidates kept per draft step
    ngram_min_bfs_breadth: int = 1
    ngram_max_bfs_breadth: int = 1
    ngram_max_trie_depth: int = 18
    ngram_capacity: int = 10_000_000
    draft_model_path: str = ""
    adaptive: bool = False  # --speculative-adaptive: per-request draft lengths (adaptive.py)
    token_map: str = ""  # EAGLE: --speculative-token-map, the tokens the head may draft

    @property
    def max_drafts(self) -> int:
        return self.num_draft_tokens - 1

    @property
    def trees(self) -> bool:
        """Whether drafts may branch (else every round verifies a chain)."""
        if self.algorithm == "NGRAM":
            return self.ngram_max_bfs_breadth > 1
        return self.eagle_topk > 1

    @classmethod
    def from_args(cls, args: Any) -> SpecConfig | None:
        algo = args.speculative_algorithm
        if algo is None:
            return None
        algo = str(algo).upper()
        steps = args.speculative_num_steps
        num = args.speculative_num_draft_tokens
        if num is None:  # a chain: num_steps drafts plus the verified token
            num = steps + 1 if steps is not None else DEFAULT_NUM_DRAFT_TOKENS
        return cls(
            algorithm=algo,
            num_draft_tokens=num,
            num_steps=steps if steps is not None else num - 1,
            eagle_topk=args.speculative_eagle_topk or 1,
            ngram_min_bfs_breadth=args.speculative_ngram_min_bfs_breadth,
            ngram_max_bfs_breadth=args.speculative_ngram_max_bfs_breadth,
            ngram_max_trie_depth=args.speculative_ngram_max_trie_depth,
            ngram_capacity=args.speculative_ngram_capacity,
            draft_model_path=args.speculative_draft_model_path or "",
            adaptive=bool(args.speculative_adaptive),
            token_map=args.speculative_token_map or "",
        )
