"""PEFT LoRA adapters with random non-zero weights, saved as PEFT folders, and the HF + PEFT
greedy reference of each."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from tests.helpers.hf_reference import hf_greedy

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class AdapterRef(NamedTuple):
    path: Path
    greedy: list[list[int]]  # HF + PEFT greedy continuation of each prompt


def make_peft_adapter(
    hf_model: torch.nn.Module,
    folder: Path,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    targets: Sequence[str] = ALL_TARGETS,
    seed: int = 0,
    scale: float = 0.05,
    stop_ids: Sequence[int] = (),
    **extra: Any,
) -> AdapterRef:
    """Wrap `hf_model` in a PEFT LoRA with random A and B (B is zero by default in PEFT, which
    would test nothing), save it to `folder`, record its greedy outputs, and unwrap the model
    again (hf_model is left as it was)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets),
        lora_dropout=0.0,
        init_lora_weights=False,
        **extra,
    )
    torch.manual_seed(seed)
    peft_model = get_peft_model(hf_model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, scale)
    peft_model.eval()
    peft_model.save_pretrained(folder)
    greedy = [hf_greedy(peft_model, p, max_new_tokens, stop_ids=stop_ids) for p in prompts]
    peft_model.unload()  # removes the LoRA layers: hf_model is the base model again
    return AdapterRef(folder, greedy)
