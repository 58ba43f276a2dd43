"""bfloat16/float16 checkpoints served in float32 keep their weights 16-bit and widen them as
they multiply: exact weights (every 16-bit value is a float32 value), half the memory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixserve import Engine
from radixserve.kernels import ops
from radixserve.models.loader import load_model
from tests.helpers.hf_reference import hf_greedy_ids
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

PROMPTS = [[1, 5, 9, 30, 12, 7], [1, 40, 41, 42], [3]]
NEW_TOKENS = 10


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rows", [1, 3, 5, 8, 17])
def test_half_weight_linear_equals_widened_float_matmul(dtype: torch.dtype, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(37, 72, generator=gen).to(dtype)
    x = torch.randn(rows, 72, generator=gen)
    bias = torch.randn(37, generator=gen)
    expected = x.double() @ w.double().T + bias.double()
    got = ops.half_weight_linear(x, w, bias)
    assert got.dtype == torch.float32 and got.shape == (rows, 37)
    assert ((got.double() - expected).abs().max() / expected.abs().max()).item() < 1e-5


def _checkpoint(tmp_path: Path, dtype: torch.dtype, tied: bool = False) -> tuple[Path, object]:
    hf = tiny_hf_model(tiny_hf_config("llama", tie_word_embeddings=tied))
    folder = tmp_path / f"tiny-{str(dtype).removeprefix('torch.')}"
    hf.to(dtype).save_pretrained(folder)
    # The float32 reference is the 16-bit checkpoint widened, as transformers loads it.
    return folder, hf.to(torch.float32).eval()


def _hf_greedy(hf: torch.nn.Module) -> list[list[int]]:
    return hf_greedy_ids(hf, PROMPTS, NEW_TOKENS)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_weights_stay_16_bit(tmp_path: Path, dtype: torch.dtype, tied: bool) -> None:
    folder, _ = _checkpoint(tmp_path, dtype, tied)
    loaded = load_model(str(folder), dtype="float32")
    model = loaded.model
    layer = model.model.layers[0]
    assert layer.self_attn.qkv_proj.weight.dtype == dtype
    assert layer.mlp.down_proj.weight.dtype == dtype
    assert model.model.embed_tokens.weight.dtype == dtype
    assert model.lm_head.weight.dtype == dtype
    assert layer.input_layernorm.weight.dtype == torch.float32
    ids = torch.tensor([1, 2, 3])
    assert model.model.embed_tokens(ids).dtype == torch.float32


def test_float32_checkpoint_stays_float32(tmp_path: Path) -> None:
    hf = tiny_hf_model(tiny_hf_config("llama"))
    hf.save_pretrained(tmp_path / "f32")
    model = load_model(str(tmp_path / "f32"), dtype="float32").model
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float32


@pytest.mark.parametrize(
    ("dtype", "backend"),
    [
        (torch.bfloat16, "torch_native"),
        (torch.bfloat16, "intel_amx"),
        (torch.float16, "intel_amx"),
    ],
    ids=["bf16-torch_native", "bf16-fast", "fp16-fast"],
)
def test_greedy_equals_transformers_in_float32(
    tmp_path: Path, dtype: torch.dtype, backend: str
) -> None:
    folder, hf = _checkpoint(tmp_path, dtype)
    with Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        attention_backend=backend,
        skip_tokenizer_init=True,
        max_total_tokens=2048,
    ) as engine:
        outs = engine.generate(
            input_ids=PROMPTS,
            sampling_params={"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
        )
    assert [o["output_ids"] for o in outs] == _hf_greedy(hf)


def test_loading_reads_tensors_without_keeping_the_file_mapped(tmp_path: Path) -> None:
    """Safetensors are read tensor by tensor with file reads (a memory map kept every page of
    the checkpoint in the process until loading ended), values unchanged, and a tensor of a
    dtype radixserve does not load is named."""
    import json

    from safetensors.torch import load_file

    from radixserve.models.weight_utils import WeightFiles, iterate_weights

    folder, _ = _checkpoint(tmp_path, torch.bfloat16)
    path = folder / "model.safetensors"
    ours = dict(iterate_weights(WeightFiles([path], True), progress=False))
    theirs = load_file(str(path))
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) and ours[k].dtype == theirs[k].dtype for k in ours)
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    name = sorted(k for k in header if k != "__metadata__")[0]
    # the same header with one tensor's dtype renamed (same length, so offsets stay valid)
    entry = json.dumps(header[name], separators=(",", ":")).encode()
    assert entry in raw[8 : 8 + length]
    text = raw[8 : 8 + length].replace(entry, entry.replace(b'"BF16"', b'"XF16"'), 1)
    odd = tmp_path / "odd.safetensors"
    odd.write_bytes(raw[:8] + text + raw[8 + length :])
    with pytest.raises(ValueError, match=f"{name} has dtype 'XF16'"):
        list(iterate_weights(WeightFiles([odd], True), progress=False))
