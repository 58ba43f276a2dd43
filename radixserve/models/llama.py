"""The Llama family (Llama 2/3.x, SmolLM, Mistral), also the base of the Llama-shaped families
(Qwen2, Qwen3, Phi-3, SmolLM3, OLMo 2, Granite, Gemma 2/3), which vary it through the hooks of
LlamaForCausalLM: attention_options, make_layer, embedding_multiplier, model_class.

Model code only: it sees token ids, positions and the ForwardBatch its attention layers pass on,
and returns hidden states or logits.

Longer than the project's ~450-line norm: the base classes and every hook the derived families
override are read together (a family's file is its overrides only).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from radixserve.layers.activation import get_act_and_mul
from radixserve.layers.fused_decoder import (
    FusedLayerArgs,
    LayerChainCache,
    run_fused_layer,
    run_fused_layers,
)
from radixserve.layers.layernorm import GemmaRMSNorm, RMSNorm, ShardedRMSNorm
from radixserve.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from radixserve.layers.logits_processor import LogitsProcessor
from radixserve.layers.radix_attention import RadixAttention
from radixserve.layers.rotary_embedding import RotaryEmbedding, get_rope
from radixserve.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from radixserve.models.pipeline_stage import PPMissingLayer, stage_plan, stage_weights
from radixserve.models.weight_utils import StackedParam, load_weights_into

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig

logger = logging.getLogger(__name__)


class QKNorm(enum.Enum):
    """An RMSNorm of q and of k before RoPE."""

    NONE = "none"
    PER_HEAD = "per_head"  # over each head (Qwen3)
    FULL_WIDTH = "full_width"  # over all heads of the projection at once (OLMo 2)
    GEMMA_PER_HEAD = "gemma_per_head"  # over each head, Gemma's (1 + weight) norm (Gemma 3)


class AttentionOptions(NamedTuple):
    qkv_bias: bool
    o_bias: bool
    qk_norm: QKNorm = QKNorm.NONE
    rope: bool = True  # False: a NoPE layer, whose q and k carry no position (SmolLM3)
    scaling: float | None = None  # softmax scale; None: head_dim ** -0.5 (Granite sets its own)
    sliding_window: int | None = None  # keys a token sees, its own included; None: all (Gemma)
    logit_cap: float | None = None  # scores soft-capped to cap * tanh(score / cap) (Gemma 2)
    sinks: bool = False  # a learned per-head logit in the softmax denominator (gpt-oss)


# (config, layer index, the model's shared RoPE) -> a decoder layer
LayerFactory = Callable[["ModelConfig", int, RotaryEmbedding], nn.Module]


class LlamaMLP(nn.Module):
    """gate|up, activation, down. `intermediate_size` overrides the config's (a MoE model's
    shared expert, or its dense layers when the config's size is the experts')."""

    def __init__(self, config: ModelConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        inter = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [inter, inter], bias=config.mlp_bias
        )
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = get_act_and_mul(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        rotary_emb: RotaryEmbedding,
        options: AttentionOptions,
    ) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            config.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=options.qkv_bias,
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * config.head_dim, config.hidden_size, bias=options.o_bias
        )
        self.qk_norm = options.qk_norm
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        eps = config.rms_norm_eps
        if options.qk_norm in (QKNorm.PER_HEAD, QKNorm.GEMMA_PER_HEAD):
            norm = GemmaRMSNorm if options.qk_norm is QKNorm.GEMMA_PER_HEAD else RMSNorm
            self.q_norm, self.k_norm = norm(self.head_dim, eps), norm(self.head_dim, eps)
        elif options.qk_norm is QKNorm.FULL_WIDTH:
            # This rank's heads of a norm over all of them: the weights are sliced the way
            # qkv_proj slices its rows (kv heads replicated when there are fewer than ranks).
            qkv = self.qkv_proj
            self.q_norm = ShardedRMSNorm(self.q_size, eps, qkv.tp_rank * self.q_size)
            kv_start = (qkv.tp_rank // qkv.kv_replicas) * self.kv_size
            self.k_norm = ShardedRMSNorm(self.kv_size, eps, kv_start)
        # None on a NoPE layer.
        self.rotary_emb = rotary_emb if options.rope else None
        scaling = self.head_dim**-0.5 if options.scaling is None else options.scaling
        self.attn = RadixAttention(
            layer_id,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            scaling,
            sliding_window=options.sliding_window,
            logit_cap=options.logit_cap,
            sinks=options.sinks,
        )

    def _norm_heads(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        num_tokens = x.shape[0]
        if getattr(norm, "use_fast_kernels", False):
            # Rows of head_dim: the fused kernel takes 2-D input (and the one-call C++ layer
            # normalizes heads the same way, layers/fused_decoder.py).
            return norm(x.reshape(-1, self.head_dim)).reshape(num_tokens, -1)
        return norm(x.reshape(num_tokens, -1, self.head_dim)).reshape(num_tokens, -1)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and self.k_norm is not None:
            if self.qk_norm is not QKNorm.FULL_WIDTH:
                q, k = self._norm_heads(q, self.q_norm), self._norm_heads(k, self.k_norm)
            else:
                q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary_emb is None:
            out = self.attn(q, k, v, forward_batch)
        elif forward_batch.attn_backend.fuses_rope:
            out = self.attn.forward_with_rope(q, k, v, positions, self.rotary_emb, forward_batch)
        else:
            q, k = self.rotary_emb(positions, q, k)
            out = self.attn(q, k, v, forward_batch)
        return self.o_proj(out)


def input_norm(
    norm: nn.Module, hidden: torch.Tensor, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder layer's input norm: (normed hidden, residual). The first layer's residual is
    its input; later layers' norms add the previous layer's output to the residual first."""
    if residual is None:
        return norm(hidden), hidden
    return norm(hidden, residual)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP. `residual_multiplier` (Granite) scales each block's output
    before it joins the residual stream; `mlp` replaces the dense MLP (a MoE block)."""

    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        rotary_emb: RotaryEmbedding,
        options: AttentionOptions,
        residual_multiplier: float = 1.0,
        mlp: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, rotary_emb, options)
        self.mlp = LlamaMLP(config) if mlp is None else mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.residual_multiplier = residual_multiplier

    # Set by layers.fast_path where the whole layer can run as one C++ call: the kernel's
    # static arguments (weights, shapes), else None.
    fused_args: FusedLayerArgs | None = None

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused_args is not None:
            fused = run_fused_layer(self.fused_args, positions, hidden, residual, forward_batch)
            if fused is not None:
                return fused
        # The residual stream is carried separately so each norm can fuse the preceding add.
        hidden, residual = input_norm(self.input_layernorm, hidden, residual)
        hidden = self._scaled(self.self_attn(positions, hidden, forward_batch))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        # The next layer's input norm (or the final norm) adds this to the residual.
        return self._scaled(self.mlp(hidden)), residual

    def _scaled(self, block_out: torch.Tensor) -> torch.Tensor:
        if self.residual_multiplier == 1.0:
            return block_out
        return block_out * self.residual_multiplier


def model_rope(config: ModelConfig) -> RotaryEmbedding:
    """The model's RoPE table, shared by all its layers."""
    return get_rope(
        config.head_dim,
        config.rotary_dim,
        max_position=config.context_len,
        base=config.rope_theta,
        rope_scaling=config.rope_scaling,
        original_max_position=config.max_position_embeddings,
    )


class LlamaModel(nn.Module):
    """Embedding (times `embedding_multiplier`), the layers `make_layer` builds, final norm.

    Layers take and return (hidden, residual): the residual stream is carried separately and
    each layer's output is hidden + residual, so a norm can fuse the add."""

    def __init__(
        self, config: ModelConfig, make_layer: LayerFactory, embedding_multiplier: float = 1.0
    ) -> None:
        super().__init__()
        # Under --pp-size only this stage's parts are built (models/pipeline_stage.py).
        self.stage = stage_plan(config.num_hidden_layers)
        self.embed_tokens: nn.Module = (
            VocabParallelEmbedding(config.vocab_size, config.hidden_size)
            if self.stage.first
            else PPMissingLayer()
        )
        # One table for all layers: it can be large (context_len x head_dim floats).
        self.rotary_emb = model_rope(config)
        self.layers = nn.ModuleList(
            make_layer(config, i, self.layer_rope(config, i))
            if self.stage.owns(i)
            else PPMissingLayer()
            for i in range(config.num_hidden_layers)
        )
        self.norm: nn.Module = self.make_norm(config) if self.stage.last else PPMissingLayer()
        self.embedding_multiplier = embedding_multiplier
        self._layer_chains = LayerChainCache()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        hidden = self.embed(input_ids)
        if forward_batch.embedding_overrides is not None:
            # A vision model's image features in place of its placeholder tokens' embeddings.
            rows, values = forward_batch.embedding_overrides
            hidden = hidden.index_copy(0, rows, values.to(hidden.dtype))
        # From here on `positions` are the RoPE table rows the tokens read (the positions
        # themselves except under LongRoPE): positions serve nothing else in the layers.
        positions = self.rotary_emb.table_rows(positions, forward_batch)
        residual: torch.Tensor | None = None
        if forward_batch.capture_layers:
            hidden, residual = self._forward_capturing(positions, hidden, forward_batch)
        else:
            chain = self._fused_chain()
            fused = (
                run_fused_layers(chain, positions, hidden, forward_batch, self._layer_chains)
                if chain
                else None
            )
            if fused is not None:
                hidden, residual = fused
            else:
                for layer in self.layers:
                    hidden, residual = layer(positions, hidden, residual, forward_batch)
        if residual is None:  # a model with no layers
            return self.norm(hidden)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def layer_rope(self, config: ModelConfig, layer_id: int) -> RotaryEmbedding:
        """The table layer `layer_id` rotates with: the model's one table (Gemma 3 gives its
        sliding-window layers another; every table must read rows by position alike, since
        `rotary_emb.table_rows` picks them once for all layers)."""
        return self.rotary_emb

    def make_norm(self, config: ModelConfig) -> nn.Module:
        """The final norm."""
        return RMSNorm(config.hidden_size, config.rms_norm_eps)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The first layer's input (stage 0 of a pipeline)."""
        hidden = self.embed_tokens(input_ids)
        if self.embedding_multiplier != 1.0:
            hidden = hidden * self.embedding_multiplier
        return hidden

    def _forward_capturing(
        self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layers one by one (each still one fused call where it can be: the same kernels,
        so the same results as the chain), keeping the inputs of the layers listed in
        forward_batch.capture_layers (an EAGLE3 head's features) in forward_batch.captured."""
        wanted = forward_batch.capture_layers
        kept: dict[int, torch.Tensor] = {}
        residual: torch.Tensor | None = None
        for i, layer in enumerate([*self.layers, None]):
            if i in wanted:
                # Copied: the fused norms may reuse these tensors' memory in the next layer.
                kept[i] = hidden.clone() if residual is None else hidden + residual
            if layer is not None:
                hidden, residual = layer(positions, hidden, residual, forward_batch)
        forward_batch.captured = torch.cat([kept[i] for i in wanted], dim=-1)
        return hidden, residual

    def _fused_chain(self) -> list[FusedLayerArgs] | None:
        """Every layer's fused-call arguments when all layers have them (then the layers can run
        as a chain of kernel calls, layers/fused_decoder.py), else None."""
        chain = [getattr(layer, "fused_args", None) for layer in self.layers]
        if not chain or any(args is None for args in chain):
            return None
        return chain  # type: ignore[return-value]


class LlamaForCausalLM(nn.Module):
    """Decoder-only LM: forward -> final-normed hidden states; compute_logits -> float32."""

    # The body (embedding, layers, final norm); a family may vary its parts (Gemma).
    model_class: type[LlamaModel] = LlamaModel

    stacked_params = (
        StackedParam("qkv_proj", "q_proj", "q"),
        StackedParam("qkv_proj", "k_proj", "k"),
        StackedParam("qkv_proj", "v_proj", "v"),
        StackedParam("gate_up_proj", "gate_proj", 0),
        StackedParam("gate_up_proj", "up_proj", 1),
    )

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = self.model_class(config, self.make_layer, self.embedding_multiplier(config))
        stage = self.model.stage
        self.lm_head: nn.Module
        if not stage.last:
            self.lm_head = PPMissingLayer()
        elif config.tie_word_embeddings and stage.first:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        return AttentionOptions(config.attention_bias, config.attention_bias)

    @classmethod
    def make_layer(
        cls, config: ModelConfig, layer_id: int, rotary_emb: RotaryEmbedding
    ) -> nn.Module:
        """Decoder layer `layer_id`: families whose layers differ only in their attention
        options, MLP or residual scale override layer_attention_options, make_mlp or
        residual_multiplier; those with another layer class override this."""
        return LlamaDecoderLayer(
            config,
            layer_id,
            rotary_emb,
            cls.layer_attention_options(config, layer_id),
            residual_multiplier=cls.residual_multiplier(config),
            mlp=cls.make_mlp(config, layer_id),
        )

    @classmethod
    def layer_attention_options(cls, config: ModelConfig, layer_id: int) -> AttentionOptions:
        """attention_options with layer `layer_id`'s window where the config's layer_types
        give it one (typed_layer_window)."""
        options = cls.attention_options(config)
        window = typed_layer_window(config, layer_id)
        return options if window is None else options._replace(sliding_window=window)

    @classmethod
    def make_mlp(cls, config: ModelConfig, layer_id: int) -> nn.Module | None:
        """Layer `layer_id`'s MLP in place of the dense LlamaMLP (a MoE block), or None."""
        return None

    @classmethod
    def residual_multiplier(cls, config: ModelConfig) -> float:
        """What each block's output is scaled by before it joins the residual (Granite)."""
        return 1.0

    @classmethod
    def embedding_multiplier(cls, config: ModelConfig) -> float:
        return 1.0

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        return self.model(input_ids, positions, forward_batch)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(hidden, self.lm_head)

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Each row's argmax of its logits in the model's dtype, for a caller that takes only
        that (the LM head's method may never write the logits). None where a family
        post-processes its logits in float32 (its own compute_logits: Gemma 2's soft cap,
        Granite's scaling), which then take compute_logits as usual."""
        if type(self).compute_logits is not LlamaForCausalLM.compute_logits:
            return None
        return self.logits_processor.greedy_tokens(hidden, self.lm_head)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors; raises ValueError naming any tensor the checkpoint lacks."""
        skip = ["rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached"]
        if self.config.tie_word_embeddings:
            skip.append("lm_head.weight")  # some tied checkpoints still store a copy
        tied = self.config.tie_word_embeddings
        weights = stage_weights(self.checkpoint_tensors(weights), self.model.stage, tied, skip)
        load_weights_into(self, weights, self.stacked_params, resolve=self.param_shard)

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors as this model's loader names them (families that rename
        or split tensors override this; MoE models split stacked experts)."""
        return weights

    def param_shard(self, name: str) -> tuple[str, object] | None:
        """(parameter, shard id) for a tensor whose shard its name carries (a MoE model's
        per-expert tensors), else None: `stacked_params` maps it."""
        return None


def typed_layer_window(config: ModelConfig, layer_id: int) -> int | None:
    """The sliding window transformers gives layer `layer_id` where the config switches windows
    on (`use_sliding_window`, Qwen2/Qwen3: `layer_types` marks the layers from
    `max_window_layers` on "sliding_attention"), or None (a full-attention layer, no window, or
    a window at least as long as the context, which masks nothing)."""
    hf = config.hf_config
    if not getattr(hf, "use_sliding_window", False):
        return None
    types = getattr(hf, "layer_types", None)
    window = getattr(hf, "sliding_window", None)
    if not types or window is None or types[layer_id] != "sliding_attention":
        return None
    return int(window) if int(window) < config.context_len else None


def reference_window_options(options: AttentionOptions, config: ModelConfig) -> AttentionOptions:
    """`options` with the sliding window transformers gives every layer of a Mistral or Phi-3
    model whenever its config sets one shorter than the context (Mistral 7B v0.1's 4096,
    Phi-3-mini-4k's 2047)."""
    from radixserve.models.config import reference_sliding_window

    window = reference_sliding_window(config.hf_config, config.context_len)
    return options._replace(sliding_window=window)


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral checkpoints are Llama-shaped, with a sliding window on every layer where the
    config sets one."""

    @classmethod
    def attention_options(cls, config: ModelConfig) -> AttentionOptions:
        return reference_window_options(super().attention_options(config), config)
