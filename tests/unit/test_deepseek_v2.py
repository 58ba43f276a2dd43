"""DeepSeek-V2 (DeepseekV2ForCausalLM) on tiny random checkpoints, float32: greedy tokens equal
transformers' on both attention backends, for a V2-shaped config (q through q_a_proj/q_b_proj,
group_limited_greedy routing, YaRN) and a V2-Lite-shaped one (q_proj direct, greedy routing);
layer 0 dense (first_k_dense_replace), the rest routed + shared experts. The KV pool holds the
compressed latent per token, a prefix served from the radix cache and chunked prefill give the
same tokens, and the grouped router matches a direct reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.layers.moe import FusedMoE, RouterSpec, route
from radixserve.mem_cache.kv_cache import KVCache
from radixserve.models.config import ModelConfig
from radixserve.models.kv_layout import kv_layout
from radixserve.models.llama import LlamaMLP
from radixserve.models.loader import load_model
from tests.helpers.family_check import (
    BACKENDS,
    engine_greedy,
    require_hf_arch,
    transformers_greedy,
)
from tests.helpers.tiny_models import make_tiny_checkpoint

require_hf_arch("deepseek_v2")

PROMPTS = [[3, 5, 9, 30, 12], [4, *range(40, 52)], [6, *range(60, 100)]]

# YaRN stretching a 128-token pretraining length 4x, with mscale != mscale_all_dim so both the
# RoPE table's attention factor and the softmax scale's mscale differ from 1.
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
}
V2: dict[str, Any] = {"num_hidden_layers": 3, "rope_parameters": YARN}
# V2-Lite's shape: no q compression, plain greedy top-k over ungrouped experts.
V2_LITE: dict[str, Any] = {
    "num_hidden_layers": 3,
    "q_lora_rank": None,
    "topk_method": "greedy",
    "n_group": None,
    "topk_group": None,
    "routed_scaling_factor": 1.0,
}


@pytest.fixture(scope="module", params=("v2", "v2_lite"))
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp(request.param)
    overrides = V2 if request.param == "v2" else V2_LITE
    return folder, make_tiny_checkpoint(folder, "deepseek_v2", **overrides)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(checkpoint: tuple, backend: str) -> None:
    folder, hf = checkpoint
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)


def test_dense_first_layer_then_experts(checkpoint: tuple) -> None:
    folder, _ = checkpoint
    layers = load_model(str(folder), dtype="float32").model.model.layers
    kinds = [type(getattr(layer.mlp, "experts", layer.mlp)) for layer in layers]
    assert kinds == [LlamaMLP, FusedMoE, FusedMoE]
    assert layers[1].mlp.shared_expert is not None


def test_kv_pool_holds_the_compressed_latent(checkpoint: tuple) -> None:
    """One cache row per token of kv_lora_rank + qk_rope_head_dim, V sharing K's buffer: far
    fewer bytes than the expanded per-head K (qk_nope + qk_rope) and V (v_head_dim)."""
    folder, _ = checkpoint
    cfg = ModelConfig.from_pretrained(str(folder), dtype="float32")
    hf = cfg.hf_config
    layout = kv_layout(cfg, cfg.num_key_value_heads)
    assert (layout.num_kv_heads, layout.head_dim, layout.v_shares_k) == (1, 32 + 8, True)
    layers = cfg.num_hidden_layers
    compressed = KVCache.bytes_per_token(layers, 1, layout.head_dim, torch.float32, True)
    assert compressed == layers * (hf.kv_lora_rank + hf.qk_rope_head_dim) * 4
    heads = hf.num_attention_heads
    expanded = layers * heads * (hf.qk_nope_head_dim + hf.qk_rope_head_dim + hf.v_head_dim) * 4
    assert compressed < expanded / 3
    pool = KVCache(16, layers, 1, layout.head_dim, torch.float32, "cpu", v_shares_k=True)
    assert pool.get_kv(0)[0] is pool.get_kv(0)[1]  # stored once
    assert sum(b.numel() for b in pool.k_buffers) == layers * 17 * layout.head_dim


def test_prefix_reused_from_the_radix_cache(checkpoint: tuple) -> None:
    """A second request sharing the first one's 40-token prefix reads it from the radix cache
    (the latent rows) and still produces transformers' tokens."""
    folder, hf = checkpoint
    first = PROMPTS[2]
    second = [*first, 7, 8, 9]
    params = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    with Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=2048,
        attention_backend="intel_amx",
    ) as engine:
        out1 = engine.generate(input_ids=first, sampling_params=params)
        out2 = engine.generate(input_ids=second, sampling_params=params)
    assert out2["meta_info"]["cached_tokens"] >= len(first) - 1
    expected = transformers_greedy(hf, [first, second])
    assert [out1["output_ids"], out2["output_ids"]] == expected


def test_chunked_prefill(checkpoint: tuple) -> None:
    folder, hf = checkpoint
    base = PROMPTS[2]
    prompts = [base, [*base, 7, 8], [*base[:20], 11]]
    expected = transformers_greedy(hf, prompts)
    assert engine_greedy(folder, prompts, "torch_native", chunked_prefill_size=8) == expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_kv(checkpoint: tuple, backend: str) -> None:
    """Pages of 4 latent rows (--page-size 4): the same tokens."""
    folder, hf = checkpoint
    got = engine_greedy(folder, PROMPTS, backend, page_size=4)
    assert got == transformers_greedy(hf, PROMPTS)


def test_ngram_speculative_decoding(checkpoint: tuple) -> None:
    """NGRAM drafts verified in one forward, the accepted branch's latent rows moved by
    copy_slots (K and V one buffer): still transformers' greedy tokens."""
    folder, hf = checkpoint
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 8]
    got = engine_greedy(
        folder,
        prompts,
        "intel_amx",
        new_tokens=16,
        speculative_algorithm="NGRAM",
        speculative_num_draft_tokens=4,
    )
    assert got == transformers_greedy(hf, prompts, new_tokens=16)


def test_stacked_expert_checkpoint(tmp_path: Path) -> None:
    """transformers' in-memory layout (mlp.experts.gate_up_proj [E, 2I, H], down_proj
    [E, H, I]) saved as is loads as well as the per-expert one save_pretrained writes."""
    from safetensors.torch import save_file

    hf = make_tiny_checkpoint(tmp_path, "deepseek_v2", seed=1, **V2)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert "model.layers.1.mlp.experts.gate_up_proj" in state
    (tmp_path / "model.safetensors").unlink()
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert engine_greedy(tmp_path, PROMPTS, "torch_native") == transformers_greedy(hf, PROMPTS)


def _grouped_reference(
    logits: torch.Tensor, top_k: int, groups: int, topk_groups: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token: rank the groups by their best softmax score, keep the topk_groups best,
    take the top_k experts among theirs, weights times scale."""
    scores = torch.softmax(logits.float(), dim=-1)
    size = scores.shape[1] // groups
    all_weights, all_experts = [], []
    for row in scores:
        best = sorted(range(groups), key=lambda g: -row[g * size : (g + 1) * size].max())
        allowed = [e for g in best[:topk_groups] for e in range(g * size, (g + 1) * size)]
        chosen = sorted(allowed, key=lambda e: -row[e])[:top_k]
        all_experts.append(chosen)
        all_weights.append([row[e] * scale for e in chosen])
    return torch.tensor(all_weights), torch.tensor(all_experts)


def test_group_limited_greedy_router() -> None:
    torch.manual_seed(0)
    logits = torch.randn(64, 16) * 3
    spec = RouterSpec(3, num_groups=4, topk_groups=2, scaling_factor=2.5)
    weights, experts = route(logits, spec, torch.float32)
    ref_weights, ref_experts = _grouped_reference(logits, 3, 4, 2, 2.5)
    order = experts.argsort(dim=-1)
    ref_order = ref_experts.argsort(dim=-1)
    assert torch.equal(experts.gather(1, order), ref_experts.gather(1, ref_order))
    torch.testing.assert_close(weights.gather(1, order), ref_weights.gather(1, ref_order))
    # Grouping changes the choice for some tokens: a plain top-3 picks outside the groups.
    plain = route(logits, RouterSpec(3), torch.float32).experts
    assert not torch.equal(plain.sort(dim=-1).values, experts.sort(dim=-1).values)


def test_hierarchical_cache(tmp_path: Path) -> None:
    """Latent rows pushed off a 512-token device pool come back from the host tier: the same
    tokens as without it, 288 of each prompt's tokens read from the host."""
    import random

    make_tiny_checkpoint(tmp_path, "deepseek_v2", **V2_LITE)
    rng = random.Random(0)
    docs = [[rng.randrange(3, 256) for _ in range(300)] for _ in range(3)]
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}

    def ask_each_twice(**engine_args: Any) -> list[dict[str, Any]]:
        with Engine(
            model_path=str(tmp_path),
            runtime="thread",
            dtype="float32",
            skip_tokenizer_init=True,
            skip_server_warmup=True,
            max_total_tokens=512,
            **engine_args,
        ) as engine:
            return [
                engine.generate(input_ids=[*doc, 10 + rnd, 20 + i], sampling_params=params)
                for rnd in range(2)
                for i, doc in enumerate(docs)
            ]

    plain = ask_each_twice()
    tiered = ask_each_twice(enable_hierarchical_cache=True, hicache_write_policy="write_through")
    assert [r["output_ids"] for r in tiered] == [r["output_ids"] for r in plain]
    assert [r["meta_info"]["cached_tokens_details"]["host"] for r in tiered[3:]] == [288] * 3


@pytest.mark.parametrize("ep_size", [1, 2], ids=["tp2", "tp2-ep2"])
def test_tensor_and_expert_parallel_equal_one_rank(checkpoint: tuple, ep_size: int) -> None:
    """--tp-size 2 (attention replicated, MLPs and experts split) and with --ep-size 2 (each
    rank whole experts): one rank's greedy tokens."""
    folder, _ = checkpoint
    kwargs = {
        "model_path": str(folder),
        "dtype": "float32",
        "skip_tokenizer_init": True,
        "max_total_tokens": 1024,
        "random_seed": 0,
    }
    greedy = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    with Engine(runtime="thread", **kwargs) as single:
        expected = [
            o["output_ids"] for o in single.generate(input_ids=PROMPTS, sampling_params=greedy)
        ]
    with Engine(tp_size=2, ep_size=ep_size, dist_timeout=30, **kwargs) as engine:
        got = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=greedy)]
    assert got == expected
