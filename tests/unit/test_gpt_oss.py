"""gpt-oss (GptOssForCausalLM) on tiny random checkpoints, float32.

The whole model: greedy tokens equal transformers' on both attention backends, over prompts
longer than the 8-token sliding window of every other layer (the window really applied: without
it the tokens differ), through the radix prefix cache and chunked prefill, and from an MXFP4
checkpoint as well as transformers' fused float one. Strong sinks, random expert biases and a
SwiGLU limit that bites make each gpt-oss part count.

The parts: attention with sinks on each path (the PyTorch reference, ops.paged_attention with
the C++ kernels built, both backends, the opaque op --enable-torch-compile runs) against a
softmax-with-sink written out; the MXFP4 decoder against a block decoded by hand; the router
and the clamped SwiGLU against transformers' modules.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from radixserve.kernels import ops, reference
from radixserve.kernels.build import load_extension
from radixserve.layers.activation import ClampedSwiGLU
from radixserve.layers.attention.cpu_paged import CpuPagedAttnBackend
from radixserve.layers.attention.torch_native import TorchNativeAttnBackend
from radixserve.layers.compile_ops import store_paged_attention
from radixserve.layers.moe import RouterSpec, Scoring, route
from radixserve.layers.quantization.mxfp4 import dequantize_mxfp4
from radixserve.layers.radix_attention import RadixAttention
from radixserve.model_executor.forward_batch import ForwardMode
from radixserve.models.loader import load_model
from tests.helpers.family_check import (
    BACKENDS,
    engine_greedy,
    fused_layers,
    require_hf_arch,
    transformers_greedy,
)
from tests.helpers.hf_reference import hf_logits
from tests.helpers.tiny_gpt_oss_mxfp4 import write_mxfp4_checkpoint
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model
from tests.helpers.window_check import (
    cached_chunked_greedy,
    engine_greedy_with_window,
    transformers_with_window,
)

require_hf_arch("gpt_oss")

# The first prompt fits in the window; the others reach 1.6x and 5x past it.
PROMPTS = [[3, 5, 9, 30, 12], [4, *range(40, 52)], [6, *range(60, 100)]]
NO_WINDOW = 4096  # longer than any sequence here
# Below the tiny model's gate/up magnitudes, so the clamps change values.
SWIGLU_LIMIT = 0.5


def _gpt_oss_model(seed: int = 0) -> torch.nn.Module:
    """A tiny random gpt-oss whose sinks, router and expert biases are far from their zero
    init (transformers' init would leave the expert biases at 0, their loading untested)."""
    hf = tiny_hf_model(tiny_hf_config("gpt_oss", swiglu_limit=SWIGLU_LIMIT), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("sinks"):
                param.copy_(torch.randn(param.shape, generator=gen) * 2.0)
            elif name.endswith("_bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    return hf


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("gpt_oss")
    hf = _gpt_oss_model()
    hf.save_pretrained(folder)
    return folder, hf


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(gpt_oss: tuple, backend: str) -> None:
    folder, hf = gpt_oss
    assert hf.config.layer_types == ["sliding_attention", "full_attention"]
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)


def test_window_is_applied(gpt_oss: tuple) -> None:
    """Layer 0 slides over 8 keys, layer 1 sees all; the same weights without a window give
    other tokens once sequences pass it (transformers' tokens for that model)."""
    folder, _ = gpt_oss
    layers = load_model(str(folder), dtype="float32").model.model.layers
    assert [layer.self_attn.attn.sliding_window for layer in layers] == [8, None]
    windowed = engine_greedy(folder, PROMPTS, "intel_amx")
    unwindowed = engine_greedy_with_window(folder, PROMPTS, "intel_amx", NO_WINDOW)
    assert windowed[0][:4] == unwindowed[0][:4]  # within the window: no difference
    assert windowed[2] != unwindowed[2]
    assert unwindowed == transformers_greedy(transformers_with_window(folder, NO_WINDOW), PROMPTS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefix_cache_and_chunked_prefill(gpt_oss: tuple, backend: str) -> None:
    """Prefill chunks of 16 tokens cross the window; the second prompt extends the first,
    whose KV the radix cache serves."""
    folder, hf = gpt_oss
    first = PROMPTS[2]
    prompts = [first, [*first, 7, 8, 9, *range(100, 130)]]
    tokens, cached = cached_chunked_greedy(folder, prompts, backend, chunk=16)
    assert cached[0] == 0 and cached[1] >= len(first) - 1
    assert tokens == transformers_greedy(hf, prompts)


def test_fused_checkpoint_loads_deinterleaved(gpt_oss: tuple) -> None:
    """transformers' fused experts (gate_up_proj [E, hidden, 2I] with gate and up in alternate
    columns) land as gate rows then up rows; biases, router and sinks as saved."""
    folder, hf = gpt_oss
    ours = load_model(str(folder), dtype="float32").model.model.layers[1]
    theirs = hf.model.layers[1]
    experts, hf_experts = ours.mlp.experts, theirs.mlp.experts
    inter = experts.intermediate_size
    for e in (0, 5):
        gate_up = hf_experts.gate_up_proj[e]  # [hidden, 2I]
        assert torch.equal(experts.w13_weight[e, :inter], gate_up[:, 0::2].t())
        assert torch.equal(experts.w13_weight[e, inter:], gate_up[:, 1::2].t())
        assert torch.equal(experts.w2_weight[e], hf_experts.down_proj[e].t())
        bias = hf_experts.gate_up_proj_bias[e]
        assert torch.equal(experts.w13_bias[e], torch.cat([bias[0::2], bias[1::2]]))
        assert torch.equal(experts.w2_bias[e], hf_experts.down_proj_bias[e])
    assert torch.equal(ours.mlp.router.bias, theirs.mlp.router.bias)
    assert torch.equal(ours.self_attn.attn.sinks, theirs.self_attn.sinks)


def test_layers_run_module_by_module(gpt_oss: tuple) -> None:
    """Neither the one-call C++ layer nor its MoE kernels have sinks or expert biases."""
    folder, _ = gpt_oss
    assert fused_layers(folder) == [False, False]


def test_two_tensor_parallel_ranks_match_transformers(tmp_path: Path) -> None:
    """Each rank holds half the heads (and their sinks) and half of every expert's
    intermediate dimension (and of its gate/up biases); the down bias is counted once."""
    import torch.multiprocessing as mp

    from tests.unit.test_moe_tp import PROMPT as TP_PROMPT
    from tests.unit.test_moe_tp import _tp_worker

    hf = _gpt_oss_model(seed=4)
    hf.save_pretrained(tmp_path / "model")
    args = (2, str(tmp_path / "rendezvous"), [str(tmp_path / "model")])
    mp.spawn(_tp_worker, args=args, nprocs=2, join=True)
    reference = hf_logits(hf, [*TP_PROMPT, 9])
    for rank in range(2):
        prefill, decode = torch.load(tmp_path / "model" / f"logits-{rank}.pt")
        assert torch.allclose(prefill, reference[:-1], atol=1e-4), rank
        assert torch.allclose(decode[0], reference[-1], atol=1e-4), rank


# --- MXFP4 ---


def test_mxfp4_decodes_a_hand_computed_block() -> None:
    # Block 0, scale 2 ** (128 - 127) = 2: byte 0x21 holds codes 1 (0.5, low nibble first)
    # and 2 (1.0); 0xF8 holds 8 (-0.0) and 15 (-6.0); 0x7A holds 10 (-1.0) and 7 (6.0).
    # Block 1, scale 2 ** (125 - 127) = 1/4: 0x53 holds 3 (1.5) and 5 (3.0).
    blocks = torch.zeros(1, 2, 16, dtype=torch.uint8)
    blocks[0, 0, :3] = torch.tensor([0x21, 0xF8, 0x7A], dtype=torch.uint8)
    blocks[0, 1, 0] = 0x53
    scales = torch.tensor([[128, 125]], dtype=torch.uint8)
    want = torch.zeros(1, 64)
    want[0, :6] = torch.tensor([1.0, 2.0, -0.0, -12.0, -2.0, 12.0])
    want[0, 32:34] = torch.tensor([0.375, 0.75])
    got = dequantize_mxfp4(blocks, scales)
    assert got.shape == (1, 64)
    assert torch.equal(got, want)
    assert torch.signbit(got[0, 2])  # -0.0 stays negative zero
    assert torch.equal(dequantize_mxfp4(blocks, scales, torch.bfloat16), want.bfloat16())


def test_mxfp4_layout_equals_transformers_dequantizer() -> None:
    """The published checkpoints' [experts, out, blocks, 16] form decodes to the [experts, out,
    in] matrices transformers' own dequantizer gives (it returns them transposed)."""
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    gen = torch.Generator().manual_seed(5)
    blocks = torch.randint(0, 256, (3, 6, 4, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(110, 140, (3, 6, 4), generator=gen, dtype=torch.uint8)
    theirs = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(dequantize_mxfp4(blocks, scales), theirs.transpose(1, 2))


def test_mxfp4_checkpoint_equals_transformers(tmp_path: Path) -> None:
    """Experts stored as the published checkpoints store them (`*_blocks` and `*_scales`,
    [experts, out, in] before packing, quant_method mxfp4), served on their blocks: greedy
    tokens equal transformers' on the float weights they encode."""
    hf = _gpt_oss_model(seed=2)
    write_mxfp4_checkpoint(tmp_path, hf, seed=3)
    got = engine_greedy(tmp_path, PROMPTS, "torch_native")
    assert got == transformers_greedy(hf, PROMPTS)


# --- routing and activation ---


def test_router_softmaxes_over_the_top_k_logits() -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter

    config = tiny_hf_config("gpt_oss")
    router = GptOssTopKRouter(config)
    with torch.no_grad():
        router.weight.normal_()
        router.bias.normal_()
    x = torch.randn(6, config.hidden_size)
    logits, scores, indices = router(x)
    weights, experts = route(logits, RouterSpec(2, Scoring.TOPK_SOFTMAX), torch.float32)
    assert torch.equal(experts, indices)
    torch.testing.assert_close(weights, scores, rtol=0, atol=1e-7)
    # Not the full softmax's top-k: the chosen weights sum to 1.
    torch.testing.assert_close(weights.sum(-1), torch.ones(6))


def test_clamped_swiglu_equals_transformers_on_interleaved_columns() -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    theirs = GptOssExperts(tiny_hf_config("gpt_oss", swiglu_limit=SWIGLU_LIMIT))
    gate_up = torch.randn(5, 64) * 3  # gate, up alternating, far past the limit
    halves = torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=-1)
    want = theirs._apply_gate(gate_up)
    got = ClampedSwiGLU(1.702, SWIGLU_LIMIT)(halves)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


# --- attention with sinks on each path ---

HEADS, KV_HEADS, DIM = 4, 2, 16
SCALE = DIM**-0.5


def _batch(prefixes: list[int], news: list[int], seed: int = 0) -> tuple:
    """q, KV caches with every request's keys in shuffled slots, the request-to-token table,
    the batch description and per-head sinks."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [p + n for p, n in zip(prefixes, news, strict=True)]
    slots = torch.randperm(sum(lengths) + 5, generator=gen) + 1  # slot 0: the pad slot
    k_cache = torch.randn(len(slots) + 1, KV_HEADS, DIM, generator=gen)
    v_cache = torch.randn(len(slots) + 1, KV_HEADS, DIM, generator=gen)
    req_to_token = torch.zeros(len(lengths) + 1, max(lengths) + 3, dtype=torch.int64)
    start = 0
    for i, length in enumerate(lengths):
        req_to_token[i + 1, :length] = slots[start : start + length]  # row 0 stays unused
        start += length
    q = torch.randn(sum(news), HEADS * DIM, generator=gen) * 3
    meta = ops.PagedMeta.build(list(range(1, len(lengths) + 1)), prefixes, news)
    sinks = torch.tensor([2.0, -1.0, 0.5, 4.0])
    return q, k_cache, v_cache, req_to_token, meta, sinks


def _dense_with_sinks(q, k_cache, v_cache, req_to_token, meta, sinks, window) -> torch.Tensor:
    """Each (query, head) written out: exp(score) / (sum of exp(scores) + exp(sink))."""
    out = torch.zeros_like(q)
    group = HEADS // KV_HEADS
    for b, row in enumerate(meta.req_pool_indices_list):
        prefix, new = meta.prefix_lens_list[b], meta.extend_lens_list[b]
        keys = req_to_token[row, : prefix + new]
        for i in range(new):
            pos, t = prefix + i, meta.q_starts_list[b] + i
            for h in range(HEADS):
                qv = q[t, h * DIM : (h + 1) * DIM].double()
                seen = [j for j in range(pos + 1) if window is None or j > pos - window]
                scores = [float(qv @ k_cache[keys[j], h // group].double()) * SCALE for j in seen]
                exps = [math.exp(s) for s in scores]
                denominator = sum(exps) + math.exp(float(sinks[h]))
                acc = torch.zeros(DIM, dtype=torch.float64)
                for j, e in zip(seen, exps, strict=True):
                    acc += e / denominator * v_cache[keys[j], h // group].double()
                out[t, h * DIM : (h + 1) * DIM] = acc.float()
    return out


CASES = [([0, 6, 3], [7, 1, 5], None), ([0, 6, 3], [7, 1, 5], 4), ([9, 0, 20], [1, 1, 1], 4)]


@pytest.mark.parametrize(("prefixes", "news", "window"), CASES)
def test_reference_sinks_equal_dense(
    prefixes: list[int], news: list[int], window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Query blocks of 3 rows, prefixes, several requests, GQA, with and without a window."""
    monkeypatch.setattr(reference, "QUERY_BLOCK", 3)
    batch = _batch(prefixes, news)
    q, k_cache, v_cache, req_to_token, meta, sinks = batch
    got = reference.paged_attention(
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
        None,
        sinks,
    )
    torch.testing.assert_close(got, _dense_with_sinks(*batch, window), rtol=1e-5, atol=1e-5)
    # The sinks matter: without them the rows are normalized over the keys alone.
    plain = reference.paged_attention(
        q, k_cache, v_cache, req_to_token, *_lists(meta), HEADS, SCALE, window
    )
    assert float((plain - got).abs().max()) > 0.1


def _lists(meta: ops.PagedMeta) -> tuple[list[int], ...]:
    return (
        meta.req_pool_indices_list,
        meta.prefix_lens_list,
        meta.extend_lens_list,
        meta.q_starts_list,
    )


@pytest.mark.parametrize(("prefixes", "news", "window"), CASES)
def test_ops_paged_attention_sinks_equal_dense(
    prefixes: list[int], news: list[int], window: int | None
) -> None:
    """The dispatcher the fast backend calls: the C++ kernel's sink term where the kernels are
    built (windowed decode steps through window_table), else the reference."""
    if ops.using_cpp_kernels():
        assert hasattr(load_extension(), "paged_attention_sinks")
    batch = _batch(prefixes, news)
    q, k_cache, v_cache, req_to_token, meta, sinks = batch
    got = ops.paged_attention(
        q, k_cache, v_cache, req_to_token, meta, HEADS, SCALE, window, None, sinks
    )
    torch.testing.assert_close(got, _dense_with_sinks(*batch, window), rtol=1e-5, atol=1e-5)


def _layer(sinks: torch.Tensor, window: int | None) -> RadixAttention:
    layer = RadixAttention(0, HEADS, KV_HEADS, DIM, SCALE, sliding_window=window, sinks=True)
    with torch.no_grad():
        layer.sinks.copy_(sinks)
    return layer


def _forward_batch(batch: tuple, decode: bool) -> SimpleNamespace:
    """What the backends read of a ForwardBatch, for KV already in the caches."""
    _, k_cache, v_cache, req_to_token, meta, _ = batch
    seq_lens = [p + n for p, n in zip(meta.prefix_lens_list, meta.extend_lens_list, strict=True)]
    cache = SimpleNamespace(
        pad_slot=0,
        get_kv=lambda layer_id: (k_cache, v_cache),
        scales=lambda layer_id: (1.0, 1.0),  # a float cache's
    )
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        req_to_token=req_to_token,
        req_pool_indices=meta.req_pool_indices,
        req_pool_indices_cpu=meta.req_pool_indices_list,
        extend_prefix_lens_cpu=meta.prefix_lens_list,
        extend_seq_lens_cpu=meta.extend_lens_list,
        seq_lens_cpu=seq_lens,
        seq_lens=torch.tensor(seq_lens),
        kv_cache=cache,
    )


@pytest.mark.parametrize("backend", [TorchNativeAttnBackend, CpuPagedAttnBackend])
@pytest.mark.parametrize(("prefixes", "news", "window"), CASES)
def test_backend_sinks_equal_dense(
    backend: type, prefixes: list[int], news: list[int], window: int | None
) -> None:
    batch = _batch(prefixes, news)
    q, sinks = batch[0], batch[5]
    decode = all(n == 1 for n in news)
    forward_batch = _forward_batch(batch, decode)
    attn = backend()
    attn.init_forward_metadata(forward_batch)
    heads = q.view(q.shape[0], HEADS, DIM)
    run = attn.forward_decode if decode else attn.forward_extend
    got = run(heads, _layer(sinks, window), forward_batch).reshape(q.shape)
    torch.testing.assert_close(got, _dense_with_sinks(*batch, window), rtol=1e-5, atol=1e-5)


def test_compiled_attention_op_keeps_sinks() -> None:
    """The opaque op --enable-torch-compile runs for a layer: KV store, then attention with the
    sinks."""
    batch = _batch([5, 0], [1, 4])
    q, k_cache, v_cache, req_to_token, meta, sinks = batch
    slots = torch.stack([req_to_token[1, 5], *req_to_token[2, :4]])
    k_new, v_new = k_cache[slots].reshape(5, -1), v_cache[slots].reshape(5, -1)
    got = store_paged_attention(
        q,
        k_new,
        v_new,
        k_cache.clone(),
        v_cache.clone(),
        slots,
        req_to_token,
        meta.req_pool_indices,
        meta.prefix_lens,
        meta.extend_lens,
        meta.q_starts,
        HEADS,
        SCALE,
        None,
        None,
        sinks,
    )
    torch.testing.assert_close(got, _dense_with_sinks(*batch, None), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # compiles the decode graph (~8 s on 2 cores)
def test_compiled_decode_equals_transformers(gpt_oss: tuple) -> None:
    """--enable-torch-compile: the opaque attention op keeps the sinks and the window."""
    folder, hf = gpt_oss
    got = engine_greedy(
        folder, PROMPTS, "intel_amx", enable_torch_compile=True, torch_compile_max_bs=4
    )
    assert got == transformers_greedy(hf, PROMPTS)
