"""--dtype auto for a GGUF run on its blocks (options/resolve.py): float32 activations where most
block bytes are K-quants (with the CPU's bfloat16 KV cache where it has one), the CPU's usual
choice otherwise, and explicit settings untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve.kernels import gguf_types as gt
from radixserve.options import hardware
from radixserve.server_args import ServerArgs
from radixserve.utils.auto_dtype import DtypeChoice
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from tests.helpers.tiny_gguf import write_block_gguf
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model


@pytest.fixture(autouse=True)
def _bf16_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A private cache, and a CPU whose auto choice is bfloat16 (as on AMX/AVX512-BF16 ones)."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(hardware, "cpu_auto_dtype", lambda: DtypeChoice("bfloat16", "test"))


def _file(tmp_path: Path, default_type: int, types: dict[str, int] | None = None) -> Path:
    cfg = tiny_hf_config(
        "llama", vocab_size=59, hidden_size=256, intermediate_size=512, head_dim=64
    )
    return write_block_gguf(tmp_path / "m.gguf", tiny_hf_model(cfg), types or {}, default_type)


def test_k_quant_file_runs_float32_with_a_bf16_kv_cache(tmp_path: Path) -> None:
    args = ServerArgs.from_kwargs(model_path=str(_file(tmp_path, gt.Q4_K, {"attn_v": gt.Q6_K})))
    assert args.quantization == "gguf"
    assert args.resolved_dtype == "float32"
    assert args.resolved_kv_cache_dtype == "bfloat16"


def test_other_block_types_keep_the_cpu_choice(tmp_path: Path) -> None:
    args = ServerArgs.from_kwargs(model_path=str(_file(tmp_path, gt.Q8_0)))
    assert args.resolved_dtype == "bfloat16"


@pytest.mark.parametrize(
    ("kwargs", "dtype", "kv"),
    [
        ({"dtype": "bfloat16"}, "bfloat16", "bfloat16"),  # asked for: kept
        ({"kv_cache_dtype": "bf16"}, "float32", "bfloat16"),
        ({"quantization": "unquant"}, "bfloat16", "bfloat16"),  # dequantized: a float model
    ],
)
def test_explicit_settings_are_kept(
    tmp_path: Path, kwargs: dict[str, str], dtype: str, kv: str
) -> None:
    args = ServerArgs.from_kwargs(model_path=str(_file(tmp_path, gt.Q4_K)), **kwargs)
    assert (args.resolved_dtype, args.resolved_kv_cache_dtype) == (dtype, kv)


def test_float32_cpu_keeps_the_kv_cache_auto(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hardware, "cpu_auto_dtype", lambda: DtypeChoice("float32", "test"))
    args = ServerArgs.from_kwargs(model_path=str(_file(tmp_path, gt.Q4_K)))
    assert (args.resolved_dtype, args.resolved_kv_cache_dtype) == ("float32", "float32")
