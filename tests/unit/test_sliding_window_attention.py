"""Sliding-window and soft-capped attention over the paged KV cache (Gemma's): the PyTorch
reference against a dense computation written out, the C++ kernel where it sees exactly the
window (decode steps, prompts within the window) against the reference, and the opaque op
--enable-torch-compile runs carrying both settings."""

from __future__ import annotations

import math

import pytest
import torch

from radixserve.kernels import ops, reference
from radixserve.layers.compile_ops import rope_paged_attention
from radixserve.layers.rotary_embedding import RotaryEmbedding

HEADS, KV_HEADS, DIM = 4, 2, 16
SCALE = DIM**-0.5


def _batch(prefixes: list[int], news: list[int], seed: int = 0) -> tuple:
    """q, KV caches with every request's keys in shuffled slots, and the batch description."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [p + n for p, n in zip(prefixes, news, strict=True)]
    slots = torch.randperm(sum(lengths) + 5, generator=gen)
    k_cache = torch.randn(len(slots), KV_HEADS, DIM, generator=gen)
    v_cache = torch.randn(len(slots), KV_HEADS, DIM, generator=gen)
    req_to_token = torch.zeros(len(lengths) + 1, max(lengths) + 3, dtype=torch.int64)
    start = 0
    for i, length in enumerate(lengths):
        req_to_token[i + 1, :length] = slots[start : start + length]  # row 0 stays unused
        start += length
    q = torch.randn(sum(news), HEADS * DIM, generator=gen) * 3
    meta = ops.PagedMeta.build(list(range(1, len(lengths) + 1)), prefixes, news)
    return q, k_cache, v_cache, req_to_token, meta


def _dense(q, k_cache, v_cache, req_to_token, meta, window, cap) -> torch.Tensor:
    """Each query against every key of its request, one (query, head) at a time."""
    out = torch.zeros_like(q)
    group = HEADS // KV_HEADS
    for b, row in enumerate(meta.req_pool_indices_list):
        prefix, new = meta.prefix_lens_list[b], meta.extend_lens_list[b]
        keys = req_to_token[row, : prefix + new]
        for i in range(new):
            pos, t = prefix + i, meta.q_starts_list[b] + i
            for h in range(HEADS):
                qv = q[t, h * DIM : (h + 1) * DIM]
                scores = []
                for j in range(pos + 1):
                    s = float(qv @ k_cache[keys[j], h // group]) * SCALE
                    s = cap * math.tanh(s / cap) if cap else s
                    seen = window is None or j > pos - window
                    scores.append(s if seen else -math.inf)
                probs = torch.softmax(torch.tensor(scores), dim=0)
                values = v_cache[keys[: pos + 1], h // group]
                out[t, h * DIM : (h + 1) * DIM] = probs @ values
    return out


@pytest.mark.parametrize(("window", "cap"), [(None, 2.0), (1, None), (4, None), (4, 2.0)])
def test_reference_equals_dense_attention(
    window: int | None, cap: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Query blocks of 3 rows (each reading only its keys), prefixes, several requests, GQA."""
    monkeypatch.setattr(reference, "QUERY_BLOCK", 3)
    batch = _batch([0, 6, 3], [7, 1, 5])
    q, k_cache, v_cache, req_to_token, meta = batch
    got = reference.windowed_attention(
        q,
        k_cache,
        v_cache,
        req_to_token,
        meta.req_pool_indices_list,
        meta.prefix_lens_list,
        meta.extend_lens_list,
        meta.q_starts_list,
        HEADS,
        SCALE,
        window,
        cap,
    )
    torch.testing.assert_close(got, _dense(*batch, window, cap), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("prefixes", "news", "kernel"),
    [
        ([9, 0, 3, 20], [1, 1, 1, 0], True),  # decode steps (and a padded row)
        ([0, 2], [4, 2], True),  # prompts within the window
        ([0, 12], [4, 1], True),  # a short prompt beside a decode step
        ([0, 2], [6, 1], False),  # a prompt past the window
    ],
)
def test_window_runs_on_the_kernel_where_it_sees_exactly_the_window(
    prefixes: list[int], news: list[int], kernel: bool
) -> None:
    window = 4
    batch = _batch(prefixes, news)
    q, k_cache, v_cache, req_to_token, meta = batch
    assert (ops.window_table(req_to_token, meta, window) is not None) == kernel
    got = ops.paged_attention(q, k_cache, v_cache, req_to_token, meta, HEADS, SCALE, window)
    rows = sum(news)
    torch.testing.assert_close(got[:rows], _dense(*batch, window, None), rtol=1e-5, atol=1e-5)


def test_compiled_attention_op_keeps_window_and_cap() -> None:
    """The opaque op --enable-torch-compile calls: RoPE, KV store, then the same attention."""
    window, cap = 3, 2.0
    q, k_cache, v_cache, req_to_token, meta = _batch([5, 0], [1, 4])
    rotary = RotaryEmbedding(DIM, DIM, 64, 10000.0)
    positions = torch.tensor([5, 0, 1, 2, 3])
    slots = torch.stack([req_to_token[1, 5], *req_to_token[2, :4]])
    k_new = torch.randn(5, KV_HEADS * DIM)
    v_new = torch.randn(5, KV_HEADS * DIM)
    cache = (rotary.cos_sin_cache, k_cache.clone(), v_cache.clone(), slots, req_to_token)
    batch = (meta.req_pool_indices, meta.prefix_lens, meta.extend_lens, meta.q_starts)
    sizes = (DIM, DIM, True, HEADS, SCALE)
    got = rope_paged_attention(q, k_new, v_new, positions, *cache, *batch, *sizes, window, cap)
    q_rot, k_rot = rotary(positions, q, k_new)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    k_want[slots] = k_rot.view(-1, KV_HEADS, DIM)
    v_want[slots] = v_new.view(-1, KV_HEADS, DIM)
    want = _dense(q_rot, k_want, v_want, req_to_token, meta, window, cap)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
