"""Tree speculation: draft trees cut into chains, the n-gram BFS and draft-model tree searches,
tree acceptance (greedy and sampled, the latter checked by chi-square), and end to end on a tiny
model: output equal to plain decoding when the right continuation sits on a later branch (so the
accepted branch's KV is moved into place), with NGRAM trees and with STANDALONE --eagle-topk."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.options.errors import ServerArgsError
from radixserve.server_args import ServerArgs
from radixserve.speculative.acceptance import accept_tree, target_probs
from radixserve.speculative.draft_tree import DraftTree
from radixserve.speculative.ngram_cache import NgramCache
from radixserve.speculative.tree_search import TreeSearch
from tests.unit.test_spec_acceptance import TRIALS, chi_square, chi_square_limit, info_for
from tests.unit.test_speculative import (
    NGRAM,
    assert_idle,
    baseline,  # noqa: F401  (a fixture)
    draft_idle,
    greedy,
    ids,
    make,  # noqa: F401  (a fixture)
    prompts,
    tiny_model_dir,  # noqa: F401  (a fixture)
    write_other_tiny_llama,
)
from tests.unit.tiny_model import TINY_VOCAB, tiny_engines, write_tiny_llama

# Root -> (1: 5, 2: 6); 1 -> 3: 7; 2 -> (4: 8, 5: 9); 5 -> 6: 1
TREE = DraftTree(tokens=(5, 6, 7, 8, 9, 1), parents=(0, 0, 1, 2, 2, 5))


def test_draft_tree_shape() -> None:
    assert TREE.depths == (0, 1, 1, 2, 2, 2, 3)
    assert TREE.chains() == [[0, 1, 3], [2, 4], [5, 6]]
    assert TREE.path(6) == [2, 5, 6] and TREE.path_tokens(6) == [6, 9, 1] and TREE.path(0) == []
    assert TREE.children(0) == [1, 2] and TREE.children(2) == [4, 5] and TREE.children(6) == []
    assert TREE.subtree([2, 5]) == DraftTree(tokens=(6, 9), parents=(0, 1))
    assert TREE.child_with_token(2, 9) == 5 and TREE.child_with_token(2, 7) is None
    assert not TREE.is_chain
    chain = DraftTree.chain([4, 4, 2])
    assert chain.is_chain and chain.chains() == [[0, 1, 2, 3]] and chain.depths == (0, 1, 2, 3)
    assert len(DraftTree()) == 0 and DraftTree().chains() == [[0]]
    with pytest.raises(ValueError, match="not an earlier node"):
        DraftTree(tokens=(1, 2), parents=(0, 2))


def test_greedy_tree_acceptance_follows_the_argmax_branch() -> None:
    argmax = [6, 0, 9, 0, 0, 1, 3]  # per node: root says 6 -> node 2 says 9 -> node 5 says 1
    assert accept_tree(TREE, argmax, None) == ([6, 9, 1, 3], [2, 5, 6])
    assert accept_tree(TREE, [5, 2, 0, 0, 0, 0, 0], None) == ([5, 2], [1])  # 1 has no child 2
    assert accept_tree(TREE, [3] * 7, None) == ([3], [])


def test_sampled_tree_acceptance_keeps_the_target_distribution() -> None:
    """Root with two candidates (tokens 0 and 1, each with a child): the first emitted token
    follows the root's row, the second the row of whichever candidate was taken."""
    tree = DraftTree(tokens=(0, 1, 2, 3), parents=(0, 0, 1, 2))
    logits = torch.tensor(
        [
            [1.0, 0.8, 0.2, -0.3, -1.0, -2.0],
            [0.1, 0.2, 1.3, 0.0, -1.0, 0.4],
            [0.5, -0.2, 0.1, 1.1, 0.3, -0.6],
            [0.0] * 6,
            [0.0] * 6,
        ]
    )
    probs = target_probs(logits, info_for({"temperature": 1.0}, 5))
    p = probs.tolist()
    gen = torch.Generator().manual_seed(11)
    first: Counter[int] = Counter()
    after: dict[int, Counter[int]] = {0: Counter(), 1: Counter()}
    for _ in range(TRIALS):
        tokens, path = accept_tree(tree, None, probs, gen)
        first[tokens[0]] += 1
        if tokens[0] in after:
            assert path[0] == tokens[0] + 1  # node 1 carries token 0, node 2 token 1
            after[tokens[0]][tokens[1]] += 1
        else:
            assert path == [] and len(tokens) == 1
    stat, df = chi_square(first, p[0], TRIALS)
    assert stat < chi_square_limit(df), (stat, df)
    for token, node in ((0, 1), (1, 2)):
        stat, df = chi_square(after[token], p[node], first[token])
        assert stat < chi_square_limit(df), (token, stat, df)


def test_ngram_bfs_tree_branches_on_short_contexts_only() -> None:
    cache = NgramCache(max_depth=4, capacity=10_000)
    frontier = cache.sync(None, [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2])
    # "1 2" was followed by 3 twice and by 4 once: a two-token match earns two branches.
    assert cache.breadth_for(2, 1, 3) == 2 and cache.breadth_for(3, 1, 3) == 1
    assert cache.breadth_for(1, 1, 3) == 3
    tree = cache.propose_tree(frontier, 4, 1, 3)
    assert tree.tokens[:2] == (3, 4) and tree.parents[:2] == (0, 0)
    assert tree.child_with_token(1, 1) is not None or tree.child_with_token(1, 9) is not None
    chain = cache.propose_tree(frontier, 4, 1, 1)
    assert chain.is_chain and list(chain.tokens) == [3, 9, 1, 2]
    assert len(cache.propose_tree(frontier, 0, 1, 3)) == 0


def test_tree_search_keeps_the_best_paths_with_their_ancestors() -> None:
    search = TreeSearch(topk=2)
    search.grow(-1, torch.log(torch.tensor([0.5, 0.3, 0.2])))
    assert search.advance() == [0, 1]  # tokens 0 and 1
    search.grow(0, torch.log(torch.tensor([0.1, 0.1, 0.8])))  # 0 -> 2 scores 0.4
    search.grow(1, torch.log(torch.tensor([0.9, 0.05, 0.05])))  # 1 -> 0 scores 0.27
    assert search.advance() == [2, 3]
    assert [(n.token, n.parent, n.depth) for n in search.nodes[2:]] == [(2, 0, 2), (0, 1, 2)]
    tree = search.select(3)  # scores: 0.5, 0.4 (0 -> 2), 0.3 (1), 0.27 (1 -> 0)
    assert tree == DraftTree(tokens=(0, 1, 2), parents=(0, 0, 1))
    assert search.select(1) == DraftTree(tokens=(0,), parents=(0,))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({**NGRAM, "speculative_eagle_topk": 2}, "NGRAM branches per"),
        ({**NGRAM, "speculative_ngram_min_bfs_breadth": 0}, "must be >= 1"),
        (
            {**NGRAM, "speculative_ngram_min_bfs_breadth": 5, "speculative_ngram_max_bfs_breadth": 3},
            "--speculative-ngram-max-bfs-breadth",
        ),
        ({"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": "/m",
          "speculative_eagle_topk": 0}, "must be >= 1"),
        ({"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": "/m",
          "speculative_eagle_topk": 2, "speculative_num_steps": 2,
          "speculative_num_draft_tokens": 6}, "at most 4 drafts"),
    ],
)  # fmt: skip
def test_refused_tree_settings(tiny_model_dir: Path, kwargs: dict[str, Any], message: str) -> None:  # noqa: F811
    with pytest.raises(ServerArgsError) as err:
        ServerArgs.from_kwargs(model_path=str(tiny_model_dir), **kwargs)
    assert message in str(err.value)


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # An untied LM head makes the tiny model's output depend on its attention (tied, it
    # repeats its last token), so misplaced KV would show.
    return write_tiny_llama(tmp_path_factory.mktemp("untied"), tie_word_embeddings=False)


@pytest.fixture
def make_untied(untied_dir: Path) -> Iterator[Any]:
    with tiny_engines(untied_dir) as factory:
        yield factory


def oracle_trees(want: dict[tuple[int, ...], list[int]]) -> Any:
    """A proposer that hides the right continuation on the root's second branch, under a wrong
    first one, and a wrong first child under it too: accepting means taking nodes 2, 5, 6."""

    def propose(reqs: Sequence[Any]) -> list[DraftTree]:
        trees = []
        for req in reqs:
            out = want[tuple(req.origin_input_ids)]
            done = len(req.output_ids)
            if done + 3 > len(out) or req.remaining_new_tokens() - 1 < len(TREE):
                trees.append(DraftTree())
                continue
            t0, t1, t2 = out[done : done + 3]

            def other(t: int) -> int:
                return (t + 1) % TINY_VOCAB

            trees.append(
                DraftTree(tokens=(other(t0), t0, t1, other(t1), t1, t2), parents=TREE.parents)
            )
        return trees

    return propose


def test_accepted_later_branch_has_its_kv_moved(make_untied: Any) -> None:
    plain = make_untied()
    inputs = prompts()[:5]
    params = greedy(30)
    want = plain.generate(input_ids=inputs, sampling_params=params, return_logprob=True)
    outputs = {tuple(p): w["output_ids"] for p, w in zip(inputs, want, strict=True)}
    for page_size in (1, 4):
        spec = make_untied(**NGRAM, speculative_num_draft_tokens=7, page_size=page_size)
        worker = spec.scheduler.spec
        worker.propose = oracle_trees(outputs)
        moves: list[int] = []
        copy = worker.step_runner.runner.copy_kv_slots

        def counting_copy(
            src: torch.Tensor, dst: torch.Tensor, copy: Any = copy, moves: list[int] = moves
        ) -> None:
            moves.append(len(src))
            copy(src, dst)

        worker.step_runner.runner.copy_kv_slots = counting_copy
        got = spec.generate(input_ids=inputs, sampling_params=params, return_logprob=True)
        assert ids(got) == ids(want)
        assert sum(moves) > 0
        for g, w in zip(got, want, strict=True):
            assert g["meta_info"]["spec_accept_token_num"] > 0
            # Logprobs read every earlier position's KV: moved KV must be the right KV.
            glps = [lp for lp, *_ in g["meta_info"]["output_token_logprobs"]]
            wlps = [lp for lp, *_ in w["meta_info"]["output_token_logprobs"]]
            assert glps == pytest.approx(wlps, abs=1e-4)
        assert_idle(spec)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"speculative_ngram_min_bfs_breadth": 4, "speculative_ngram_max_bfs_breadth": 4},
        {"speculative_ngram_max_bfs_breadth": 6, "page_size": 4, "chunked_prefill_size": 16},
    ],
)
def test_ngram_trees_equal_plain_decoding(
    make: Any,  # noqa: F811
    baseline: list[list[int]],  # noqa: F811
    kwargs: dict[str, Any],
) -> None:
    engine = make(**NGRAM, **kwargs)
    branched: list[bool] = []
    propose = engine.scheduler.spec.propose

    def spying(reqs: Sequence[Any]) -> list[DraftTree]:
        trees = propose(reqs)
        branched.extend(not t.is_chain for t in trees)
        return trees

    engine.scheduler.spec.propose = spying
    results = engine.generate(input_ids=prompts(), sampling_params=greedy())
    assert ids(results) == baseline
    assert any(branched)
    assert sum(r["meta_info"]["spec_accept_token_num"] for r in results) > 0
    sampled = engine.generate(
        input_ids=prompts(), sampling_params={"temperature": 1.0, "max_new_tokens": 20}
    )
    assert all(1 <= len(r["output_ids"]) <= 20 for r in sampled)
    assert_idle(engine)


def test_standalone_topk_trees(
    make: Any,  # noqa: F811
    baseline: list[list[int]],  # noqa: F811
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    same = make(
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=str(tiny_model_dir),
        speculative_num_steps=3,
        speculative_eagle_topk=2,
        speculative_num_draft_tokens=6,
    )
    results = same.generate(input_ids=prompts(), sampling_params=greedy())
    assert ids(results) == baseline
    for r in results:
        m = r["meta_info"]
        # The draft is the target, so the root's best candidate is always accepted (and more
        # of its branch where the tree kept it); siblings spend the rest of the budget.
        assert m["spec_accept_length"] > 2.0
        assert m["spec_accept_token_num"] < m["spec_draft_token_num"]
    assert_idle(same)
    assert draft_idle(same)
    other = make(
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=str(write_other_tiny_llama(tmp_path / "draft")),
        speculative_num_steps=2,
        speculative_eagle_topk=3,
        page_size=4,
    )
    results = other.generate(input_ids=prompts(), sampling_params=greedy())
    assert ids(results) == baseline
    assert sum(r["meta_info"]["spec_draft_token_num"] for r in results) > 0
    assert_idle(other)
    assert draft_idle(other)
