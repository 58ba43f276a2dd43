"""Qwen3-MoE (Qwen3MoeForCausalLM) on tiny random checkpoints, float32: greedy tokens equal
transformers' on both attention backends, with the top-k renormalized or not, with dense layers
(decoder_sparse_step, mlp_only_layers) among the sparse ones, and from a checkpoint whose experts
are stacked 3-D tensors (transformers' in-memory layout) as well as per expert."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.layers.moe import FusedMoE
from radixserve.models.llama import LlamaMLP
from radixserve.models.loader import load_model
from tests.helpers.family_check import (
    BACKENDS,
    engine_greedy,
    fused_layers,
    require_hf_arch,
    transformers_greedy,
)
from tests.helpers.tiny_models import make_tiny_checkpoint

require_hf_arch("qwen3_moe")

PROMPTS = [[3, 5, 9, 30, 12], [4, *range(40, 52)], [6, *range(60, 100)]]


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("qwen3_moe")
    return folder, make_tiny_checkpoint(folder, "qwen3_moe", norm_topk_prob=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(qwen3_moe: tuple, backend: str) -> None:
    folder, hf = qwen3_moe
    assert engine_greedy(folder, PROMPTS, backend) == transformers_greedy(hf, PROMPTS)


def test_dense_layers_among_sparse_ones(tmp_path: Path) -> None:
    # Four layers: 0 dense by mlp_only_layers, 2 dense by the step of 2; 1 and 3 sparse.
    hf = make_tiny_checkpoint(
        tmp_path,
        "qwen3_moe",
        num_hidden_layers=4,
        decoder_sparse_step=2,
        mlp_only_layers=[0],
        norm_topk_prob=False,
    )
    layers = load_model(str(tmp_path), dtype="float32").model.model.layers
    kinds = [
        type(layer.mlp.experts if hasattr(layer.mlp, "experts") else layer.mlp) for layer in layers
    ]
    assert kinds == [LlamaMLP, FusedMoE, LlamaMLP, FusedMoE]
    assert engine_greedy(tmp_path, PROMPTS, "intel_amx") == transformers_greedy(hf, PROMPTS)


def test_stacked_expert_checkpoint(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    hf = make_tiny_checkpoint(tmp_path, "qwen3_moe", seed=1)
    # transformers' in-memory names: mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I].
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    (tmp_path / "model.safetensors").unlink()
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert engine_greedy(tmp_path, PROMPTS, "torch_native") == transformers_greedy(hf, PROMPTS)


def test_layers_run_module_by_module(qwen3_moe: tuple) -> None:
    folder, _ = qwen3_moe
    assert fused_layers(folder) == [False, False]


def test_chunked_prefill(qwen3_moe: tuple) -> None:
    """Prompts that share a prefix, prefilled in chunks of 8 tokens: still transformers'
    tokens."""
    folder, hf = qwen3_moe
    base = PROMPTS[2]
    prompts = [base, [*base, 7, 8], [*base[:20], 11]]
    expected = transformers_greedy(hf, prompts)
    assert engine_greedy(folder, prompts, "intel_amx", chunked_prefill_size=8) == expected


def test_bfloat16_checkpoint_served_in_float32(tmp_path: Path) -> None:
    """A bfloat16 checkpoint in float32: the expert stacks stay bfloat16 in memory and are
    widened as used, exactly transformers' float32 on the same (bfloat16) values."""
    hf = make_tiny_checkpoint(tmp_path / "f32", "qwen3_moe", seed=2)
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    reference = hf.to(torch.float32)
    experts = load_model(str(tmp_path / "bf16"), dtype="float32").model.model.layers[0].mlp.experts
    assert experts.w13_weight.dtype == torch.bfloat16
    got = engine_greedy(tmp_path / "bf16", PROMPTS, "intel_amx")
    assert got == transformers_greedy(reference, PROMPTS)


def test_one_request_decodes_at_batch_one(qwen3_moe: tuple) -> None:
    """One request alone: its decode steps take FusedMoE's one-token path."""
    folder, hf = qwen3_moe
    for backend in BACKENDS:
        assert engine_greedy(folder, PROMPTS[1:2], backend) == transformers_greedy(hf, PROMPTS[1:2])


def test_torch_compile(qwen3_moe: tuple) -> None:
    """--enable-torch-compile: the expert loop runs eagerly between the compiled graphs."""
    folder, hf = qwen3_moe
    prompts = PROMPTS[:2]
    got = engine_greedy(
        folder, prompts, "intel_amx", enable_torch_compile=True, torch_compile_max_bs=4
    )
    assert got == transformers_greedy(hf, prompts)


def test_ngram_speculative_decoding(qwen3_moe: tuple) -> None:
    """NGRAM drafts verified in one forward (many rows per expert, tree rows included): still
    transformers' greedy tokens. Repetitive prompts give the n-gram trie drafts to verify."""
    folder, hf = qwen3_moe
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


def test_pipeline_stages_load_only_their_experts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under --pp-size 2 each stage builds and loads only its layers' experts, with the whole
    model's values (the stages' forward is the dense families', tested elsewhere)."""
    from radixserve.distributed import parallel_state as ps
    from radixserve.models.pipeline_stage import PPMissingLayer

    make_tiny_checkpoint(tmp_path, "qwen3_moe", num_hidden_layers=3)
    whole = dict(load_model(str(tmp_path), dtype="float32").model.named_parameters())
    seen = set()
    for stage in range(2):
        monkeypatch.setattr(ps, "_PP_RANK", stage)
        monkeypatch.setattr(ps, "_PP_SIZE", 2)
        model = load_model(str(tmp_path), dtype="float32").model
        missing = 2 if stage == 0 else 0
        assert isinstance(model.model.layers[missing], PPMissingLayer)
        for name, param in model.named_parameters():
            torch.testing.assert_close(param, whole[name], rtol=0, atol=0)
            seen.add(name)
    assert seen == set(whole)
    assert any(".experts.w13_weight" in name for name in seen)


def test_retraction_keeps_transformers_tokens(qwen3_moe: tuple) -> None:
    """A KV pool too small for every request at once: requests are retracted and re-prefilled
    (their experts rerun over the recomputed rows) and still end with transformers' tokens,
    each exactly once, with the pool empty afterwards."""
    from radixserve import Engine

    folder, hf = qwen3_moe
    prompts = [[3 + i, *range(10 + i, 40 + i)] for i in range(6)]
    expected = transformers_greedy(hf, prompts, new_tokens=24)
    with Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=160,
        page_size=4,
        attention_backend="intel_amx",
    ) as engine:
        outs = engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
        )
        assert [o["output_ids"] for o in outs] == expected
        assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0
        assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs)
        info = engine.get_server_info()  # every request's KV given back
        assert info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
        assert info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]
