"""TP-aware layers (with a faked tp size), rotary embedding, norms and activations."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

# The repo root, for tests.helpers (see test_loader.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixserve.distributed import parallel_state
from radixserve.layers.activation import SiluAndMul, get_act_and_mul
from radixserve.layers.layernorm import RMSNorm
from radixserve.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from radixserve.layers.logits_processor import LogitsProcessor
from radixserve.layers.rotary_embedding import RotaryEmbedding, compute_inv_freq
from radixserve.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding


def fake_tp(monkeypatch: pytest.MonkeyPatch, rank: int, size: int) -> None:
    monkeypatch.setattr(parallel_state, "get_tp_rank", lambda: rank)
    monkeypatch.setattr(parallel_state, "get_tp_size", lambda: size)


def ramp(*shape: int) -> torch.Tensor:
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)


@pytest.mark.parametrize("rank", [0, 1])
def test_column_parallel_takes_its_rows(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    fake_tp(monkeypatch, rank, 2)
    layer = ColumnParallelLinear(3, 8, bias=True)
    full_w, full_b = ramp(8, 3), ramp(8)
    layer.weight.weight_loader(layer.weight, full_w)
    layer.bias.weight_loader(layer.bias, full_b)
    assert torch.equal(layer.weight, full_w[rank * 4 : rank * 4 + 4])
    assert torch.equal(layer.bias, full_b[rank * 4 : rank * 4 + 4])


@pytest.mark.parametrize("rank", [0, 1])
def test_row_parallel_takes_its_columns_and_keeps_bias_whole(
    monkeypatch: pytest.MonkeyPatch, rank: int
) -> None:
    fake_tp(monkeypatch, rank, 2)
    layer = RowParallelLinear(6, 4, bias=True)
    full_w = ramp(4, 6)
    layer.weight.weight_loader(layer.weight, full_w)
    layer.bias.weight_loader(layer.bias, ramp(4))
    assert torch.equal(layer.weight, full_w[:, rank * 3 : rank * 3 + 3])
    assert torch.equal(layer.bias, ramp(4))


@pytest.mark.parametrize("rank", [0, 1])
def test_merged_column_places_each_shard(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    fake_tp(monkeypatch, rank, 2)
    layer = MergedColumnParallelLinear(2, [4, 6])
    gate, up = ramp(4, 2), ramp(6, 2) + 100
    layer.weight.weight_loader(layer.weight, gate, 0)
    layer.weight.weight_loader(layer.weight, up, 1)
    expected = torch.cat([gate[rank * 2 : rank * 2 + 2], up[rank * 3 : rank * 3 + 3]])
    assert torch.equal(layer.weight, expected)
    assert layer.weight.shard_ids == (0, 1)


@pytest.mark.parametrize("rank", [0, 1])
def test_qkv_parallel_slices_heads(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    fake_tp(monkeypatch, rank, 2)
    head = 2
    layer = QKVParallelLinear(3, head, total_num_heads=4, total_num_kv_heads=2, bias=True)
    assert (layer.num_heads, layer.num_kv_heads) == (2, 1)
    q, k, v = ramp(8, 3), ramp(4, 3) + 1000, ramp(4, 3) + 2000
    for shard_id, full in (("q", q), ("k", k), ("v", v)):
        layer.weight.weight_loader(layer.weight, full, shard_id)
        layer.bias.weight_loader(layer.bias, full[:, 0], shard_id)
    expected = torch.cat(
        [q[rank * 4 : rank * 4 + 4], k[rank * 2 : rank * 2 + 2], v[rank * 2 :][:2]]
    )
    assert torch.equal(layer.weight, expected)
    assert torch.equal(layer.bias, expected[:, 0])


def test_qkv_replicates_kv_heads_when_ranks_outnumber_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    k = ramp(4, 3)  # 2 kv heads of size 2
    for rank, kv_head in [(0, 0), (1, 0), (2, 1), (3, 1)]:
        fake_tp(monkeypatch, rank, 4)
        layer = QKVParallelLinear(3, 2, total_num_heads=4, total_num_kv_heads=2)
        assert (layer.num_heads, layer.num_kv_heads) == (1, 1)
        layer.weight.weight_loader(layer.weight, k, "k")
        assert torch.equal(layer.weight[2:4], k[kv_head * 2 : kv_head * 2 + 2])


def test_heads_that_do_not_divide_over_ranks_are_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_tp(monkeypatch, 0, 2)
    with pytest.raises(ValueError, match="number of attention heads"):
        QKVParallelLinear(8, 2, total_num_heads=3, total_num_kv_heads=1)


@pytest.mark.parametrize("rank", [0, 1])
def test_vocab_embedding_pads_the_last_partition(
    monkeypatch: pytest.MonkeyPatch, rank: int
) -> None:
    fake_tp(monkeypatch, rank, 2)
    emb = VocabParallelEmbedding(5, 2)
    assert emb.rows_per_partition == 3
    full = ramp(5, 2) + 1
    emb.weight.weight_loader(emb.weight, full)
    if rank == 0:
        assert torch.equal(emb.weight, full[:3])
    else:
        assert torch.equal(emb.weight[:2], full[3:])
        assert torch.equal(emb.weight[2], torch.zeros(2))


def test_loaders_reject_wrong_shapes_and_shard_ids() -> None:
    layer = ColumnParallelLinear(3, 4)
    with pytest.raises(ValueError, match="shape mismatch"):
        layer.weight.weight_loader(layer.weight, ramp(4, 5))
    qkv = QKVParallelLinear(4, 2, 2, 1)
    with pytest.raises(ValueError, match="shard_id"):
        qkv.weight.weight_loader(qkv.weight, ramp(4, 4), "x")
    emb = VocabParallelEmbedding(6, 2)
    with pytest.raises(ValueError, match="vocabulary of 6 rows"):
        emb.weight.weight_loader(emb.weight, ramp(7, 2))


def test_single_rank_layers_compute_plain_linear_algebra() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 6)
    w, b = torch.randn(4, 6), torch.randn(4)
    for cls in (ColumnParallelLinear, RowParallelLinear, ReplicatedLinear):
        layer = cls(6, 4, bias=True)
        layer.weight.weight_loader(layer.weight, w)
        layer.bias.weight_loader(layer.bias, b)
        assert torch.allclose(layer(x), F.linear(x, w, b))
    emb = VocabParallelEmbedding(4, 6)
    emb.weight.weight_loader(emb.weight, w)
    assert torch.equal(emb(torch.tensor([3, 0])), w[[3, 0]])


def test_logits_processor_uses_lm_head_and_returns_float32() -> None:
    head = ParallelLMHead(7, 4)
    head.weight.weight_loader(head.weight, ramp(7, 4).to(head.weight.dtype))
    hidden = torch.ones(2, 4)
    logits = LogitsProcessor(7)(hidden, head)
    assert logits.dtype == torch.float32 and logits.shape == (2, 7)
    assert torch.equal(logits[0], ramp(7, 4).sum(-1))
    with pytest.raises(RuntimeError):
        head(torch.tensor([0]))


def test_rmsnorm_with_residual_returns_the_sum_as_next_residual() -> None:
    norm = RMSNorm(4, eps=1e-6)
    norm.weight.weight_loader(norm.weight, torch.tensor([1.0, 2.0, 1.0, 1.0]))
    x, r = torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor([[1.0, 0.0, -1.0, 0.0]])
    out, residual = norm(x, r)
    summed = x + r
    expected = summed / summed.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * norm.weight
    assert torch.equal(residual, summed)
    assert torch.allclose(out, expected)
    assert torch.allclose(norm(summed), expected)


def test_silu_and_mul() -> None:
    x = torch.tensor([[1.0, -2.0, 3.0, 4.0]])
    assert torch.allclose(SiluAndMul()(x), F.silu(x[:, :2]) * x[:, 2:])
    with pytest.raises(ValueError, match="hidden_act 'gelu_fancy'"):
        get_act_and_mul("gelu_fancy")


ROPE_CASES = [
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 4.0},
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    },
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
]


@pytest.mark.parametrize("params", ROPE_CASES, ids=lambda p: p["rope_type"])
def test_rotary_matches_transformers(params: dict) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    theta, head_dim, max_pos = 10000.0, 32, 512
    config = LlamaConfig(
        hidden_size=128,
        num_attention_heads=4,
        max_position_embeddings=max_pos,
        rope_parameters={**params, "rope_theta": theta},
    )
    if params["rope_type"] == "default":
        ref_inv, ref_scale = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim)), 1
    else:
        ref_inv, ref_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    scaling = None if params["rope_type"] == "default" else params
    rope = RotaryEmbedding(head_dim, head_dim, max_pos, theta, scaling, original_max_position=512)
    positions = torch.tensor([0, 1, 7, 300, 511])
    torch.manual_seed(0)
    q, k = torch.randn(5, 4 * head_dim), torch.randn(5, 2 * head_dim)
    ours_q, ours_k = rope(positions, q, k)
    freqs = positions[:, None].float() * ref_inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = (emb.cos() * ref_scale)[None], (emb.sin() * ref_scale)[None]
    ref_q, ref_k = apply_rotary_pos_emb(
        q.view(1, 5, 4, head_dim).transpose(1, 2),
        k.view(1, 5, 2, head_dim).transpose(1, 2),
        cos,
        sin,
    )
    assert torch.allclose(ours_q, ref_q.transpose(1, 2).reshape(5, -1), atol=1e-5)
    assert torch.allclose(ours_k, ref_k.transpose(1, 2).reshape(5, -1), atol=1e-5)


def test_rotary_position_zero_is_identity_and_norm_is_kept() -> None:
    rope = RotaryEmbedding(8, 8, 64, 10000.0, is_neox_style=False)
    q = torch.randn(2, 16)
    out_q, _ = rope(torch.tensor([0, 33]), q, q[:, :8])
    assert torch.allclose(out_q[0], q[0])
    assert torch.allclose(out_q.view(2, 2, 8).norm(dim=-1), q.view(2, 2, 8).norm(dim=-1))
    assert not torch.allclose(out_q[1], q[1])


def test_dynamic_rope_uses_one_base_for_the_longest_context() -> None:
    plain, _ = compute_inv_freq(10000.0, 16, None, 256)
    dynamic, _ = compute_inv_freq(10000.0, 16, {"rope_type": "dynamic", "factor": 2.0}, 256)
    base = 10000.0 * (2.0 * 2.0 - 1.0) ** (16 / 14)
    assert torch.allclose(dynamic, 1.0 / base ** (torch.arange(0, 16, 2).float() / 16))
    assert dynamic[0] == plain[0] and (dynamic[1:] < plain[1:]).all()


def test_unknown_rope_type_lists_supported() -> None:
    with pytest.raises(ValueError, match=r"'su'.*llama3"):
        compute_inv_freq(10000.0, 16, {"rope_type": "su"}, 256)


def _tensor_parallel_worker(rank: int, world: int, init_file: str, model_dir: str) -> None:
    import torch.distributed as dist

    from radixserve.models.loader import load_model
    from tests.helpers.model_driver import ManualDriver

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        loaded = load_model(model_dir, dtype="float32")
        # Each rank holds half the vocabulary rows (255 -> 2 x 128, one padding row).
        assert loaded.model.model.embed_tokens.weight.shape[0] == 128
        assert loaded.model.model.layers[0].self_attn.num_kv_heads == 1
        driver = ManualDriver(loaded.model, loaded.config, max_tokens=64)
        prefill = driver.forward([(0, TP_PROMPT)], all_logits=True)
        decode = driver.forward([(0, [9])], decode=True)
        torch.save((prefill, decode), Path(model_dir) / f"logits-{rank}.pt")
    finally:
        dist.destroy_process_group()


TP_PROMPT = [5, 17, 42, 99, 3, 250, 7]


def test_two_gloo_ranks_reproduce_the_single_rank_model(tmp_path: Path) -> None:
    """A real 2-rank tensor-parallel run on CPU: sharded loads, all-reduce and gather."""
    import torch.multiprocessing as mp

    from tests.helpers.hf_reference import hf_logits
    from tests.helpers.tiny_models import make_tiny_checkpoint

    hf = make_tiny_checkpoint(tmp_path, "qwen2", vocab_size=255, num_key_value_heads=2)
    mp.spawn(
        _tensor_parallel_worker,
        args=(2, str(tmp_path / "rendezvous"), str(tmp_path)),
        nprocs=2,
        join=True,
    )
    reference = hf_logits(hf, [*TP_PROMPT, 9])
    for rank in range(2):
        prefill, decode = torch.load(tmp_path / f"logits-{rank}.pt")
        assert prefill.shape == (len(TP_PROMPT), 255)
        assert torch.allclose(prefill, reference[:-1], atol=1e-4)
        assert torch.allclose(decode[0], reference[-1], atol=1e-4)
