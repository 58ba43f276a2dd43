"""What EAGLE draft heads share: parts taken from the target model, and checkpoint names.

An EAGLE head checkpoint (SGLang's layout, as the EAGLE authors publish them) names its tensors
without the `model.` prefix (`fc.weight`, `layers.0.self_attn.q_proj.weight`, `midlayer.*`,
`norm.weight`) and usually leaves out the embedding, and an EAGLE-1 head the LM head too: those
are the target model's, shared after loading (`share_target_parts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.layers.logits_processor import LogitsProcessor
from radixserve.layers.quantization import (
    GGUFLinearMethod,
    GGUFWeight,
    LinearMethod,
    MethodLayer,
    UnquantizedLinearMethod,
)
from radixserve.models.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig


class EagleHead(nn.Module):
    """What both head kinds share: `model` (set by the subclass) computes the head's hidden
    states from the batch's features (ForwardBatch.spec_hidden) and leaves the next step's
    features in ForwardBatch.captured; logits over the target's vocabulary, scattered from a
    reduced draft vocabulary when the head has one (`hot_token_ids`)."""

    stacked_params = LlamaForCausalLM.stacked_params
    is_eagle_head = True
    model: nn.Module
    lm_head: nn.Module
    hot_token_ids: torch.Tensor | None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        return self.model(input_ids, positions, forward_batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.logits_processor(hidden, self.lm_head)
        if self.hot_token_ids is None:
            return logits
        return scatter_hot_logits(logits, self.hot_token_ids, self.config.vocab_size)


class FromTarget(nn.Module):
    """Stands for a module the head takes from the target model once both are loaded."""

    def forward(self, *args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("an EAGLE head part was not taken from the target model")


def head_weight_names(
    weights: Iterable[tuple[str, torch.Tensor]], keep_top_level: tuple[str, ...]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint names mapped onto the head module: `model.` prefixed, except the names in
    `keep_top_level` (and names that already carry the prefix)."""
    for name, tensor in weights:
        if name.startswith("model.") or name.split(".")[0] in keep_top_level:
            yield name, tensor
        else:
            yield f"model.{name}", tensor


def has_tensor(weights: list[tuple[str, torch.Tensor]], fragment: str) -> bool:
    return any(fragment in name for name, _ in weights)


class HotLMHead(MethodLayer):
    """The rows of an LM head (float or GGUF blocks) for a subset of the vocabulary: a draft
    head that may only draft those tokens pays for a fraction of the full projection."""

    def __init__(self, lm_head: MethodLayer, token_ids: torch.Tensor) -> None:
        super().__init__()
        self.bias = None if getattr(lm_head, "bias", None) is None else lm_head.bias[token_ids]
        gguf = lm_head.quant_method.gguf_weight()
        self.quant_method: LinearMethod
        if gguf is not None:
            rows = GGUFWeight(
                gguf.blocks[token_ids].contiguous(), gguf.qtype, int(token_ids.numel())
            )
            self.quant_method = GGUFLinearMethod(rows)
        else:
            self.weight = nn.Parameter(lm_head.weight[token_ids].clone(), requires_grad=False)
            self.quant_method = UnquantizedLinearMethod()


def scatter_hot_logits(logits: torch.Tensor, token_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits over a draft vocabulary placed at their target ids; every other token gets -inf
    (never drafted)."""
    full = logits.new_full((logits.shape[0], vocab), float("-inf"))
    full[:, token_ids] = logits
    return full


def load_token_map(path: str, vocab_size: int) -> torch.Tensor:
    """--speculative-token-map (SGLang's format): a .pt file holding a list or tensor of token
    ids. Returns them sorted and unique."""
    if not Path(path).is_file():
        raise ValueError(f"--speculative-token-map {path}: no such file")
    try:
        raw = torch.load(path, weights_only=True)
        ids = torch.as_tensor(raw, dtype=torch.int64).flatten().unique()
    except Exception as exc:
        raise ValueError(
            f"--speculative-token-map {path}: not a .pt list of token ids ({exc})"
        ) from exc
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(
            f"--speculative-token-map {path}: token ids must lie in [0, {vocab_size}) and "
            "there must be at least one"
        )
    return ids
