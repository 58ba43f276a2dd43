"""--kv-cache-dtype fp8_e4m3 / fp8_e5m2: 8-bit KV codes with per-layer scales, read directly by
the C++ attention kernels and by the PyTorch paths (torch_native, the C++ kernels' fallback)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixserve.kernels import build, kv_codes, ops, reference
from radixserve.layers.attention.cpu_paged import CpuPagedAttnBackend
from radixserve.layers.fast_path import use_fast_kernels
from radixserve.mem_cache.kv_cache import KVCache
from radixserve.model_executor.memory_plan import plan_kv_pool
from tests.helpers.model_driver import ManualDriver
from tests.unit.test_kernels import _quantize_tiny, _tiny_model

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_IDS = ("e4m3", "e5m2")


def _ext() -> object:
    ext = build.load_extension()
    if ext is None:
        pytest.skip("C++ kernels unavailable")
    return ext


@pytest.mark.parametrize("dtype", FP8, ids=FP8_IDS)
def test_codes_saturate_and_round_trip(dtype: torch.dtype) -> None:
    limit = torch.finfo(dtype).max
    x = torch.tensor([0.0, 1.0, -3.5, 1e6, -1e6, 0.01])
    codes = kv_codes.encode(x, dtype, 0.5)
    back = kv_codes.decode(codes, torch.float32, 0.5)
    assert torch.isfinite(back).all()  # beyond the range: the largest value, not NaN/inf
    assert back[3] == limit * 0.5 and back[4] == -limit * 0.5
    relative = 2.0**-3 if dtype == torch.float8_e4m3fn else 2.0**-2  # half an ulp, 3 or 2 bits
    torch.testing.assert_close(back[:3], x[:3], rtol=relative / 2, atol=0)


@pytest.mark.parametrize("dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"), [(4, 2, 16), (4, 2, 24), (6, 2, 64), (3, 3, 24)]
)
def test_cpp_attention_reads_the_codes_as_the_reference(
    dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int
) -> None:
    """A prefill over a prefix, decodes (direct path; head_dim 24 its scalar loop, 16 and 64
    the AVX2 widening) and a 40-row prefill (gathered path) on 8-bit caches with scales: the
    C++ kernel equals the reference, which equals float attention over the widened values."""
    ext = _ext()
    torch.manual_seed(0)
    k_scale, v_scale = 0.05, 0.02
    k_cache = kv_codes.encode(torch.randn(256, kv_heads, head_dim) * 2, dtype, k_scale)
    v_cache = kv_codes.encode(torch.randn(256, kv_heads, head_dim) / 2, dtype, v_scale)
    req_to_token = torch.randint(0, 256, (4, 120))
    rows, prefix, new, starts = [1, 0, 2, 3], [3, 20, 90, 70], [5, 1, 1, 40], [0, 5, 6, 7]
    q = torch.randn(starts[-1] + new[-1], heads * head_dim)

    def t(v: list[int]) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.int64)

    layout = (t(rows), t(prefix), t(new), t(starts))
    got = ext.paged_attention(
        q, k_cache, v_cache, req_to_token, *layout, heads, 0.25, k_scale, v_scale
    )
    batch = (rows, prefix, new, starts, heads, 0.25)
    want = reference.paged_attention(
        q, k_cache, v_cache, req_to_token, *batch, None, None, None, k_scale, v_scale
    )
    widened = reference.paged_attention(
        q,
        kv_codes.decode(k_cache, torch.float32, k_scale),
        kv_codes.decode(v_cache, torch.float32, v_scale),
        req_to_token,
        *batch,
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(want, widened, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", FP8, ids=FP8_IDS)
def test_cpp_rope_store_writes_the_reference_codes(dtype: torch.dtype) -> None:
    ext = _ext()
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 16
    cos_sin = torch.randn(32, dim)
    qkv = torch.randn(7, (heads + 2 * kv_heads) * dim) * 3
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 9])
    slots = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    caches = [torch.zeros(64, kv_heads, dim, dtype=dtype) for _ in range(4)]
    k_scale = 0.01 if dtype == torch.float8_e4m3fn else 1e-4  # some k / k_scale past the range
    for fn, (kc, vc) in ((ext.rope_store_kv, caches[:2]), (reference.rope_store_kv, caches[2:])):
        x = qkv.clone()
        q, k, v = x.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        fn(q, k, v, positions, cos_sin, kc, vc, slots, dim, dim, True, k_scale, 0.003)
    assert torch.equal(caches[0].view(torch.uint8), caches[2].view(torch.uint8))
    assert torch.equal(caches[1].view(torch.uint8), caches[3].view(torch.uint8))
    # Stored saturated, never NaN or infinite.
    assert torch.isfinite(caches[0].float()).all()
    assert caches[0].float().abs().max() == torch.finfo(dtype).max


def _fp8_cache(layers: int, config: object, dtype: torch.dtype) -> KVCache:
    kv_heads, head_dim = config.num_key_value_heads, config.head_dim  # type: ignore[attr-defined]
    scales = [0.5 + 0.25 * i for i in range(layers)]
    return KVCache(
        4096, layers, kv_heads, head_dim, dtype, "cpu", k_scales=scales, v_scales=scales[::-1]
    )


def _steps(driver: ManualDriver) -> list[torch.Tensor]:
    return [
        driver.forward([(0, [5, 6, 7, 8, 9, 10, 11]), (1, [3, 4])], all_logits=True),
        driver.forward([(1, [12, 13, 14]), (0, [15])], all_logits=True),
        driver.forward([(0, [16]), (1, [17])], decode=True),
    ]


def _run(dtype: torch.dtype | None, fast: bool) -> list[torch.Tensor]:
    model, config = _tiny_model("llama")
    driver = ManualDriver(model, config)
    if dtype is not None:
        driver.kv_cache = _fp8_cache(config.num_hidden_layers, config, dtype)
    if fast:
        driver.backend = CpuPagedAttnBackend()
    use_fast_kernels(model, fast)
    try:
        with torch.inference_mode():
            return _steps(driver)
    finally:
        use_fast_kernels(model, False)


@pytest.mark.parametrize("dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("cpp", [True, False], ids=["cpp", "pytorch-fallback"])
def test_backends_agree_on_an_fp8_cache(
    dtype: torch.dtype, cpp: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny model on an 8-bit cache with scales: the fast backend (C++ kernels, or their
    PyTorch fallback) gives torch_native's logits, and both stay near the float cache's."""
    if cpp:
        _ext()
    else:
        monkeypatch.setattr(ops, "load_extension", lambda: None)
    want = _run(dtype, fast=False)
    got = _run(dtype, fast=True)
    exact = _run(None, fast=False)
    for w, g, f in zip(want, got, exact, strict=True):
        # Same codes but for a rare rounding tie (RoPE computed in another order).
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)
        assert (w - f).abs().max() < 0.1 * f.abs().max()
        assert (w.argmax(-1) == f.argmax(-1)).float().mean() >= 0.8


@pytest.mark.parametrize("dtype", FP8, ids=FP8_IDS)
def test_single_row_chain_reads_an_fp8_cache(dtype: torch.dtype) -> None:
    """One request's single new token on GGUF weights runs the whole chain in one region
    (single_row_chain.cpp), storing and reading the 8-bit codes with the per-layer scales:
    bitwise the module-by-module fast path's logits."""
    _ext()
    from radixserve.models.llama import LlamaDecoderLayer

    model, config = _tiny_model("llama")
    _quantize_tiny(model)
    layers = [m for m in model.modules() if isinstance(m, LlamaDecoderLayer)]

    def run(fused: bool) -> list[torch.Tensor]:
        driver = ManualDriver(model, config)
        driver.backend = CpuPagedAttnBackend()
        driver.kv_cache = _fp8_cache(len(layers), config, dtype)
        use_fast_kernels(model, True)
        if not fused:
            for module in layers:
                module.fused_args = None
        try:
            out = [driver.forward([(0, [5, 6, 7, 8, 9])])]
            out += [driver.forward([(0, [t])], decode=True) for t in (10, 11, 12, 13)]
            return out
        finally:
            use_fast_kernels(model, False)

    with torch.inference_mode():
        want = run(fused=False)
        got = run(fused=True)
    chain = model.model._layer_chains.current
    assert chain is not None and chain.single_row_runs() == 4
    for w, g in zip(want, got, strict=True):
        assert torch.equal(g, w)


def test_same_budget_holds_four_times_the_float32_tokens() -> None:
    """The pool is sized at one byte per cached value: 4x float32's tokens, 2x bfloat16's."""
    shape = (30, 3, 64)  # SmolLM2-135M: 30 layers, 3 KV heads of 64

    def tokens(dtype: torch.dtype) -> int:
        per_token = KVCache.bytes_per_token(*shape, dtype)
        return plan_kv_pool(
            device="cpu",
            memory_bytes=2**30,
            mem_fraction_static=0.5,
            weight_bytes=100 * 2**20,
            bytes_per_token=per_token,
            context_len=8192,
            page_size=1,
            max_total_tokens=None,
            sized_by_default=False,
        ).tokens

    assert KVCache.bytes_per_token(*shape, torch.float8_e4m3fn) == 2 * 30 * 3 * 64
    for dtype in FP8:
        assert abs(tokens(dtype) - 4 * tokens(torch.float32)) <= 4
        assert abs(tokens(dtype) - 2 * tokens(torch.bfloat16)) <= 2


def test_engine_pool_holds_four_times_the_tokens(tmp_path: Path) -> None:
    """The runner sizes the pool from the same memory budget at one byte per value."""
    from tests.unit.tiny_model import tiny_engines, write_tiny_llama

    folder = write_tiny_llama(tmp_path / "tiny")
    sizes = {}
    with tiny_engines(folder, max_total_tokens=None, mem_fraction_static=0.001) as factory:
        for kv in ("auto", "fp8_e4m3"):
            engine = factory(kv_cache_dtype=kv)
            sizes[kv] = engine.get_server_info()["max_total_num_tokens"]
            engine.shutdown()
    assert abs(sizes["fp8_e4m3"] - 4 * sizes["auto"]) <= 4 * 64  # page rounding


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_hierarchical_cache_moves_the_codes_as_they_are(
    tmp_path: Path, kv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host tier (and the file tier) keep the 8-bit pages in their own dtype: prompts
    whose KV comes back from the host give the greedy tokens of an engine without tiers."""
    import random

    from radixserve.mem_cache.hicache.config import FILE_STORAGE_DIR_ENV
    from tests.unit.tiny_model import TINY_VOCAB, tiny_engines, write_tiny_llama

    monkeypatch.setenv(FILE_STORAGE_DIR_ENV, str(tmp_path / "store"))
    folder = write_tiny_llama(tmp_path / "tiny")
    rng = random.Random(0)
    docs = [[rng.randrange(3, TINY_VOCAB) for _ in range(300)] for _ in range(3)]
    greedy = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}

    def ask(engine: object) -> list[list[int]]:
        return [
            engine.generate(input_ids=[*doc, 10 + rnd], sampling_params=greedy)["output_ids"]  # type: ignore[attr-defined]
            for rnd in range(2)
            for doc in docs
        ]

    with tiny_engines(folder, max_total_tokens=512, kv_cache_dtype=kv) as factory:
        want = ask(factory())
        tiered = factory(enable_hierarchical_cache=True, hicache_storage_backend="file")
        host = tiered.scheduler.kv.hicache.host  # type: ignore[attr-defined]
        assert host.dtype == tiered.scheduler.runner.kv_cache.dtype  # type: ignore[attr-defined]
        assert ask(tiered) == want
        assert tiered.get_server_info()["cached_tokens_host_total"] > 0
