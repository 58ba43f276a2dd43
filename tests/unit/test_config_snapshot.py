"""A model config remembered from an earlier start (models/config_snapshot.py) must read as
the config AutoConfig builds: the same ModelConfig and the same attribute for every name
radixserve reads from a config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from radixserve.models.config import ModelConfig
from radixserve.models.config_snapshot import ConfigSnapshot, load_snapshot, snapshot_attributes
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from tests.helpers.tiny_models import hf_config_class, tiny_hf_config

ARCHS = (
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "phi3",
    "smollm3",
    "olmo2",
    "granite",
    "gemma2",
    "gemma3",
)
# Every name radixserve's model code reads from a config (grep getattr(hf...)), and the
# context-length keys of models/config.py.
READ_NAMES = (
    "architectures",
    "attention_bias",
    "attn_logit_softcapping",
    "eos_token_id",
    "final_logit_softcapping",
    "head_dim",
    "hidden_act",
    "hidden_activation",
    "hidden_size",
    "intermediate_size",
    "layer_types",
    "max_position_embeddings",
    "max_seq_len",
    "max_sequence_length",
    "mlp_bias",
    "model_max_length",
    "model_type",
    "no_rope_layer_interval",
    "no_rope_layers",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "original_max_position_embeddings",
    "partial_rotary_factor",
    "query_pre_attn_scalar",
    "rms_norm_eps",
    "rope_local_base_freq",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "seq_length",
    "sliding_window",
    "sliding_window_pattern",
    "tie_word_embeddings",
    "use_bidirectional_attention",
    "use_sliding_window",
    "vocab_size",
    "embedding_multiplier",
    "residual_multiplier",
    "attention_multiplier",
    "logits_scaling",
)
_MISSING = object()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def _lists(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


def _saved(tmp_path: Path, arch: str, **overrides: Any) -> Path:
    if hf_config_class(arch) is None:
        pytest.skip(f"this transformers has no config class for {arch}")
    folder = tmp_path / arch
    tiny_hf_config(arch, **overrides).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("arch", ARCHS)
def test_a_remembered_config_reads_as_autoconfigs(tmp_path: Path, arch: str) -> None:
    folder = _saved(tmp_path, arch)
    first = ModelConfig.from_pretrained(folder, dtype="float32")
    second = ModelConfig.from_pretrained(folder, dtype="float32")
    assert not isinstance(first.hf_config, ConfigSnapshot)
    assert isinstance(second.hf_config, ConfigSnapshot)
    assert second == first
    for name in READ_NAMES:
        real = getattr(first.hf_config, name, _MISSING)
        remembered = getattr(second.hf_config, name, _MISSING)
        assert _lists(remembered) == _lists(real), name


def test_rope_scaling_and_overrides(tmp_path: Path) -> None:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    }
    folder = _saved(tmp_path, "llama", rope_scaling=scaling, rope_theta=500000.0)
    first = ModelConfig.from_pretrained(folder, dtype="float32")
    assert first.rope_scaling is not None
    assert ModelConfig.from_pretrained(folder, dtype="float32") == first
    overrides = json.dumps({"max_position_embeddings": 256})
    again = ModelConfig.from_pretrained(folder, dtype="float32", json_model_override_args=overrides)
    assert again.max_position_embeddings == 256
    # The override changed that start's config only, not the record.
    assert ModelConfig.from_pretrained(folder, dtype="float32") == first


def test_an_edited_config_is_read_again(tmp_path: Path) -> None:
    folder = _saved(tmp_path, "llama")
    ModelConfig.from_pretrained(folder, dtype="float32")
    config_file = folder / "config.json"
    data = json.loads(config_file.read_text())
    data["num_hidden_layers"] = 3
    config_file.write_text(json.dumps(data))
    assert load_snapshot(str(folder)) is None
    assert ModelConfig.from_pretrained(folder, dtype="float32").num_hidden_layers == 3


def test_configs_with_sub_configs_or_odd_values_are_not_remembered() -> None:
    class Nested:
        __module__ = "transformers.models.x.configuration_x"
        sub_configs: ClassVar[dict[str, type]] = {"text_config": object}

        def to_dict(self) -> dict[str, Any]:
            return {}

    class Remote:
        __module__ = "transformers_modules.org.model.configuration"

        def to_dict(self) -> dict[str, Any]:
            return {}

    class Odd:
        __module__ = "transformers.models.x.configuration_x"
        value: ClassVar[set[int]] = {1, 2}

        def to_dict(self) -> dict[str, Any]:
            return {"value": self.value}

    assert snapshot_attributes(Nested()) is None
    assert snapshot_attributes(Remote()) is None
    assert snapshot_attributes(Odd()) is None
