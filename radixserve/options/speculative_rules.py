"""Cross-option rules of speculative decoding: which algorithms run here and with what."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixserve.options.errors import ServerArgsError

IMPLEMENTED_ALGORITHMS = ("NGRAM", "STANDALONE", "EAGLE", "EAGLE3")
# Algorithms that need a draft model or head given by --speculative-draft-model-path.
_DRAFT_ALGORITHMS = ("STANDALONE", "EAGLE", "EAGLE3")
# Multi-token-prediction layers built into the target checkpoint (DeepSeek-V3 style).
_MTP_ALGORITHMS = ("NEXTN", "MTP")


def check_speculative(v: Mapping[str, Any]) -> None:
    """Raise ServerArgsError for an algorithm or setting that cannot run."""
    algo = v.get("speculative_algorithm")
    if algo is None:
        if v.get("speculative_adaptive"):
            raise ServerArgsError(
                "--speculative-adaptive",
                "needs --speculative-algorithm NGRAM, STANDALONE, EAGLE or EAGLE3",
            )
        return
    name = str(algo).upper()
    if name in _MTP_ALGORITHMS:
        raise ServerArgsError(
            "--speculative-algorithm",
            f"{algo} runs a model's own multi-token-prediction layers, and none of the "
            "supported architectures has them; use EAGLE or EAGLE3 with a trained head, "
            "STANDALONE or NGRAM",
        )
    if name not in IMPLEMENTED_ALGORITHMS:
        raise ServerArgsError(
            "--speculative-algorithm",
            f"{algo} is not supported (supported: {', '.join(IMPLEMENTED_ALGORITHMS)})",
        )
    draft = v.get("speculative_draft_model_path")
    if name in _DRAFT_ALGORITHMS:
        if not draft:
            what = "a draft model" if name == "STANDALONE" else "a trained draft head"
            raise ServerArgsError(
                "--speculative-draft-model-path", f"{name} needs {what}; give its path"
            )
        if v.get("tp_size", 1) != 1:
            raise ServerArgsError("--tp-size", f"{name} speculation runs with --tp-size 1 only")
    elif draft:
        raise ServerArgsError(
            "--speculative-draft-model-path",
            f"is only used with STANDALONE, EAGLE or EAGLE3, not {algo}",
        )
    if v.get("speculative_token_map") and name != "EAGLE":
        raise ServerArgsError(
            "--speculative-token-map",
            f"is used with EAGLE heads only, not {algo}"
            + (
                " (an EAGLE3 head carries its own draft vocabulary, d2t)"
                if name == "EAGLE3"
                else ""
            ),
        )
    steps = v.get("speculative_num_steps")
    if steps is not None and steps < 1:
        raise ServerArgsError("--speculative-num-steps", f"must be >= 1, got {steps}")
    num = v.get("speculative_num_draft_tokens")
    topk = _check_branching(v, name)
    if steps is not None and num is not None:
        if topk == 1 and num != steps + 1:
            raise ServerArgsError(
                "--speculative-num-draft-tokens",
                "with --speculative-eagle-topk 1 verification is a chain, so it must be "
                f"--speculative-num-steps + 1 ({steps + 1}), got {num}",
            )
        if num - 1 > topk * steps:
            raise ServerArgsError(
                "--speculative-num-draft-tokens",
                f"a draft tree of {steps} steps x {topk} candidates has at most "
                f"{topk * steps} drafts, so it must be <= {topk * steps + 1}, got {num}",
            )
    if num is not None and num < 2:
        raise ServerArgsError(
            "--speculative-num-draft-tokens",
            f"must be >= 2 (the verified token plus at least one draft), got {num}",
        )
    depth = v.get("speculative_ngram_max_trie_depth")
    if depth is not None and depth < 2:
        raise ServerArgsError("--speculative-ngram-max-trie-depth", f"must be >= 2, got {depth}")
    capacity = v.get("speculative_ngram_capacity")
    if capacity is not None and capacity < 1:
        raise ServerArgsError("--speculative-ngram-capacity", f"must be >= 1, got {capacity}")


def _check_branching(v: Mapping[str, Any], algo: str) -> int:
    """Validate the options that make drafts a tree; returns --speculative-eagle-topk (1 when
    not given)."""
    topk = v.get("speculative_eagle_topk")
    if topk is not None and topk < 1:
        raise ServerArgsError("--speculative-eagle-topk", f"must be >= 1, got {topk}")
    if topk is not None and algo == "NGRAM" and topk != 1:
        raise ServerArgsError(
            "--speculative-eagle-topk",
            "is for draft models; NGRAM branches per --speculative-ngram-min-bfs-breadth / "
            "--speculative-ngram-max-bfs-breadth",
        )
    low = v.get("speculative_ngram_min_bfs_breadth", 1)
    high = v.get("speculative_ngram_max_bfs_breadth", 10)
    if low < 1:
        raise ServerArgsError("--speculative-ngram-min-bfs-breadth", f"must be >= 1, got {low}")
    if high < low:
        raise ServerArgsError(
            "--speculative-ngram-max-bfs-breadth",
            f"must be >= --speculative-ngram-min-bfs-breadth ({low}), got {high}",
        )
    return topk or 1
