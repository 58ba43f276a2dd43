"""Hidden states -> float32 logits over the real vocabulary."""

from __future__ import annotations

import logging

import torch
from torch import nn

from radixserve.distributed import parallel_state as ps
from radixserve.kernels import ops
from radixserve.layers.quantization import MethodLayer

logger = logging.getLogger(__name__)


class LogitsProcessor(nn.Module):
    """Projects hidden states with the (possibly tied) LM head weight.

    The matmul runs in the model dtype (as the reference implementation does); the result is
    gathered over TP ranks, stripped of vocabulary padding and returned as float32; for greedy
    argmax only, `greedy_tokens` returns each row's argmax of the logits in the model's dtype.
    """

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor, lm_head: MethodLayer) -> torch.Tensor:
        return self.in_model_dtype(hidden, lm_head).float()

    def in_model_dtype(self, hidden: torch.Tensor, lm_head: MethodLayer) -> torch.Tensor:
        """The logits as the matmul gives them (the model's dtype; a strided view where the
        vocabulary is padded): forward's before its float32 copy, greedy_tokens' argmax'ed
        without one."""
        bias = getattr(lm_head, "bias", None)
        logits = lm_head.quant_method.apply(lm_head, hidden, bias)
        logits = ps.tensor_model_parallel_all_gather(logits, dim=-1)
        return logits[..., : self.vocab_size]

    def greedy_tokens(self, hidden: torch.Tensor, lm_head: MethodLayer) -> torch.Tensor:
        """argmax_rows of in_model_dtype's logits ([rows] int64): on one rank and without a
        bias, the head's method computes it (GGUF blocks on AMX tiles never write the logits);
        otherwise from the gathered logits."""
        if getattr(lm_head, "bias", None) is not None or ps.get_tp_size() > 1:
            return ops.argmax_rows(self.in_model_dtype(hidden, lm_head))
        return lm_head.quant_method.argmax(lm_head, hidden, self.vocab_size)
