"""EAGLE-1 draft head for Llama-family targets (SGLang's `LlamaForCausalLMEagle`).

The head sees, per position p, the embedding of token p+1 and the target's final (normed) hidden
state at p, merges them with `fc` ([embedding, feature] -> hidden), runs its decoder layers (the
first without an input norm) and returns hidden + residual, un-normed. Its logits come from the
target's LM head, and its output is also the feature of its next draft step. The embedding is
the checkpoint's when it has one, else the target's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixserve.layers.linear import ReplicatedLinear
from radixserve.layers.logits_processor import LogitsProcessor
from radixserve.layers.vocab_embedding import VocabParallelEmbedding
from radixserve.models.eagle_common import (
    EagleHead,
    FromTarget,
    HotLMHead,
    has_tensor,
    head_weight_names,
)
from radixserve.models.llama import LlamaDecoderLayer, LlamaForCausalLM, model_rope
from radixserve.models.pipeline_stage import stage_plan
from radixserve.models.weight_utils import load_weights_into

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig


class LlamaEagleModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        options = LlamaForCausalLM.attention_options(config)
        self.stage = stage_plan(config.num_hidden_layers)
        self.embed_tokens: nn.Module = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = model_rope(config)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, self.rotary_emb, options)
            for i in range(config.num_hidden_layers)
        )
        # The first layer takes fc's output as it is (EAGLE's design).
        self.layers[0].input_layernorm = nn.Identity()
        self.fc = ReplicatedLinear(2 * config.hidden_size, config.hidden_size, bias=True)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        assert forward_batch.spec_hidden is not None, "an EAGLE head needs the target's features"
        embeds = self.embed_tokens(input_ids)
        features = forward_batch.spec_hidden.to(embeds.dtype)
        hidden = self.fc(torch.cat([embeds, features], dim=-1))
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, forward_batch)
        assert residual is not None
        out = hidden + residual
        forward_batch.captured = out  # the next draft step's feature
        return out


class LlamaForCausalLMEagle(EagleHead):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.model = LlamaEagleModel(config)
        self.lm_head = FromTarget()  # always the target's
        self.hot_token_ids = None  # --speculative-token-map

    def use_hot_tokens(self, token_ids: torch.Tensor) -> None:
        """Draft only these tokens (--speculative-token-map): the LM head keeps their rows."""
        self.lm_head = HotLMHead(self.lm_head, token_ids)
        self.logits_processor = LogitsProcessor(int(token_ids.numel()))
        self.hot_token_ids = token_ids

    def target_feature_layers(self, target_num_layers: int) -> tuple[int, ...]:
        """EAGLE-1 reads the target's final normed hidden state, not intermediate layers."""
        return ()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        named = [
            (name, tensor)
            for name, tensor in head_weight_names(weights, ("lm_head",))
            if not name.startswith("lm_head")
            and "rotary_emb" not in name
            and "layers.0.input_layernorm" not in name
        ]
        if not has_tensor(named, "embed_tokens"):
            self.model.embed_tokens = FromTarget()
        if not has_tensor(named, "model.fc.bias"):
            self.model.fc.bias = None
        load_weights_into(self, named, self.stacked_params)

    def share_target_parts(self, target: nn.Module) -> None:
        if isinstance(self.model.embed_tokens, FromTarget):
            self.model.embed_tokens = target.model.embed_tokens
        self.lm_head = target.lm_head
