"""EAGLE-3 draft head for Llama-family targets (SGLang's `LlamaForCausalLMEagle3`).

The target hands the head, per position p, its hidden states at three depths (the inputs of
three decoder layers, concatenated: `target_feature_layers`); `fc` folds them to one hidden
vector. The head's one decoder layer attends over [norm(embedding of token p+1), norm(feature)]
(so its q/k/v projections take twice the hidden size) with the feature as the residual stream;
the final norm feeds its own LM head, over a reduced draft vocabulary when the checkpoint has
one (`d2t` maps draft ids to target ids), and the un-normed sum is the next draft step's feature
(already hidden-sized, so fc is skipped there).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from radixserve.layers.layernorm import RMSNorm
from radixserve.layers.linear import QKVParallelLinear, ReplicatedLinear
from radixserve.layers.logits_processor import LogitsProcessor
from radixserve.layers.rotary_embedding import RotaryEmbedding
from radixserve.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from radixserve.models.eagle_common import EagleHead, FromTarget, has_tensor, head_weight_names
from radixserve.models.llama import (
    AttentionOptions,
    LlamaAttention,
    LlamaForCausalLM,
    LlamaMLP,
    model_rope,
)
from radixserve.models.pipeline_stage import stage_plan
from radixserve.models.weight_utils import load_weights_into

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig


class Eagle3MidLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, rotary_emb: RotaryEmbedding, options: AttentionOptions
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, 0, rotary_emb, options)
        self.self_attn.qkv_proj = QKVParallelLinear(
            2 * config.hidden_size,
            config.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=False,
        )
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        x = self.self_attn(positions, x, forward_batch)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaEagle3Model(nn.Module):
    def __init__(self, config: ModelConfig, target_hidden_size: int, fc_bias: bool) -> None:
        super().__init__()
        self.hidden_size = config.hidden_size
        self.stage = stage_plan(config.num_hidden_layers)
        self.embed_tokens: nn.Module = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = model_rope(config)
        self.fc = ReplicatedLinear(3 * target_hidden_size, config.hidden_size, bias=fc_bias)
        options = LlamaForCausalLM.attention_options(config)
        self.midlayer = Eagle3MidLayer(config, self.rotary_emb, options)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        assert forward_batch.spec_hidden is not None, "an EAGLE head needs the target's features"
        embeds = self.embed_tokens(input_ids)
        features = forward_batch.spec_hidden.to(embeds.dtype)
        # Hidden-sized features are the head's own output from its previous step; copied
        # because the fused norms may write their results into their inputs' memory.
        target_features = features.shape[-1] != self.hidden_size
        hidden = self.fc(features) if target_features else features.clone()
        x, residual = self.midlayer(positions, embeds, hidden, forward_batch)
        normed, out = self.norm(x, residual)
        forward_batch.captured = out  # the next draft step's feature
        return normed


class LlamaForCausalLMEagle3(EagleHead):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.num_hidden_layers != 1:
            raise ValueError(
                f"--speculative-draft-model-path: EAGLE3 heads with one decoder layer are "
                f"supported; this one has {config.num_hidden_layers}"
            )
        hf = config.hf_config
        target_hidden = int(_hf_get(hf, "target_hidden_size") or config.hidden_size)
        self.model = LlamaEagle3Model(config, target_hidden, bool(_hf_get(hf, "bias")))
        draft_vocab = _hf_get(hf, "draft_vocab_size")
        self.lm_head: nn.Module
        hot_token_ids: torch.Tensor | None = None
        if config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
            draft_vocab = config.vocab_size
        elif draft_vocab is None:
            self.lm_head = FromTarget()
            draft_vocab = config.vocab_size
        else:
            self.lm_head = ParallelLMHead(int(draft_vocab), config.hidden_size)
            if int(draft_vocab) != config.vocab_size:
                # Draft id -> target id, from the checkpoint's d2t.
                hot_token_ids = torch.zeros(int(draft_vocab), dtype=torch.int64)
        self.register_buffer("hot_token_ids", hot_token_ids)
        self.logits_processor = LogitsProcessor(int(draft_vocab))
        self._aux_layer_ids = _aux_layer_ids(hf)

    def target_feature_layers(self, target_num_layers: int) -> tuple[int, ...]:
        """The target decoder layers whose inputs (hidden + residual) the head reads, in order;
        `target_num_layers` stands for the last layer's output. As SGLang: the checkpoint's
        `eagle_aux_hidden_state_layer_ids` (layer outputs, so +1), else layers 2, L/2, L-3."""
        n = target_num_layers
        if self._aux_layer_ids is not None:
            layers = tuple(i + 1 for i in self._aux_layer_ids)
        else:
            layers = (2, n // 2, n - 3)
        if len(layers) != 3 or any(not 0 <= i <= n for i in layers):
            raise ValueError(
                f"--speculative-draft-model-path: EAGLE3 reads three target layers; "
                f"{list(layers)} is not possible for a target with {n} layers (set "
                "eagle_config.eagle_aux_hidden_state_layer_ids in the head's config.json)"
            )
        return layers

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        named: list[tuple[str, torch.Tensor]] = []
        d2t: torch.Tensor | None = None
        for name, tensor in head_weight_names(weights, ("lm_head", "d2t", "t2d")):
            if name == "d2t":
                d2t = tensor
            elif name != "t2d" and "rotary_emb" not in name:
                named.append((name, tensor))
        if not has_tensor(named, "embed_tokens"):
            self.model.embed_tokens = FromTarget()
            if self.config.tie_word_embeddings:
                self.lm_head = self.model.embed_tokens
        if self.hot_token_ids is not None:
            if d2t is None or d2t.numel() != self.hot_token_ids.numel():
                raise ValueError(
                    "--speculative-draft-model-path: an EAGLE3 head with a draft vocabulary "
                    f"of {self.hot_token_ids.numel()} needs its d2t map of as many entries"
                )
            # d2t holds target id - draft id.
            hot = d2t.to(torch.int64) + torch.arange(d2t.numel())
            if int(hot.min()) < 0 or int(hot.max()) >= self.config.vocab_size:
                raise ValueError("--speculative-draft-model-path: d2t maps outside the vocabulary")
            self.hot_token_ids.copy_(hot)
        load_weights_into(self, named, self.stacked_params)

    def share_target_parts(self, target: nn.Module) -> None:
        if isinstance(self.model.embed_tokens, FromTarget):
            self.model.embed_tokens = target.model.embed_tokens
        if isinstance(self.lm_head, FromTarget):
            self.lm_head = (
                self.model.embed_tokens if self.config.tie_word_embeddings else target.lm_head
            )


def _hf_get(hf: Any, key: str) -> Any:
    if isinstance(hf, dict):
        return hf.get(key)
    return getattr(hf, key, None)


def _aux_layer_ids(hf: Any) -> list[int] | None:
    eagle = _hf_get(hf, "eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    return [int(i) for i in ids] if ids is not None else None
