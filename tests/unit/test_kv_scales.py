"""An FP8 KV cache's per-layer scales: --quantization-param-path (SGLang's/vLLM's JSON), the
checkpoint's k_scale/v_scale tensors, else 1.0 with a warning; and the runner's refusals."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixserve.model_executor.kv_scales import load_kv_scales
from tests.unit.tiny_model import make_tiny_engine, write_tiny_llama

E4M3 = torch.float8_e4m3fn


def _json(tmp_path: Path, table: dict, dtype: str = "float8_e4m3fn") -> str:
    path = tmp_path / "kv_scales.json"
    path.write_text(json.dumps({"kv_cache": {"dtype": dtype, "scaling_factor": table}}))
    return str(path)


def _load(param_path: str | None, model_dir: Path | None = None, tp: tuple[int, int] = (0, 1)):
    return load_kv_scales(
        kv_dtype=E4M3,
        num_layers=2,
        tp_rank=tp[0],
        tp_size=tp[1],
        param_path=param_path,
        model_dir=model_dir,
    )


def test_json_scales_of_this_rank(tmp_path: Path) -> None:
    path = _json(tmp_path, {"0": {"0": 0.5, "1": 2.0}, "1": {"0": 0.25, "1": 4.0}})
    scales = _load(path, tp=(1, 2))
    assert scales.k == [0.25, 4.0] and scales.v == [0.25, 4.0]


@pytest.mark.parametrize(
    ("table", "dtype", "message"),
    [
        ({"0": {"0": 1.0, "1": 1.0}}, "float8_e5m2", "for float8_e5m2"),
        ({"0": {"0": 1.0}}, "float8_e4m3fn", "each of the model's 2 layers"),
        ({"0": {"0": 1.0, "1": 1.0}, "1": {"0": 1.0, "1": 1.0}}, "float8_e4m3fn", "2 tensor"),
        ({"0": {"0": 1.0, "1": -1.0}}, "float8_e4m3fn", "positive"),
    ],
)
def test_json_refused_when_it_does_not_fit(
    tmp_path: Path, table: dict, dtype: str, message: str
) -> None:
    with pytest.raises(ValueError, match="--quantization-param-path") as err:
        _load(_json(tmp_path, table, dtype))
    assert message in str(err.value)


def test_checkpoint_scales(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {
        "model.layers.0.self_attn.k_scale": torch.tensor(0.5),
        "model.layers.0.self_attn.v_scale": torch.tensor(0.25),
        "model.layers.1.self_attn.kv_scale": torch.tensor([1.5, 3.0]),  # per head: the largest
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(2, 2),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    scales = _load(None, tmp_path)
    assert (scales.k, scales.v, scales.source) == ([0.5, 3.0], [0.25, 3.0], "the checkpoint")
    # The JSON, where given, wins over the checkpoint (as SGLang loads it last).
    path = _json(tmp_path, {"0": {"0": 0.125, "1": 0.125}})
    assert _load(path, tmp_path).k == [0.125, 0.125]


def test_no_scales_anywhere_is_one_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="radixserve.model_executor.kv_scales"):
        scales = _load(None, tmp_path)
    assert scales.k == [1.0, 1.0] and scales.v == [1.0, 1.0]
    assert "without scaling factors" in caplog.text


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_engine_serves_an_fp8_cache_with_json_scales(tmp_path: Path, kv_dtype: str) -> None:
    """A tiny engine on an 8-bit cache: the pool's dtype and scales, greedy tokens out."""
    folder = write_tiny_llama(tmp_path / "tiny")
    dtype = "float8_e4m3fn" if kv_dtype == "fp8_e4m3" else "float8_e5m2"
    path = _json(tmp_path, {"0": {"0": 0.5, "1": 0.75}}, dtype)
    engine = make_tiny_engine(folder, kv_cache_dtype=kv_dtype, quantization_param_path=path)
    try:
        kv = engine.scheduler.runner.kv_cache
        assert kv.dtype == getattr(torch, dtype)
        assert kv.k_scales == [0.5, 0.75] and kv.v_scales == [0.5, 0.75]
        out = engine.generate(
            input_ids=[5, 6, 7, 8], sampling_params={"temperature": 0, "max_new_tokens": 4}
        )
        assert len(out["output_ids"]) == 4
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kv_cache_dtype": "fp8_e4m3", "enable_torch_compile": True}, "--enable-torch-compile"),
        ({"quantization_param_path": "scales.json"}, "needs --kv-cache-dtype fp8_e4m3"),
    ],
)
def test_refused_where_fp8_cannot_run(tmp_path: Path, options: dict, message: str) -> None:
    folder = write_tiny_llama(tmp_path / "tiny")
    with pytest.raises(ValueError, match=message) as err:
        make_tiny_engine(folder, **options).shutdown()
    assert "--kv-cache-dtype" in str(err.value) or "--quantization-param-path" in str(err.value)


def test_refused_with_multi_head_latent_attention(tmp_path: Path) -> None:
    """DeepSeek-V2's latent cache (V is K's buffer) takes no 8-bit codes: refused by name."""
    from tests.helpers.tiny_models import make_tiny_checkpoint

    make_tiny_checkpoint(tmp_path, "deepseek_v2", num_hidden_layers=2)
    with pytest.raises(ValueError, match="--kv-cache-dtype fp8_e4m3: multi-head latent"):
        make_tiny_engine(tmp_path, kv_cache_dtype="fp8_e4m3", load_format="auto").shutdown()
