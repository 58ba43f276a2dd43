"""LoRA adapters on a mixture-of-experts model (Qwen3-MoE, float32): an adapter on the attention
projections of every layer gives HF + PEFT's greedy tokens; the sparse layers offer no dense MLP
to adapt, and an adapter on the expert stacks (PEFT's target_parameters) is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve import Engine
from radixserve.layers.lora import decoder_sub_projections
from radixserve.lora.config import LoRAError
from radixserve.models.loader import load_model
from tests.helpers.family_check import require_hf_arch
from tests.helpers.lora_adapters import make_peft_adapter
from tests.helpers.tiny_models import make_tiny_checkpoint

require_hf_arch("qwen3_moe")
pytest.importorskip("peft")

PROMPTS = [[3, 5, 9, 30, 12], [4, *range(40, 52)]]
NEW_TOKENS = 10
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def test_attention_adapter_equals_hf_peft_expert_adapter_refused(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    # Layer 0 dense (mlp_only_layers), layer 1 sparse.
    hf = make_tiny_checkpoint(folder, "qwen3_moe", mlp_only_layers=[0], norm_topk_prob=True)
    layers = load_model(str(folder), dtype="float32").model.model.layers
    assert "gate_proj" in decoder_sub_projections(layers[0])
    assert sorted(decoder_sub_projections(layers[1])) == sorted(ATTENTION)
    attn = make_peft_adapter(hf, tmp_path / "attn", PROMPTS, NEW_TOKENS, targets=ATTENTION)
    # PEFT (with transformers 5) turns gate/up/down targets of a MoE model into LoRA on the
    # expert stacks (target_parameters), which radixserve does not run.
    experts = make_peft_adapter(
        hf, tmp_path / "experts", PROMPTS, NEW_TOKENS, targets=("gate_proj", "up_proj", "down_proj")
    )
    with Engine(
        model_path=str(folder),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=2048,
        enable_lora=True,
        max_lora_rank=16,
        lora_paths=[f"attn={attn.path}"],
    ) as engine:
        outs = engine.generate(
            input_ids=PROMPTS,
            sampling_params={"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
            lora_path=["attn"] * len(PROMPTS),
        )
        assert [o["output_ids"] for o in outs] == attn.greedy
        engine.lora.allowed_dirs = (tmp_path.resolve(),)
        with pytest.raises(LoRAError, match="target_parameters"):
            engine.load_lora_adapter("experts", str(experts.path))
