"""A forward step's inputs and outputs as the model runner takes and returns them: StepInputs
(built by model_executor/step_builder.py for every caller) and ForwardOutput. A leaf: the
scheduler side, the speculative drafters and the TP/PP broadcasts name these types without
importing the model runner."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class StepInputs(NamedTuple):
    """One forward step, flattened over requests (see ForwardBatch for the meaning)."""

    # The forward may take the decode path (decode attention, the compiled decode graph):
    # every request extends by one token over its own table row. One-token extends over a
    # per-round table (speculative tree steps) set it False.
    is_decode: bool
    input_ids: list[int]
    positions: list[int]
    req_pool_indices: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    out_cache_loc: torch.Tensor
    logits_rows: list[int]  # flattened token rows whose logits are wanted
    hidden_rows: tuple[int, ...] = ()  # flattened token rows whose final hidden state is wanted
    lora_ids: tuple[int, ...] = ()  # per request, its LoRA adapter id (0: base); () all base
    # An EAGLE draft head's step: the feature each token reads ([num_tokens, feature size]).
    spec_hidden: torch.Tensor | None = None
    # Some request of the step asked for its routed experts (--enable-return-routed-experts).
    capture_routing: bool = False
    # A vision model's image pieces this step runs (multimodal/image_items.py's ImageChunk).
    image_chunks: tuple[Any, ...] = ()
    # An M-RoPE model's rotary positions [3, num_tokens] (temporal, height, width) when some
    # request of the step has images; None: `positions` rotate (and always pick KV slots).
    mrope_positions: torch.Tensor | None = None
    # The caller reads only each logits row's argmax (a plain greedy batch): a model with
    # `greedy_tokens` answers with the argmax itself (ForwardOutput.greedy_tokens: of its logits
    # in its own dtype, which its LM head's method may never write); the others (and families
    # that post-process their logits in float32) give float32 logits as usual.
    argmax_only: bool = False


class ForwardOutput(NamedTuple):
    # [len(logits_rows), vocab] float32; None where greedy_tokens answer the step instead.
    logits: torch.Tensor | None
    hidden: torch.Tensor | None  # [len(hidden_rows), hidden] float32, when asked
    # Every token's features for an EAGLE head, when the runner captures them (capture_final /
    # capture_layers; an EAGLE head's runner always): [num_tokens, feature size].
    features: torch.Tensor | None = None
    # StepInputs.capture_routing: every token's expert ids, [num_tokens, layers, top_k] int32
    # on the CPU (layers/moe/routed_capture.py).
    routed_experts: torch.Tensor | None = None
    # Under StepInputs.argmax_only, where the model gives them: each logits row's argmax of
    # its logits in the model's dtype ([len(logits_rows)] int64), the logits never made.
    greedy_tokens: torch.Tensor | None = None

    def full_logits(self) -> torch.Tensor:
        """The logits, for a caller that did not ask for argmax_only."""
        if self.logits is None:
            raise RuntimeError("this step was answered with greedy tokens, not logits")
        return self.logits
