"""Loading HF folders into our models, checked against transformers on tiny random models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

# tests.helpers lives beside the test folders; pytest's rootless layout does not put the repo
# root on sys.path (a `pythonpath = ["."]` pytest option would make this line unnecessary).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixserve.models.config import ALLOW_LONGER_CONTEXT_ENV, ModelConfig, resolve_dtype
from radixserve.models.loader import load_model
from radixserve.models.registry import supported_architectures
from radixserve.utils.auto_dtype import DtypeChoice
from tests.helpers.hf_reference import hf_logits
from tests.helpers.model_driver import ManualDriver
from tests.helpers.tiny_models import make_tiny_checkpoint, tiny_hf_config

TOL = 1e-4
PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 128, 11, 200, 31]


def _load(path: Path, **kwargs: object) -> ManualDriver:
    loaded = load_model(str(path), dtype="float32", **kwargs)
    return ManualDriver(loaded.model, loaded.config, max_tokens=512)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": True}),
        ("llama", {"attention_bias": True, "mlp_bias": True}),
        ("qwen2", {}),
        ("qwen3", {}),
        ("mistral", {}),
        (
            "llama",
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                "rope_theta": 500000.0,
            },
        ),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ],
    ids=["llama", "llama-tied", "llama-bias", "qwen2", "qwen3", "mistral", "llama3-rope", "linear"],
)
def test_prefill_logits_match_hf(tmp_path: Path, arch: str, overrides: dict) -> None:
    hf = make_tiny_checkpoint(tmp_path, arch, **overrides)
    driver = _load(tmp_path)
    ours = driver.forward([(0, PROMPT)], all_logits=True)
    assert ours.dtype == torch.float32
    assert _max_diff(ours, hf_logits(hf, PROMPT)) < TOL


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_extend_over_prefix_then_decode_matches_hf(tmp_path: Path, arch: str) -> None:
    hf = make_tiny_checkpoint(tmp_path, arch)
    driver = _load(tmp_path)
    full = [*PROMPT, 77, 78]
    ref = hf_logits(hf, full)
    driver.forward([(0, PROMPT[:5])])
    extended = driver.forward([(0, PROMPT[5:])], all_logits=True)  # prefix of 5 in the cache
    assert _max_diff(extended, ref[5 : len(PROMPT)]) < TOL
    for pos in (len(PROMPT), len(PROMPT) + 1):
        step = driver.forward([(0, [full[pos]])], decode=True)
        assert _max_diff(step[0], ref[pos]) < TOL


def test_batch_of_two_sequences_of_different_lengths(tmp_path: Path) -> None:
    hf = make_tiny_checkpoint(tmp_path, "qwen2")
    driver = _load(tmp_path)
    a, b = PROMPT[:9], [200, 3, 18, 90]
    both = driver.forward([(0, a), (1, b)], all_logits=True)
    assert _max_diff(both[:9], hf_logits(hf, a)) < TOL
    assert _max_diff(both[9:], hf_logits(hf, b)) < TOL
    decoded = driver.forward([(0, [7]), (1, [8])], decode=True)
    assert _max_diff(decoded[0], hf_logits(hf, [*a, 7])[-1]) < TOL
    assert _max_diff(decoded[1], hf_logits(hf, [*b, 8])[-1]) < TOL


def test_sharded_safetensors_with_index(tmp_path: Path) -> None:
    hf = make_tiny_checkpoint(tmp_path / "one", "llama")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="60KB")
    index = tmp_path / "sharded" / "model.safetensors.index.json"
    shards = set(json.loads(index.read_text())["weight_map"].values())
    assert len(shards) > 1
    driver = _load(tmp_path / "sharded")
    assert _max_diff(driver.forward([(0, PROMPT)]), hf_logits(hf, PROMPT)[-1:]) < TOL


def test_bin_weights_when_no_safetensors(tmp_path: Path) -> None:
    hf = make_tiny_checkpoint(tmp_path, "llama")
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    driver = _load(tmp_path)
    assert _max_diff(driver.forward([(0, PROMPT)]), hf_logits(hf, PROMPT)[-1:]) < TOL


def test_bfloat16_load_keeps_float32_logits(tmp_path: Path) -> None:
    make_tiny_checkpoint(tmp_path, "llama")
    loaded = load_model(str(tmp_path), dtype="bfloat16")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert loaded.config.dtype == torch.bfloat16
    assert loaded.model.compute_logits(torch.zeros(1, 64, dtype=torch.bfloat16)).dtype == (
        torch.float32
    )


def test_unknown_architecture_lists_supported(tmp_path: Path) -> None:
    make_tiny_checkpoint(tmp_path, "llama")
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["FooForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="FooForCausalLM") as info:
        load_model(str(tmp_path), dtype="float32")
    assert all(name in str(info.value) for name in supported_architectures())


def test_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_model(str(missing))


def test_missing_config_json(tmp_path: Path) -> None:
    make_tiny_checkpoint(tmp_path, "llama")
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model(str(tmp_path))


def test_no_weight_files(tmp_path: Path) -> None:
    make_tiny_checkpoint(tmp_path, "llama")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no weight files"):
        load_model(str(tmp_path), dtype="float32")


def test_corrupt_safetensors_names_file(tmp_path: Path) -> None:
    make_tiny_checkpoint(tmp_path, "llama")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(ValueError, match=r"corrupt safetensors file .*model\.safetensors"):
        load_model(str(tmp_path), dtype="float32")


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    make_tiny_checkpoint(tmp_path, "llama")
    weights = tmp_path / "model.safetensors"
    state = load_file(weights)
    del state["model.layers.1.self_attn.k_proj.weight"]
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_model(str(tmp_path), dtype="float32")


def test_index_pointing_at_missing_shard(tmp_path: Path) -> None:
    hf = make_tiny_checkpoint(tmp_path / "src", "llama")
    hf.save_pretrained(tmp_path / "m", max_shard_size="60KB")
    shard = sorted((tmp_path / "m").glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        load_model(str(tmp_path / "m"), dtype="float32")


def test_dummy_format_needs_only_config_and_is_seeded(tmp_path: Path) -> None:
    tiny_hf_config("qwen3", architectures=["Qwen3ForCausalLM"]).save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    first = _load(tmp_path, load_format="dummy").forward([(0, PROMPT)])
    again = _load(tmp_path, load_format="dummy").forward([(0, PROMPT)])
    other = load_model(str(tmp_path), load_format="dummy", dtype="float32", seed=1)
    other_logits = ManualDriver(other.model, other.config).forward([(0, PROMPT)])
    assert torch.isfinite(first).all()
    assert torch.equal(first, again)
    assert not torch.equal(first, other_logits)


def test_unsupported_load_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--load-format 'bitsandbytes'"):
        load_model(str(tmp_path), load_format="bitsandbytes")


def test_context_length_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_tiny_checkpoint(tmp_path, "llama")
    assert ModelConfig.from_pretrained(tmp_path).context_len == 512
    assert ModelConfig.from_pretrained(tmp_path, context_length=100).context_len == 100
    monkeypatch.delenv(ALLOW_LONGER_CONTEXT_ENV, raising=False)
    with pytest.raises(ValueError, match=ALLOW_LONGER_CONTEXT_ENV):
        ModelConfig.from_pretrained(tmp_path, context_length=1024)
    monkeypatch.setenv(ALLOW_LONGER_CONTEXT_ENV, "1")
    assert ModelConfig.from_pretrained(tmp_path, context_length=1024).context_len == 1024


def test_longer_context_loads_rotary_table_to_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tiny_checkpoint(tmp_path, "llama")
    monkeypatch.setenv(ALLOW_LONGER_CONTEXT_ENV, "1")
    loaded = load_model(str(tmp_path), dtype="float32", context_length=1024)
    assert loaded.model.model.rotary_emb.cos_sin_cache.shape[0] == 1024


def test_json_model_override_args(tmp_path: Path) -> None:
    make_tiny_checkpoint(tmp_path, "llama")
    config = ModelConfig.from_pretrained(
        tmp_path, json_model_override_args='{"max_position_embeddings": 2048}'
    )
    assert config.context_len == 2048
    with pytest.raises(ValueError, match="--json-model-override-args"):
        ModelConfig.from_pretrained(tmp_path, json_model_override_args="[1, 2]")


def test_rope_override_keeps_the_checkpoint_theta(tmp_path: Path) -> None:
    make_tiny_checkpoint(tmp_path, "llama", rope_theta=123456.0)
    config = ModelConfig.from_pretrained(
        tmp_path, json_model_override_args='{"rope_scaling": {"rope_type": "linear", "factor": 4}}'
    )
    assert config.rope_theta == 123456.0
    assert config.rope_scaling == {"rope_type": "linear", "factor": 4}
    assert config.context_len == 4 * 512


def test_eos_ids_merge_generation_config(tmp_path: Path) -> None:
    make_tiny_checkpoint(tmp_path, "llama")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 9]}))
    assert ModelConfig.from_pretrained(tmp_path).eos_token_ids == (2, 9)


def test_dtype_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    import radixserve.models.config as config_module

    assert resolve_dtype("half") == torch.float16
    assert resolve_dtype("float") == torch.float32
    assert resolve_dtype("bfloat16", "cuda") == torch.bfloat16
    bf16, fp32 = DtypeChoice("bfloat16", "probed"), DtypeChoice("float32", "no BF16 units")
    monkeypatch.setattr(config_module, "cpu_auto_dtype", lambda: bf16)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16
    monkeypatch.setattr(config_module, "cpu_auto_dtype", lambda: fp32)
    assert resolve_dtype("auto", "cpu") == torch.float32
    with pytest.raises(ValueError, match="--dtype 'int8'"):
        resolve_dtype("int8")
