"""gpt-oss MXFP4 experts served on their blocks.

The repack of a safetensors checkpoint's blocks and scales into ggml's block_mxfp4 (bitwise the
values the checkpoint decoder and gguf-py give), the block kernels on MXFP4 (C++ integer
kernel and the PyTorch fallback that decodes a tile at a time) against the decoded weight, and
a tiny model loaded from an MXFP4 folder: its experts held as 17 bytes per 32 weights with no
float copy, and its greedy tokens those of the same model with the experts decoded to float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixserve.kernels import gguf_dequant, gguf_types, ops, reference
from radixserve.layers.moe import ExpertBlocks, FusedMoE, GGUFExpertsMethod, RouterSpec, Scoring
from radixserve.layers.quantization.mxfp4 import dequantize_mxfp4, repack_mxfp4
from radixserve.models.gpt_oss_blocks import MxFp4ExpertLoader, repack_stack
from radixserve.models.loader import load_model
from tests.helpers.family_check import require_hf_arch
from tests.helpers.model_driver import ManualDriver
from tests.helpers.tiny_gpt_oss_mxfp4 import mxfp4_encode, write_mxfp4_checkpoint
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

MXFP4 = gguf_types.MXFP4
PROMPTS = [[3, 5, 9, 30, 12], [6, *range(60, 76)]]  # the second past the 8-token window
NEW_TOKENS = 8


def _checkpoint_blocks(rows: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows, k // 32, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(116, 124, (rows, k // 32), generator=gen, dtype=torch.uint8)
    return blocks, scales


def test_repack_holds_the_checkpoint_values_in_ggml_layout() -> None:
    """Every scale byte but the reserved 255 (NaN in the spec, unused by checkpoints; the
    decoders differ on it) and random codes decode the same from the repacked blocks, by our
    GGUF decoder and by gguf-py's, as the checkpoint's own decoder gives it."""
    from gguf import GGMLQuantizationType, dequantize

    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (255, 2, 16), generator=gen, dtype=torch.uint8)
    scales = torch.arange(255, dtype=torch.uint8)[:, None].repeat(1, 2)
    packed = repack_mxfp4(blocks, scales)
    assert packed.shape == (255, 2 * 17) and packed.dtype == torch.uint8
    want = dequantize_mxfp4(blocks, scales)
    ours = gguf_dequant.dequantize_rows(packed, MXFP4, 255)
    with np.errstate(over="ignore"):  # 6 * 2 ** 127 is inf in float32, in every decoder
        theirs = np.asarray(dequantize(packed.numpy(), GGMLQuantizationType.MXFP4), np.float32)
    torch.testing.assert_close(ours, want, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(torch.from_numpy(theirs), want, rtol=0, atol=0, equal_nan=True)
    # The layouts really differ: checkpoint byte 0 holds elements 0 and 1, ggml's 0 and 16.
    one = torch.zeros(1, 1, 16, dtype=torch.uint8)
    one[0, 0, 0] = 0x21  # element 0 = code 1, element 1 = code 2
    got = repack_mxfp4(one, torch.full((1, 1), 127, dtype=torch.uint8))
    assert got[0, 0] == 127 and got[0, 1] == 0x01 and got[0, 2] == 0x02
    with pytest.raises(ValueError, match="not uint8"):
        repack_mxfp4(one, torch.full((1, 1), 127, dtype=torch.uint8), torch.empty(1, 16))
    with pytest.raises(ValueError, match="do not match"):
        repack_mxfp4(one, torch.full((1, 2), 127, dtype=torch.uint8))


def test_repack_stack_puts_gate_rows_first() -> None:
    blocks, scales = _checkpoint_blocks(3 * 8, 64, seed=1)
    blocks, scales = blocks.view(3, 8, 2, 16), scales.view(3, 8, 2)
    stack = repack_stack(blocks, scales, gate_up=True)
    assert stack.shape == (3, 8, 2 * 17)
    for e in range(3):
        decoded = dequantize_mxfp4(blocks[e], scales[e])
        want = torch.cat([decoded[0::2], decoded[1::2]])
        assert torch.equal(gguf_dequant.dequantize_rows(stack[e], MXFP4, 8), want)


@pytest.fixture(params=["cpp", "torch"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The C++ block kernels (skipped where not built), or the PyTorch fallback."""
    if request.param == "torch":
        monkeypatch.setattr(ops, "load_extension", lambda: None)
    elif not ops.using_cpp_kernels():
        pytest.skip("C++ kernels not built here")
    return request.param


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("rows", [1, 3, 5, 16])
def test_gguf_linear_on_mxfp4_matches_the_decoded_weight(kernels: str, rows: int) -> None:
    """The C++ kernel (int16 activations per 32: within 1e-4 of the float64 product, relative
    to its largest output) and the fallback (float weights decoded a tile at a time: 1e-5),
    on K of several blocks and an output count off the 4-column tiles."""
    n, k = 37, 320
    blocks, scales = _checkpoint_blocks(n, k, seed=rows)
    packed = repack_mxfp4(blocks, scales)
    w = dequantize_mxfp4(blocks, scales)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    assert ops.gguf_kernel_type(MXFP4) == (kernels == "cpp")
    got = ops.gguf_linear(x, packed, MXFP4, n)
    assert _relative_error(got, x.double() @ w.double().T) < (1e-4 if kernels == "cpp" else 1e-5)
    if kernels == "cpp" and rows < 12:
        # On the integer kernel (below 12 rows; float tiles from there, gguf_gemm.cpp) a row's
        # bits do not depend on its batch.
        alone = ops.gguf_linear(x[:1].contiguous(), packed, MXFP4, n)
        assert torch.equal(alone[0], got[0])
    if kernels == "torch":  # the fallback is the reference's tile-wise decode
        assert torch.equal(got, reference.gguf_linear(x, packed, MXFP4, n))


def test_experts_method_runs_each_selected_expert_on_its_blocks(kernels: str) -> None:
    """GGUFExpertsMethod on a repacked stack: each expert's gate|up and down equal F.linear on
    that expert's decoded weight (gate rows first)."""
    experts, hidden, inter = 4, 64, 32
    gen = torch.Generator().manual_seed(5)
    gu = [mxfp4_encode(2 * inter, hidden, gen) for _ in range(experts)]
    dn = [mxfp4_encode(hidden, inter, gen) for _ in range(experts)]
    gate_up = repack_stack(
        torch.stack([b for b, _, _ in gu]), torch.stack([s for _, s, _ in gu]), gate_up=True
    )
    down = repack_stack(
        torch.stack([b for b, _, _ in dn]), torch.stack([s for _, s, _ in dn]), gate_up=False
    )
    method = GGUFExpertsMethod(
        (ExpertBlocks(gate_up, MXFP4, 2 * inter),), ExpertBlocks(down, MXFP4, hidden)
    )
    x = torch.randn(3, hidden, generator=gen)
    tol = 1e-4 if kernels == "cpp" else 1e-5
    for e in (2, 0):
        w = gu[e][2]
        want = F.linear(x.double(), torch.cat([w[0::2], w[1::2]]).double())
        assert _relative_error(method.gate_up(None, e, x), want) < tol
        h = torch.randn(3, inter, generator=gen)
        assert _relative_error(method.down(None, e, h), h.double() @ dn[e][2].double().T) < tol


# --- the whole model ---


@pytest.fixture(scope="module")
def mxfp4_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_hf_arch("gpt_oss")
    folder = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    hf = tiny_hf_model(tiny_hf_config("gpt_oss", swiglu_limit=0.5), 4)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("sinks") or name.endswith("_bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    write_mxfp4_checkpoint(folder, hf, seed=6)
    return folder


def test_model_holds_its_experts_as_mxfp4_blocks(mxfp4_folder: Path) -> None:
    """17 bytes per 32 expert weights, in every MoE layer, and no float expert weights."""
    model = load_model(str(mxfp4_folder), dtype="float32").model
    hf = model.config.hf_config
    experts, hidden, inter = hf.num_local_experts, hf.hidden_size, hf.intermediate_size
    weights = experts * (2 * inter * hidden + hidden * inter)
    for layer in model.model.layers:
        moe = layer.mlp.experts
        method = moe.quant_method
        assert isinstance(method, GGUFExpertsMethod)
        assert {p.qtype for p in (*method.gate_up_parts, method.down_part)} == {MXFP4}
        assert method.block_bytes() == weights * 17 // 32
        assert moe.w13_weight.numel() == 0 and moe.w2_weight.numel() == 0
        # and the module's buffers are those blocks (what memory accounting counts)
        held = sum(b.numel() * b.element_size() for b in moe.buffers())
        assert held == weights * 17 // 32


def _teacher_forced_greedy(
    ours: ManualDriver, decoded: ManualDriver, prompt: list[int], req: int
) -> list[int]:
    """Our greedy tokens, each step checked against the decoded model's logits for the same
    sequence: the same argmax, unless the decoded model's top two are within a near-tie."""
    a = ours.forward([(req, prompt)])[0]
    b = decoded.forward([(req, prompt)])[0]
    tokens: list[int] = []
    for _ in range(NEW_TOKENS):
        assert float((a - b).abs().max()) < 1e-3 * float(b.abs().max())
        token = int(a.argmax())
        if token != int(b.argmax()):
            gap = float(b.max() - b[token])
            assert gap < 1e-4 * float(b.abs().max()), f"token {token} is {gap} below the best"
        tokens.append(token)
        a = ours.forward([(req, [token])], decode=True)[0]
        b = decoded.forward([(req, [token])], decode=True)[0]
    return tokens


def test_greedy_on_blocks_equals_the_decoded_model(
    mxfp4_folder: Path, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model on MXFP4 blocks and the same folder with its experts decoded to float32
    (gpt_oss_checkpoint's per-expert decode, the path taken before blocks were kept) give the
    same greedy tokens, checked step by step on one sequence."""
    on_blocks = load_model(str(mxfp4_folder), dtype="float32")
    with monkeypatch.context() as m:
        m.setattr(MxFp4ExpertLoader, "__call__", lambda *args: False)
        decoded = load_model(str(mxfp4_folder), dtype="float32")
    decoded_experts = decoded.model.model.layers[0].mlp.experts
    assert decoded_experts.w13_weight.dtype == torch.float32
    assert decoded_experts.w13_weight.numel() > 0
    ours = ManualDriver(on_blocks.model, on_blocks.config)
    theirs = ManualDriver(decoded.model, decoded.config)
    for req, prompt in enumerate(PROMPTS):
        tokens = _teacher_forced_greedy(ours, theirs, prompt, req)
        assert len(set(tokens)) > 1  # not a degenerate repeat


# --- tensor parallel: each rank's slice of the blocks ---


def _moe_on_rank(monkeypatch: pytest.MonkeyPatch, rank: int, hidden: int, inter: int) -> nn.Module:
    """A FusedMoE as MoE-TP rank `rank` of 2 builds it (parallel_state answered here), in a
    module whose `experts` it is."""
    from radixserve.distributed import parallel_state as ps

    for name, value in (
        ("get_tp_rank", rank),
        ("get_tp_size", 2),
        ("get_moe_tp_rank", rank),
        ("get_moe_tp_size", 2),
    ):
        monkeypatch.setattr(ps, name, lambda value=value: value)
    holder = nn.Module()
    holder.experts = FusedMoE(3, hidden, inter, RouterSpec(2, Scoring.TOPK_SOFTMAX), bias=True)
    return holder


@pytest.mark.parametrize("rank", [0, 1])
def test_tensor_parallel_rank_keeps_its_slice_as_blocks(
    monkeypatch: pytest.MonkeyPatch, rank: int
) -> None:
    """--tp-size 2: a rank holds its half of every expert's gate and up rows and of down's
    input columns, as blocks, and multiplies them as the decoded slices."""
    experts, hidden, inter = 3, 64, 64
    gen = torch.Generator().manual_seed(7)
    gu = [mxfp4_encode(2 * inter, hidden, gen) for _ in range(experts)]
    dn = [mxfp4_encode(hidden, inter, gen) for _ in range(experts)]
    holder = _moe_on_rank(monkeypatch, rank, hidden, inter)
    loader = MxFp4ExpertLoader(holder)
    stack = lambda parts, i: torch.stack([p[i] for p in parts])  # noqa: E731
    assert loader("experts", "gate_up_proj", stack(gu, 0), stack(gu, 1))
    assert loader("experts", "down_proj", stack(dn, 0), stack(dn, 1))
    moe = holder.experts
    assert isinstance(moe.quant_method, GGUFExpertsMethod) and loader.layers_on_blocks == 1
    half = inter // 2
    rows = slice(rank * half, (rank + 1) * half)
    x = torch.randn(2, hidden, generator=gen)
    h = torch.randn(2, half, generator=gen)
    for e in range(experts):
        w = gu[e][2]
        want = torch.cat([w[0::2][rows], w[1::2][rows]]).double()
        assert _relative_error(moe.quant_method.gate_up(moe, e, x), x.double() @ want.T) < 1e-4
        down = dn[e][2][:, rows].double()
        assert _relative_error(moe.quant_method.down(moe, e, h), h.double() @ down.T) < 1e-4


def test_a_slice_off_the_blocks_is_decoded_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    """An intermediate size whose rank slice is not whole blocks of 32: the loader declines
    (the checkpoint reader decodes those experts to float)."""
    holder = _moe_on_rank(monkeypatch, 1, 64, 32)  # 16 columns a rank
    blocks, scales = _checkpoint_blocks(3 * 64, 64, seed=2)
    loader = MxFp4ExpertLoader(holder)
    assert not loader("experts", "gate_up_proj", blocks.view(3, 64, 2, 16), scales.view(3, 64, 2))
    assert loader.layers_on_blocks == 0


def test_bfloat16_model_runs_on_the_same_blocks(mxfp4_folder: Path) -> None:
    """--dtype bfloat16: the experts stay MXFP4 blocks (bfloat16 rows into the block kernel)
    and the logits stay within bfloat16 rounding of the float32 model's."""
    prompt = PROMPTS[0]
    logits = {}
    for dtype in ("float32", "bfloat16"):
        loaded = load_model(str(mxfp4_folder), dtype=dtype)
        experts = loaded.model.model.layers[0].mlp.experts
        assert isinstance(experts.quant_method, GGUFExpertsMethod)
        assert experts.w13_bias.dtype == getattr(torch, dtype)
        driver = ManualDriver(loaded.model, loaded.config)
        logits[dtype] = driver.forward([(0, prompt)], all_logits=True).float()
    want = logits["float32"]
    assert _relative_error(logits["bfloat16"], want.double()) < 5e-2
