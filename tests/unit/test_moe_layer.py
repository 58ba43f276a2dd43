"""The MoE layer (radixserve/layers/moe/): routing as transformers routes, the grouped experts
equal to a token-by-token reference, checkpoint layouts, and experts on GGUF blocks equal to
their dequantized float weights, with a batch-1 step reading only the chosen experts' blocks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.kernels import gguf_types as gt
from radixserve.kernels import ops
from radixserve.kernels.block_quantize import q4_1_blocks, q4_k_blocks, q8_0_blocks
from radixserve.kernels.gguf_dequant import dequantize_rows
from radixserve.layers.moe import (
    ExpertBlocks,
    FusedMoE,
    RouterSpec,
    Scoring,
    expert_shard,
    per_expert_tensors,
    route,
    use_gguf_experts,
)
from radixserve.layers.moe import methods as moe_methods

EXPERTS, HIDDEN, INTER = 8, 256, 64


def _moe(top_k: int = 2, renormalize: bool = True, seed: int = 0) -> FusedMoE:
    torch.manual_seed(seed)
    moe = FusedMoE(EXPERTS, HIDDEN, INTER, RouterSpec(top_k, renormalize=renormalize))
    with torch.no_grad():
        moe.w13_weight.normal_(0, 0.05)
        moe.w2_weight.normal_(0, 0.05)
    return moe


def _reference(moe: FusedMoE, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Token by token: the sum over its chosen experts of weight * down(silu(gate) * up)."""
    weights, experts = route(logits, moe.router, x.dtype)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), experts[t].tolist(), strict=True):
            gate, up = F.linear(x[t], moe.w13_weight[e]).chunk(2)
            out[t] += w * F.linear(F.silu(gate) * up, moe.w2_weight[e])
    return out


@pytest.mark.parametrize("renormalize", [True, False])
def test_softmax_routing_matches_transformers(renormalize: bool) -> None:
    logits = torch.randn(5, EXPERTS)
    weights, experts = route(logits, RouterSpec(3, renormalize=renormalize), torch.float32)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    top, ids = torch.topk(probs, 3, dim=-1)
    if renormalize:
        top /= top.sum(dim=-1, keepdim=True)
    assert torch.equal(experts, ids) and torch.equal(weights, top)


def test_sigmoid_routing() -> None:
    logits = torch.randn(4, EXPERTS)
    weights, experts = route(logits, RouterSpec(2, Scoring.SIGMOID, True), torch.float32)
    top, ids = torch.topk(torch.sigmoid(logits), 2, dim=-1)
    assert torch.equal(experts, ids)
    assert torch.allclose(weights, top / top.sum(-1, keepdim=True))


@pytest.mark.parametrize("tokens", [1, 3, 17])
def test_grouped_experts_equal_token_by_token(tokens: int) -> None:
    moe = _moe()
    x, logits = torch.randn(tokens, HIDDEN), torch.randn(tokens, EXPERTS)
    assert torch.allclose(moe(x, logits), _reference(moe, x, logits), atol=1e-5)


def test_per_expert_and_stacked_names() -> None:
    assert expert_shard("model.layers.3.mlp.experts.5.up_proj.weight") == (
        "model.layers.3.mlp.experts.w13_weight",
        (5, "up"),
    )
    assert expert_shard("m.layers.0.mlp.experts.1.w2.weight") == (
        "m.layers.0.mlp.experts.w2_weight",
        (1, "down"),
    )
    assert expert_shard("model.layers.0.mlp.shared_expert.gate_proj.weight") is None
    gate_up = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    down = torch.zeros(2, 3, 2)
    split = dict(
        per_expert_tensors(
            [("l.mlp.experts.gate_up_proj", gate_up), ("l.mlp.experts.down_proj", down)]
        )
    )
    assert sorted(split) == sorted(
        f"l.mlp.experts.{e}.{p}.weight"
        for e in (0, 1)
        for p in ("gate_proj", "up_proj", "down_proj")
    )
    assert torch.equal(split["l.mlp.experts.1.up_proj.weight"], gate_up[1, 2:])


def test_loader_fills_each_expert_slot() -> None:
    moe = _moe()
    gate, up, down = (
        torch.randn(INTER, HIDDEN),
        torch.randn(INTER, HIDDEN),
        torch.randn(HIDDEN, INTER),
    )
    moe.weight_loader(moe.w13_weight, gate, (3, "gate"))
    moe.weight_loader(moe.w13_weight, up, (3, "up"))
    moe.weight_loader(moe.w2_weight, down, (3, "down"))
    assert torch.equal(moe.w13_weight[3], torch.cat([gate, up]))
    assert torch.equal(moe.w2_weight[3], down)
    with pytest.raises(ValueError):
        moe.weight_loader(moe.w2_weight, down, (EXPERTS, "down"))


def _on_blocks(moe: FusedMoE) -> FusedMoE:
    """`moe`'s weights quantized (gate Q4_K, up and down Q8_0: gate|up of mixed types), the
    float weights replaced by what the blocks hold, and a copy of it on the blocks."""
    gate_w, up_w = moe.w13_weight[:, :INTER], moe.w13_weight[:, INTER:]
    gate = torch.stack([q4_k_blocks(w) for w in gate_w])
    up = torch.stack([q8_0_blocks(w) for w in up_w])
    down = torch.stack([q8_0_blocks(w) for w in moe.w2_weight])
    with torch.no_grad():
        for e in range(EXPERTS):
            moe.w13_weight[e, :INTER] = dequantize_rows(gate[e], gt.Q4_K, INTER)
            moe.w13_weight[e, INTER:] = dequantize_rows(up[e], gt.Q8_0, INTER)
            moe.w2_weight[e] = dequantize_rows(down[e], gt.Q8_0, HIDDEN)
    blocked = FusedMoE(EXPERTS, HIDDEN, INTER, moe.router)
    use_gguf_experts(
        blocked,
        [ExpertBlocks(gate, gt.Q4_K, INTER), ExpertBlocks(up, gt.Q8_0, INTER)],
        ExpertBlocks(down, gt.Q8_0, HIDDEN),
    )
    return blocked


@pytest.mark.parametrize("tokens", [1, 9])
def test_gguf_experts_equal_their_float_weights(tokens: int) -> None:
    moe = _moe(seed=1)
    blocked = _on_blocks(moe)
    assert blocked.w13_weight.numel() == 0 and blocked.quant_method.block_bytes() > 0
    x, logits = torch.randn(tokens, HIDDEN), torch.randn(tokens, EXPERTS)
    ours, ref = blocked(x, logits), moe(x, logits)
    # The integer kernels quantize the activations: close, not bitwise.
    assert torch.allclose(ours, ref, atol=2e-2 * ref.abs().max().item())


def test_batch_one_reads_only_the_chosen_experts(monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = _on_blocks(_moe(seed=2))
    method = blocked.quant_method
    starts = {
        part.blocks[e].data_ptr(): e
        for part in (*method.gate_up_parts, method.down_part)
        for e in range(EXPERTS)
    }
    read: list[int] = []
    real = moe_methods.ops.gguf_linear

    def recording(x: torch.Tensor, blocks: torch.Tensor, qtype: int, rows: int) -> torch.Tensor:
        read.append(starts[blocks.data_ptr()])
        assert blocks.shape[0] == rows  # one expert's rows, nothing more
        return real(x, blocks, qtype, rows)

    monkeypatch.setattr(moe_methods.ops, "gguf_linear", recording)
    x, logits = torch.randn(1, HIDDEN), torch.randn(1, EXPERTS)
    blocked(x, logits)
    chosen = route(logits, blocked.router, x.dtype).experts[0].tolist()
    assert sorted(set(read)) == sorted(chosen)
    assert len(read) == 3 * len(chosen)  # gate and up (mixed types), down: per chosen expert


@pytest.mark.parametrize("tokens", [1, 6])
def test_two_ranks_slices_sum_to_the_whole(monkeypatch: pytest.MonkeyPatch, tokens: int) -> None:
    """Under --tp-size 2 each rank loads its half of every expert's intermediate dimension;
    the ranks' outputs (summed by the all-reduce, here by hand) are the whole layer's."""
    from radixserve.layers.moe import fused_moe

    whole = _moe(seed=4)
    x, logits = torch.randn(tokens, HIDDEN), torch.randn(tokens, EXPERTS)
    expected = whole(x, logits)
    monkeypatch.setattr(fused_moe.ps, "get_tp_size", lambda: 2)
    monkeypatch.setattr(fused_moe.ps, "tensor_model_parallel_all_reduce", lambda t: t)
    total = torch.zeros_like(expected)
    for rank in range(2):
        monkeypatch.setattr(fused_moe.ps, "get_tp_rank", lambda rank=rank: rank)
        part = FusedMoE(EXPERTS, HIDDEN, INTER, whole.router)
        assert part.w13_weight.shape == (EXPERTS, INTER, HIDDEN)  # half of 2 * INTER rows
        for e in range(EXPERTS):
            gate, up = whole.w13_weight[e].chunk(2)
            part.weight_loader(part.w13_weight, gate, (e, "gate"))
            part.weight_loader(part.w13_weight, up, (e, "up"))
            part.weight_loader(part.w2_weight, whole.w2_weight[e], (e, "down"))
        total += part(x, logits)
    assert torch.allclose(total, expected, atol=1e-5)


def test_one_token_path_equals_the_grouped_path() -> None:
    """Batch 1 takes its own loop; it gives the grouped path's bits for that row."""
    moe = _moe(seed=3)
    for seed in range(4):
        torch.manual_seed(seed)
        x, logits = torch.randn(1, HIDDEN), torch.randn(1, EXPERTS)
        weights, experts = route(logits, moe.router, x.dtype)
        assert torch.equal(moe(x, logits), moe._grouped(x, weights, experts))


_QUANTIZERS = {gt.Q4_K: q4_k_blocks, gt.Q8_0: q8_0_blocks, gt.Q4_1: q4_1_blocks}


def _blocked(moe: FusedMoE, gate_t: int, up_t: int, down_t: int) -> FusedMoE:
    """A copy of `moe` on blocks of the given types (gate|up one part when they match)."""
    inter = moe.intermediate_size
    gate = torch.stack([_QUANTIZERS[gate_t](w) for w in moe.w13_weight[:, :inter]])
    up = torch.stack([_QUANTIZERS[up_t](w) for w in moe.w13_weight[:, inter:]])
    down = torch.stack([_QUANTIZERS[down_t](w) for w in moe.w2_weight])
    blocked = FusedMoE(EXPERTS, HIDDEN, inter, moe.router)
    use_gguf_experts(
        blocked,
        [ExpertBlocks(gate, gate_t, inter), ExpertBlocks(up, up_t, inter)],
        ExpertBlocks(down, down_t, HIDDEN),
    )
    return blocked


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="the C++ kernels are not built")
@pytest.mark.parametrize("int8", [True, False], ids=["int8", "int16"])
@pytest.mark.parametrize(
    "types",
    [(gt.Q4_K, gt.Q4_K, gt.Q8_0), (gt.Q4_K, gt.Q8_0, gt.Q4_K), (gt.Q4_1, gt.Q4_1, gt.Q8_0)],
    ids=["q4k|q4k-q8_0", "q4k|q8_0-q4k", "q4_1-q8_0"],
)
def test_fused_one_token_kernel_equals_the_expert_loop(
    types: tuple[int, int, int], int8: bool
) -> None:
    """kernels/csrc/moe.cpp on one row (both projections of every chosen expert in two parallel
    regions) gives the per-expert loop's bits, whatever the block types and activation
    format."""
    from radixserve.kernels.build import load_extension

    ext = load_extension()
    before = ext.kquant_int8()
    ext.set_kquant_int8(int8)
    try:
        torch.manual_seed(5)
        moe = FusedMoE(EXPERTS, HIDDEN, 256, RouterSpec(3))  # K-quant down rows: 256 wide
        with torch.no_grad():
            moe.w13_weight.normal_(0, 0.05)
            moe.w2_weight.normal_(0, 0.05)
        blocked = _blocked(moe, *types)
        for seed in range(4):
            torch.manual_seed(seed)
            x, logits = torch.randn(1, HIDDEN), torch.randn(1, EXPERTS)
            blocked.act.use_fast_kernels = False
            loop = blocked(x, logits)
            blocked.act.use_fast_kernels = True
            fused = blocked(x, logits)
            weights, experts = route(logits, blocked.router, x.dtype)
            chosen = sorted(zip(experts[0].tolist(), weights[0].tolist(), strict=True))
            direct = blocked.quant_method.few_rows(x, experts, weights)
            assert direct is not None
            assert torch.equal(direct, fused)
            # The loop's silu_and_mul on the fast path is the C++ one: compare with it on.
            assert torch.equal(fused, _loop_with_fast_act(blocked, x, chosen)), seed
            assert torch.allclose(fused, loop, atol=1e-5 * loop.abs().max().item() + 1e-6)
    finally:
        ext.set_kquant_int8(before)


def _loop_with_fast_act(moe: FusedMoE, x: torch.Tensor, chosen: list) -> torch.Tensor:
    method = moe.quant_method
    out = torch.zeros_like(x)
    for expert, weight in chosen:
        y = method.down(moe, expert, moe.act(method.gate_up(moe, expert, x)))
        out += y * weight
    return out


@pytest.mark.skipif(not ops.using_cpp_kernels(), reason="the C++ kernels are not built")
@pytest.mark.parametrize("int8", [True, False], ids=["int8", "int16"])
@pytest.mark.parametrize(
    "types",
    [(gt.Q4_K, gt.Q4_K, gt.Q8_0), (gt.Q4_K, gt.Q8_0, gt.Q4_K), (gt.Q4_1, gt.Q4_1, gt.Q8_0)],
    ids=["q4k|q4k-q8_0", "q4k|q8_0-q4k", "q4_1-q8_0"],
)
def test_few_rows_kernel_gives_each_row_its_batch_one_bits(
    types: tuple[int, int, int], int8: bool
) -> None:
    """kernels/csrc/moe.cpp's moe_rows_gguf (every chosen expert over its rows, all in two
    parallel regions) runs the grouped path up to its row limit: each row's output is bitwise
    what that row gets alone, so the batch does not change a token's result, and it stays
    close to the per-expert loop on the reference activation."""
    from radixserve.kernels.build import load_extension

    ext = load_extension()
    before = ext.kquant_int8()
    ext.set_kquant_int8(int8)
    try:
        torch.manual_seed(6)
        moe = FusedMoE(EXPERTS, HIDDEN, 256, RouterSpec(3))
        with torch.no_grad():
            moe.w13_weight.normal_(0, 0.05)
            moe.w2_weight.normal_(0, 0.05)
        blocked = _blocked(moe, *types)
        limit = ext.moe_rows_max_tokens
        for tokens in (2, 9, limit):
            x, logits = torch.randn(tokens, HIDDEN), torch.randn(tokens, EXPERTS)
            weights, experts = route(logits, blocked.router, x.dtype)
            fused = blocked.quant_method.few_rows(x, experts, weights)
            assert fused is not None
            blocked.act.use_fast_kernels = True
            assert torch.equal(blocked(x, logits), fused)
            for t in range(tokens):
                alone = blocked(x[t : t + 1], logits[t : t + 1])
                assert torch.equal(fused[t : t + 1], alone), (tokens, t)
            blocked.act.use_fast_kernels = False
            loop = blocked(x, logits)
            # Many rows of gguf_linear may take float tiles (no activation quantization).
            assert torch.allclose(fused, loop, atol=3e-2 * loop.abs().max().item())
        x = torch.randn(limit + 1, HIDDEN)
        weights, experts = route(torch.randn(limit + 1, EXPERTS), blocked.router, x.dtype)
        assert blocked.quant_method.few_rows(x, experts, weights) is None  # many-row GEMMs
    finally:
        ext.set_kquant_int8(before)
