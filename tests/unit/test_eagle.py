"""EAGLE / EAGLE3 speculation with trained-head checkpoints written by the tests (SGLang's
layout): greedy output equals plain decoding whatever the head proposes, an exact head has every
draft accepted, the head reads the target's features of exactly the right positions (final
hidden states for EAGLE, three layers' inputs for EAGLE3) through chunked prefill, radix cache
hits and verify rounds, and bad heads are refused with clear errors."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.speculative.eagle_draft import EagleDraft
from tests.unit.eagle_heads import (
    bigram_oracle_head,
    write_bigram_target,
    write_eagle3_head,
    write_eagle_head,
)
from tests.unit.tiny_model import TINY_VOCAB, make_tiny_engine, tiny_engines, write_tiny_llama


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("eagle-target"))


@pytest.fixture(scope="module")
def heads(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eagle-heads")
    return {
        "EAGLE": write_eagle_head(root / "eagle", target_dir),
        # The tiny target has 2 layers: read the inputs of layers 1, 1 and the final output.
        "EAGLE3": write_eagle3_head(
            root / "eagle3", target_dir, draft_vocab=128, aux_layer_ids=[0, 0, 1]
        ),
    }


@pytest.fixture
def make(target_dir: Path) -> Iterator[Any]:
    with tiny_engines(target_dir) as factory:
        yield factory


def prompts() -> list[list[int]]:
    rng = random.Random(1)
    out = [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randint(5, 70))] for _ in range(5)]
    shared = [rng.randrange(3, TINY_VOCAB) for _ in range(40)]
    out += [shared + [5, 6, 7], shared + [9, 10]]  # the second hits the radix cache
    return out


def greedy(max_new: int = 30) -> dict[str, Any]:
    return {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}


def ids(results: list[dict[str, Any]]) -> list[list[int]]:
    return [r["output_ids"] for r in results]


def assert_idle(engine: Any) -> None:
    info = engine.get_server_info()
    assert info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
    assert info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]
    draft = engine.scheduler.spec.draft
    assert draft.allocator.available_size() == draft.allocator.size


@contextlib.contextmanager
def recorded_drafts() -> Iterator[list[int]]:
    """Every draft token EAGLE heads propose while the block runs."""
    proposed: list[int] = []
    real_propose = EagleDraft.propose

    def spy(self: EagleDraft, reqs: Any, rooms: Any) -> Any:
        trees = real_propose(self, reqs, rooms)
        proposed.extend(t for tree in trees for t in tree.tokens)
        return trees

    EagleDraft.propose = spy  # type: ignore[method-assign]
    try:
        yield proposed
    finally:
        EagleDraft.propose = real_propose  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def baseline(target_dir: Path) -> list[list[int]]:
    engine = make_tiny_engine(target_dir)
    try:
        return ids(engine.generate(input_ids=prompts(), sampling_params=greedy()))
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    ("algorithm", "kwargs"),
    [
        ("EAGLE", {}),
        ("EAGLE", {"page_size": 4, "chunked_prefill_size": 16}),
        (
            "EAGLE",
            {
                "speculative_eagle_topk": 3,
                "speculative_num_steps": 3,
                "speculative_num_draft_tokens": 7,
            },
        ),
        ("EAGLE3", {}),
        (
            "EAGLE3",
            {
                "speculative_eagle_topk": 2,
                "speculative_num_steps": 4,
                "speculative_num_draft_tokens": 6,
                "disable_radix_cache": True,
            },
        ),
    ],
)
def test_random_head_keeps_greedy_output(
    make: Any,
    heads: dict[str, Path],
    baseline: list[list[int]],
    algorithm: str,
    kwargs: dict[str, Any],
) -> None:
    engine = make(
        speculative_algorithm=algorithm,
        speculative_draft_model_path=str(heads[algorithm]),
        **kwargs,
    )
    # Sequentially as well as batched, so later requests hit prefixes cached by earlier ones.
    batched = engine.generate(input_ids=prompts(), sampling_params=greedy())
    one_by_one = [engine.generate(input_ids=p, sampling_params=greedy()) for p in prompts()]
    assert ids(batched) == baseline
    assert [r["output_ids"] for r in one_by_one] == baseline
    assert all(r["meta_info"]["spec_draft_token_num"] > 0 for r in batched)
    assert_idle(engine)


def test_eagle3_drafts_only_its_draft_vocabulary(make: Any, heads: dict[str, Path]) -> None:
    engine = make(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(heads["EAGLE3"]))
    head = engine.scheduler.spec.draft.runner.model
    hidden = torch.randn(3, head.config.hidden_size)
    logits = head.compute_logits(hidden)
    assert logits.shape == (3, TINY_VOCAB)
    hot = torch.arange(128) * (TINY_VOCAB // 128)  # what write_eagle3_head's d2t maps to
    assert torch.isfinite(logits[:, hot]).all()
    cold = torch.ones(TINY_VOCAB, dtype=torch.bool)
    cold[hot] = False
    assert torch.isinf(logits[:, cold]).all()
    with recorded_drafts() as proposed:
        engine.generate(input_ids=prompts()[:3], sampling_params=greedy(12))
    assert proposed and set(proposed) <= set(hot.tolist())


@pytest.mark.parametrize("topk", [1, 2])
def test_exact_head_has_every_draft_accepted(tmp_path: Path, topk: int) -> None:
    target, tensors = write_bigram_target(tmp_path / "target")
    head = bigram_oracle_head(tmp_path / "head", target, tensors)
    with tiny_engines(target, load_format="auto") as make_engine:
        plain = ids(make_engine().generate(input_ids=prompts(), sampling_params=greedy()))
        spec = {"speculative_num_steps": 3}
        if topk > 1:
            spec.update(speculative_eagle_topk=topk, speculative_num_draft_tokens=5)
        engine = make_engine(
            speculative_algorithm="EAGLE", speculative_draft_model_path=str(head), **spec
        )
        results = engine.generate(input_ids=prompts(), sampling_params=greedy())
        assert ids(results) == plain
        for r in results:
            meta = r["meta_info"]
            # 29 tokens after the prefill's: 7 rounds keep all 3 drafts plus the target's own
            # token, and a last round has room for no draft.
            assert meta["spec_accept_token_num"] == 21
            assert meta["spec_verify_ct"] == 8
        assert_idle(engine)


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_head_reads_target_features_of_each_position(
    make: Any, heads: dict[str, Path], algorithm: str
) -> None:
    """Each catch-up row at position p gets the target's features at p, as a plain prefill of
    the whole final sequence computes them (chunked prefill, a cached prefix and verify rounds
    included)."""
    engine = make(
        speculative_algorithm=algorithm,
        speculative_draft_model_path=str(heads[algorithm]),
        chunked_prefill_size=16,
        speculative_eagle_topk=2,
        speculative_num_steps=2,
        speculative_num_draft_tokens=3,
    )
    seen: list[tuple[list[int], list[int], torch.Tensor]] = []  # (tokens, positions, features)
    bases: list[int] = []  # where each request's features began
    real = EagleDraft._catch_up_inputs

    def spy(self: EagleDraft, reqs: Any) -> Any:
        step, last_rows = real(self, reqs)
        offset = 0
        for req, n in zip(reqs, step.extend_lens, strict=True):
            positions = step.positions[offset : offset + n]
            seen.append((list(req.fill_ids), positions, step.spec_hidden[offset : offset + n]))
            bases.append(req.spec_state.base)
            offset += n
        return step, last_rows

    EagleDraft._catch_up_inputs = spy  # type: ignore[method-assign]
    try:
        for p in prompts()[-3:]:  # the last two share a 40-token prefix
            engine.generate(input_ids=p, sampling_params=greedy(20))
    finally:
        EagleDraft._catch_up_inputs = real  # type: ignore[method-assign]
    capture = engine.scheduler.step_runner.runner.capture_layers
    reference = make(disable_radix_cache=True)
    ref_runner = reference.scheduler.step_runner.runner
    ref_runner.capture_layers = capture
    ref_runner.capture_final = not capture
    features: list[torch.Tensor] = []
    reference.scheduler.step_runner.on_features = lambda r, s, n, f: features.append(f)
    for tokens, positions, rows in seen:
        features.clear()
        reference.generate(input_ids=tokens, sampling_params=greedy(1))
        full = features[0]
        assert full.shape[0] == len(tokens)
        torch.testing.assert_close(rows, full[positions], atol=2e-5, rtol=1e-4)
    assert max(bases) >= 40  # a request's features began after its prefix from the radix cache
    assert len(seen) > 10


def test_bad_heads_are_refused(
    make: Any, target_dir: Path, heads: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="needs a LlamaForCausalLMEagle3"):
        make(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(heads["EAGLE"]))
    with pytest.raises(ValueError, match="is not an EAGLE head"):
        make(speculative_algorithm="EAGLE", speculative_draft_model_path=str(target_dir))
    with pytest.raises(ValueError, match="is an EAGLE draft head"):
        make_tiny_engine(heads["EAGLE"], load_format="auto")
    # Default EAGLE3 layers (2, L/2, L-3) do not exist in a 2-layer target.
    default_layers = write_eagle3_head(tmp_path / "e3", target_dir)
    with pytest.raises(ValueError, match="eagle_aux_hidden_state_layer_ids"):
        make(speculative_algorithm="EAGLE3", speculative_draft_model_path=str(default_layers))
    other_vocab = write_tiny_llama(tmp_path / "other", vocab_size=256)
    with pytest.raises(ValueError, match="vocabulary"):
        make(
            speculative_algorithm="EAGLE",
            speculative_draft_model_path=str(write_eagle_head(tmp_path / "e1", other_vocab)),
        )


def test_sampled_requests_with_n_and_logprobs(make: Any, heads: dict[str, Path]) -> None:
    engine = make(
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=str(heads["EAGLE3"]),
        speculative_eagle_topk=2,
        speculative_num_steps=2,
        speculative_num_draft_tokens=4,
    )
    params = {"temperature": 0.8, "max_new_tokens": 20, "ignore_eos": True, "n": 2}
    results = engine.generate(input_ids=prompts()[:3], sampling_params=params, return_logprob=True)
    assert len(results) == 6
    for r in results:
        assert len(r["output_ids"]) == 20
        assert r["meta_info"]["finish_reason"]["type"] == "length"
        assert len(r["meta_info"]["output_token_logprobs"]) == 20
    assert_idle(engine)


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_retraction_and_streaming(
    make: Any, heads: dict[str, Path], baseline: list[list[int]], algorithm: str
) -> None:
    rng = random.Random(5)
    inputs = [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randint(5, 60))] for _ in range(16)]
    want = ids(make().generate(input_ids=inputs, sampling_params=greedy()))
    spec = {
        "speculative_algorithm": algorithm,
        "speculative_draft_model_path": str(heads[algorithm]),
    }
    # Too small for every request's draft slots at once: requests are retracted, their head
    # state dropped with their KV, and rebuilt from the features of their re-prefill.
    small = make(**spec, max_total_tokens=256, page_size=4)
    got = small.generate(input_ids=inputs, sampling_params=greedy())
    assert ids(got) == want
    assert sum(r["meta_info"]["num_retractions"] for r in got) > 0
    assert_idle(small)
    engine = make(**spec)
    chunks = list(engine.generate(input_ids=prompts()[0], sampling_params=greedy(), stream=True))
    assert [t for c in chunks for t in c["output_ids"]] == baseline[0]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert_idle(engine)


def test_token_map_limits_drafts_to_its_tokens(
    make: Any, heads: dict[str, Path], baseline: list[list[int]], tmp_path: Path
) -> None:
    token_map = tmp_path / "token_map.pt"
    hot = list(range(0, TINY_VOCAB, 3))
    torch.save(hot, token_map)
    engine = make(
        speculative_algorithm="EAGLE",
        speculative_draft_model_path=str(heads["EAGLE"]),
        speculative_token_map=str(token_map),
        speculative_eagle_topk=2,
        speculative_num_steps=3,
        speculative_num_draft_tokens=5,
    )
    head = engine.scheduler.spec.draft.runner.model
    assert head.lm_head.weight.shape[0] == len(hot)
    with recorded_drafts() as proposed:
        results = engine.generate(input_ids=prompts(), sampling_params=greedy())
    assert ids(results) == baseline
    assert proposed and set(proposed) <= set(hot)
    assert_idle(engine)


def test_exact_head_with_a_token_map_still_hits(tmp_path: Path) -> None:
    """The hot rows are the target's own LM head rows: with every token the target emits in
    the map, the exact head's drafts are all accepted."""
    target, tensors = write_bigram_target(tmp_path / "target")
    head = bigram_oracle_head(tmp_path / "head", target, tensors)
    with tiny_engines(target, load_format="auto") as make_engine:
        plain = make_engine().generate(input_ids=prompts(), sampling_params=greedy())
        token_map = tmp_path / "token_map.pt"
        torch.save(sorted({t for r in plain for t in r["output_ids"]}), token_map)
        engine = make_engine(
            speculative_algorithm="EAGLE",
            speculative_draft_model_path=str(head),
            speculative_num_steps=3,
            speculative_token_map=str(token_map),
        )
        results = engine.generate(input_ids=prompts(), sampling_params=greedy())
        assert ids(results) == ids(plain)
        assert all(r["meta_info"]["spec_accept_token_num"] == 21 for r in results)


def test_bad_token_maps_are_refused(
    make: Any, heads: dict[str, Path], target_dir: Path, tmp_path: Path
) -> None:
    from radixserve.options.errors import ServerArgsError
    from radixserve.server_args import ServerArgs

    with pytest.raises(ServerArgsError, match="EAGLE3 head carries its own draft vocabulary"):
        ServerArgs.from_kwargs(
            model_path=str(target_dir),
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=str(heads["EAGLE3"]),
            speculative_token_map="/x.pt",
        )
    spec = {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": str(heads["EAGLE"])}
    with pytest.raises(ValueError, match="no such file"):
        make(**spec, speculative_token_map=str(tmp_path / "missing.pt"))
    outside = tmp_path / "outside.pt"
    torch.save([1, 2, TINY_VOCAB], outside)
    with pytest.raises(ValueError, match=r"must lie in \[0, 512\)"):
        make(**spec, speculative_token_map=str(outside))
    garbage = tmp_path / "garbage.pt"
    garbage.write_text("not a tensor")
    with pytest.raises(ValueError, match=r"not a \.pt list of token ids"):
        make(**spec, speculative_token_map=str(garbage))


def test_head_forward_equals_transformers_layers(
    make: Any, target_dir: Path, tmp_path: Path
) -> None:
    """The EAGLE-1 head as radixserve runs it (paged KV, its kernels) equals the same head built
    from transformers' Llama decoder layer (input norm removed, as EAGLE does) on the features
    and tokens of a real catch-up step."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    gen = torch.Generator().manual_seed(3)
    norm = 1 + 0.3 * torch.randn(64, generator=gen)
    head_dir = write_eagle_head(
        tmp_path / "head",
        target_dir,
        seed=3,
        tensors={
            "layers.0.post_attention_layernorm.weight": norm,
            "fc.bias": 0.1 * torch.randn(64, generator=gen),
        },
    )
    engine = make(speculative_algorithm="EAGLE", speculative_draft_model_path=str(head_dir))
    steps: list[Any] = []
    real = EagleDraft._catch_up_inputs

    def spy(self: EagleDraft, reqs: Any) -> Any:
        step, last_rows = real(self, reqs)
        steps.append(step)
        return step, last_rows

    EagleDraft._catch_up_inputs = spy  # type: ignore[method-assign]
    try:
        engine.generate(input_ids=max(prompts(), key=len), sampling_params=greedy(4))
    finally:
        EagleDraft._catch_up_inputs = real  # type: ignore[method-assign]
    first = steps[0]
    assert first.positions[0] == 0 and len(first.input_ids) > 20
    draft = engine.scheduler.spec.draft
    # Rerun that step (same slots, same values) with every row's output.
    out = draft.runner.forward(
        first._replace(logits_rows=list(range(len(first.input_ids)))), draft.req_to_token
    )

    cfg = LlamaConfig.from_pretrained(head_dir)
    cfg._attn_implementation = "eager"
    weights = load_file(str(head_dir / "model.safetensors"))
    layer = LlamaDecoderLayer(cfg, 0)
    missing = layer.load_state_dict(
        {k.removeprefix("layers.0."): v for k, v in weights.items() if k.startswith("layers.0.")},
        strict=False,
    ).missing_keys
    assert missing == ["input_layernorm.weight"]
    layer.input_layernorm = torch.nn.Identity()
    fc = torch.nn.Linear(128, 64)
    fc.load_state_dict({"weight": weights["fc.weight"], "bias": weights["fc.bias"]})
    embed = engine.scheduler.step_runner.runner.model.model.embed_tokens.weight
    n = len(first.input_ids)
    with torch.no_grad():
        x = fc(torch.cat([embed[torch.tensor(first.input_ids)], first.spec_hidden], dim=-1))[None]
        pos = torch.arange(n)[None]
        cos_sin = LlamaRotaryEmbedding(cfg)(x, pos)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        want = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)[0]
    torch.testing.assert_close(out.features, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.logits, want @ embed.T, atol=1e-3, rtol=1e-4)
