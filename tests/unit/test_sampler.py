from __future__ import annotations

import pytest
import torch

from radixserve.sampling.sampler import Sampler, compute_logprobs
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo, seeded_uniform
from radixserve.sampling.sampling_params import SamplingParams

VOCAB = 16
sampler = Sampler()


def _info(params, outputs=None, vocab=VOCAB, **kwargs) -> SamplingBatchInfo:
    outputs = outputs if outputs is not None else [[] for _ in params]
    return SamplingBatchInfo.from_requests(params, outputs, vocab, "cpu", **kwargs)


def _draws(logits_row: torch.Tensor, params: SamplingParams, rows: int = 4000) -> torch.Tensor:
    """Sample ``rows`` independent draws of one distribution in a single batched call."""
    logits = logits_row.expand(rows, -1).contiguous()
    return sampler(logits, _info([params] * rows, vocab=logits.shape[1])).next_token_ids


@pytest.fixture(autouse=True)
def _seed_global_rng() -> None:
    torch.manual_seed(0)


def test_all_greedy_is_argmax_and_logprobs_match_log_softmax() -> None:
    logits = torch.randn(8, VOCAB)
    out = sampler(logits, _info([SamplingParams(temperature=0.0)] * 8), top_logprobs_num=3)
    assert torch.equal(out.next_token_ids, logits.argmax(-1))
    assert out.next_token_ids.dtype == torch.int64
    expected = torch.log_softmax(logits, -1)
    assert torch.allclose(out.logprobs, expected.gather(-1, logits.argmax(-1, keepdim=True))[:, 0])
    assert out.logprobs.dtype == torch.float32
    values, ids = out.top_logprobs
    ref_values, ref_ids = expected.topk(3, -1)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(values, ref_values, atol=1e-6)


def test_greedy_rows_in_mixed_batch_are_argmax() -> None:
    logits = torch.randn(6, VOCAB)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.5),
        SamplingParams(top_k=1, temperature=0.7),
        SamplingParams(top_p=0.3),
        SamplingParams(temperature=1e-7),
        SamplingParams(min_p=0.2),
    ]
    out = sampler(logits, _info(params))
    for row in (0, 2, 4):
        assert out.next_token_ids[row] == logits[row].argmax()
        # Greedy rows report the untempered log-softmax, whatever their temperature field.
        assert torch.isclose(
            out.logprobs[row], torch.log_softmax(logits[row], -1)[logits[row].argmax()]
        )


def test_greedy_accepts_bfloat16_logits() -> None:
    logits = torch.randn(4, VOCAB).to(torch.bfloat16)
    out = sampler(logits, _info([SamplingParams(temperature=0.0)] * 4))
    assert torch.equal(out.next_token_ids, logits.argmax(-1))


def test_top_k_never_leaves_the_top_k() -> None:
    logits = torch.randn(VOCAB)
    allowed = set(logits.topk(3).indices.tolist())
    draws = set(_draws(logits, SamplingParams(top_k=3, temperature=2.0)).tolist())
    assert draws == allowed  # every allowed token shows up, nothing else does


def test_top_p_never_leaves_the_nucleus() -> None:
    probs = torch.tensor([0.5, 0.25, 0.15, 0.06, 0.04] + [0.0] * 3)
    logits = probs.clamp_min(1e-12).log()
    draws = set(_draws(logits, SamplingParams(top_p=0.8)).tolist())
    # Mass before token 2 is 0.75 < 0.8, so 0..2 survive; mass before 3 is 0.9 >= 0.8.
    assert draws == {0, 1, 2}


def test_top_p_applies_after_top_k_renormalisation() -> None:
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    # Top-2 renormalised: [4/7, 3/7]; mass before token 1 is 4/7 ~ 0.571 < 0.6.
    draws = set(_draws(logits, SamplingParams(top_k=2, top_p=0.6)).tolist())
    assert draws == {0, 1}


def test_min_p_never_samples_below_threshold() -> None:
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    draws = set(_draws(probs.log(), SamplingParams(min_p=0.3)).tolist())
    assert draws == {0, 1, 2}  # threshold 0.12


def test_min_p_with_top_k() -> None:
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    draws = set(_draws(probs.log(), SamplingParams(min_p=0.3, top_k=2)).tolist())
    assert draws == {0, 1}


def test_unfiltered_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.2])
    draws = _draws(probs.log(), SamplingParams(), rows=20000)
    freq = torch.bincount(draws, minlength=3).float() / draws.numel()
    assert torch.allclose(freq, probs, atol=0.02)


def test_temperature_sharpens_and_flattens() -> None:
    logits = torch.tensor([1.0, 0.0, -1.0, -2.0])

    def top_share(temperature: float) -> float:
        draws = _draws(logits, SamplingParams(temperature=temperature))
        return float((draws == 0).float().mean())

    cold, warm, hot = top_share(0.1), top_share(1.0), top_share(10.0)
    assert cold > 0.99
    assert 0.55 < warm < 0.75  # softmax(logits)[0] ~ 0.644
    assert hot < 0.35


def test_logit_bias_forces_a_token() -> None:
    logits = torch.randn(VOCAB)
    params = SamplingParams(logit_bias={5: 100.0})
    assert set(_draws(logits, params, rows=500).tolist()) == {5}
    greedy = SamplingParams(temperature=0.0, logit_bias={7: 100.0})
    assert sampler(logits.unsqueeze(0), _info([greedy])).next_token_ids.item() == 7


def test_min_new_tokens_blocks_eos() -> None:
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 2] = 10.0  # EOS is by far the likeliest token
    p = SamplingParams(temperature=0.0, min_new_tokens=3)
    blocked = _info([p], outputs=[[4, 4]], eos_token_ids=[2])
    assert sampler(logits, blocked).next_token_ids.item() != 2
    released = _info([p], outputs=[[4, 4, 4]], eos_token_ids=[2])
    assert sampler(logits, released).next_token_ids.item() == 2
    sampled = SamplingParams(min_new_tokens=3)
    rows = 500
    info = _info([sampled] * rows, outputs=[[1]] * rows, eos_token_ids=[2])
    assert 2 not in sampler(logits.expand(rows, -1).contiguous(), info).next_token_ids.tolist()


def test_vocab_mask_is_respected() -> None:
    rows = 2000
    logits = torch.randn(rows, VOCAB)
    mask = torch.zeros(rows, VOCAB, dtype=torch.bool)
    mask[:, [3, 9, 11]] = True
    params = [SamplingParams(temperature=3.0)] * (rows // 2) + [SamplingParams(temperature=0.0)] * (
        rows // 2
    )
    out = sampler(logits, _info(params, vocab_mask=mask))
    assert set(out.next_token_ids.tolist()) <= {3, 9, 11}
    masked = logits.masked_fill(~mask, float("-inf"))
    half = rows // 2
    assert torch.equal(out.next_token_ids[half:], masked[half:].argmax(-1))


def test_fully_masked_row_falls_back_to_raw_argmax() -> None:
    logits = torch.randn(2, VOCAB)
    mask = torch.ones(2, VOCAB, dtype=torch.bool)
    mask[1] = False
    out = sampler(logits, _info([SamplingParams()] * 2, vocab_mask=mask))
    assert out.next_token_ids[1] == logits[1].argmax()
    assert torch.isfinite(out.logprobs).all()


def _seeded_run(seed: int, companions: list[SamplingParams], steps: int = 12) -> list[int]:
    """Generate ``steps`` tokens for one seeded request, batched with ``companions``."""
    generator = torch.Generator().manual_seed(99)
    target_logits = torch.randn(steps, VOCAB, generator=generator)
    target = SamplingParams(temperature=1.3, top_p=0.95, sampling_seed=seed)
    produced: list[int] = []
    for step in range(steps):
        params = [*companions, target]
        outputs = [[1] * (step + i) for i in range(len(companions))] + [produced]
        logits = torch.cat([torch.randn(len(companions), VOCAB), target_logits[step : step + 1]])
        out = sampler(logits, _info(params, outputs))
        produced = [*produced, int(out.next_token_ids[-1])]
    return produced


def test_same_seed_same_tokens_across_batch_compositions() -> None:
    alone = _seeded_run(1234, [])
    crowded = _seeded_run(
        1234,
        [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(sampling_seed=5)],
    )
    torch.manual_seed(777)  # the global RNG state must not matter either
    other_state = _seeded_run(1234, [SamplingParams(top_k=2)])
    assert alone == crowded == other_state


def test_different_seeds_differ() -> None:
    runs = {tuple(_seeded_run(seed, [])) for seed in range(5)}
    assert len(runs) == 5


def test_seeded_uniform_properties() -> None:
    values = [seeded_uniform(42, k) for k in range(2000)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert seeded_uniform(42, 3) == seeded_uniform(42, 3)
    assert seeded_uniform(42, 3) != seeded_uniform(43, 3)
    assert abs(sum(values) / len(values) - 0.5) < 0.03
    assert 0.0 <= seeded_uniform(-(1 << 63), 0) < 1.0


def test_compute_logprobs() -> None:
    logits = torch.randn(3, VOCAB)
    assert torch.allclose(compute_logprobs(logits), torch.log_softmax(logits, -1))
    params = [SamplingParams(temperature=0.5), SamplingParams(temperature=0.0), SamplingParams()]
    scaled = compute_logprobs(logits, _info(params))
    assert torch.allclose(scaled[0], torch.log_softmax(logits[0] / 0.5, -1))
    assert torch.allclose(scaled[1], torch.log_softmax(logits[1], -1))
    assert torch.allclose(sampler.compute_logprobs(logits), compute_logprobs(logits))


def test_sampled_logprob_is_tempered_log_softmax() -> None:
    logits = torch.randn(4, VOCAB)
    out = sampler(logits, _info([SamplingParams(temperature=0.7, top_k=5)] * 4))
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, out.next_token_ids.unsqueeze(-1))
    assert torch.allclose(out.logprobs, expected[:, 0], atol=1e-6)


def test_masked_top_logprobs_are_finite() -> None:
    logits = torch.randn(1, 4)
    mask = torch.tensor([[True, False, False, False]])
    out = sampler(logits, _info([SamplingParams()], vocab=4, vocab_mask=mask), top_logprobs_num=4)
    values, _ = out.top_logprobs
    assert torch.isfinite(values).all()
    assert out.next_token_ids.item() == 0
    assert out.logprobs.item() == pytest.approx(0.0, abs=1e-6)


def test_bad_shapes_raise() -> None:
    info = _info([SamplingParams()])
    with pytest.raises(ValueError, match="logits must have shape"):
        sampler(torch.randn(2, VOCAB), info)
    with pytest.raises(ValueError, match="vocab_mask"):
        _info([SamplingParams()], vocab_mask=torch.ones(1, VOCAB + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="output_ids"):
        SamplingBatchInfo.from_requests([SamplingParams()], [], VOCAB, "cpu")
    with pytest.raises(ValueError, match="top_logprobs_num"):
        sampler(torch.randn(1, VOCAB), info, top_logprobs_num=-1)


def test_top_k_minus_one_and_huge_mean_all() -> None:
    info = _info([SamplingParams(top_k=-1), SamplingParams(top_k=1 << 30), SamplingParams(top_k=4)])
    assert info.top_ks.tolist() == [VOCAB, VOCAB, 4]


def test_injected_argmax_picks_greedy_rows() -> None:
    """The serving path hands the sampler the C++ argmax; it must pick every greedy row, bare
    or after processing (logit bias here), and give what torch's argmax gives."""
    from radixserve.kernels import ops

    calls: list[tuple[int, ...]] = []

    def counting(x: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return ops.argmax_rows(x)

    injected = Sampler(argmax=counting)
    logits = torch.randn(6, VOCAB)
    greedy = [SamplingParams(temperature=0.0)] * 6
    bare = injected(logits, _info(greedy), need_logprobs=False)
    assert torch.equal(bare.next_token_ids, logits.argmax(-1))
    biased = [SamplingParams(temperature=0.0, logit_bias={3: 100.0})] * 6
    out = injected(logits, _info(biased), need_logprobs=False)
    assert out.next_token_ids.tolist() == [3] * 6
    assert calls == [(6, VOCAB), (6, VOCAB)]


def test_samples_raw_argmax_rules() -> None:
    assert SamplingParams(temperature=0.0).samples_raw_argmax(0)
    assert SamplingParams(top_k=1).samples_raw_argmax(0)
    assert not SamplingParams(temperature=0.7).samples_raw_argmax(0)
    assert not SamplingParams(temperature=0.0, logit_bias={1: 1.0}).samples_raw_argmax(0)
    assert not SamplingParams(temperature=0.0, repetition_penalty=1.1).samples_raw_argmax(0)
    assert SamplingParams(temperature=0.0, repetition_penalty=1.1).has_penalty
    pending = SamplingParams(temperature=0.0, min_new_tokens=2)
    assert not pending.samples_raw_argmax(1)
    assert pending.samples_raw_argmax(2)
