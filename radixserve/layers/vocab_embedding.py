"""Token embedding and LM head, split over tensor-parallel ranks by vocabulary rows."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.distributed import parallel_state as ps
from radixserve.kernels.reference import dequantize_blocks
from radixserve.layers.linear import copy_checked
from radixserve.layers.quantization import (
    GGUFWeight,
    LinearMethod,
    MethodLayer,
    UnquantizedLinearMethod,
)
from radixserve.layers.weight_storage import weight_dtype

logger = logging.getLogger(__name__)


def gguf_rows(weight: GGUFWeight, ids: torch.Tensor) -> torch.Tensor:
    """Float32 rows `ids` of a weight kept as GGUF blocks, shaped [*ids.shape, K]."""
    flat = ids.reshape(-1)
    rows = dequantize_blocks(weight.blocks.index_select(0, flat), weight.qtype, flat.numel())
    return rows.reshape(*ids.shape, rows.shape[-1])


class VocabParallelEmbedding(MethodLayer):
    """Embedding whose rows are split evenly over TP ranks.

    The vocabulary is padded up to a multiple of tp_size; rank r owns rows
    [r * rows_per_partition, (r + 1) * rows_per_partition). Padding rows are zero and never
    produce logits (the logits processor slices them off). As the LM head (tied or not) it
    multiplies through its `quant_method` like a linear layer: float, GGUF blocks
    (--quantization gguf; lookups then dequantize the rows they read) or packed for oneDNN.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        if num_embeddings <= 0 or embedding_dim <= 0:
            raise ValueError(
                f"num_embeddings ({num_embeddings}) and embedding_dim ({embedding_dim}) must be "
                "positive"
            )
        self.tp_rank = ps.get_tp_rank()
        self.tp_size = ps.get_tp_size()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.rows_per_partition = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_partition
        self.vocab_end = min(self.vocab_start + self.rows_per_partition, num_embeddings)
        # The table may be stored 16-bit under float32 compute (layers/weight_storage.py):
        # lookups widen the rows they read to the compute dtype.
        self.output_dtype = torch.get_default_dtype()
        self.weight = nn.Parameter(
            torch.empty(self.rows_per_partition, embedding_dim, dtype=weight_dtype()),
            requires_grad=False,
        )
        self.weight.weight_loader = self.weight_loader
        # The LM head keeps F.linear (never the fused float kernels).
        self.quant_method: LinearMethod = UnquantizedLinearMethod()

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} is not fused; got shard_id {shard_id!r}")
        if loaded_weight.shape[0] != self.num_embeddings:
            raise ValueError(
                f"shape mismatch: vocabulary of {self.num_embeddings} rows vs checkpoint "
                f"{tuple(loaded_weight.shape)}"
            )
        owned = self.vocab_end - self.vocab_start
        copy_checked(param.data[:owned], loaded_weight[self.vocab_start : self.vocab_end])
        param.data[owned:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        blocks = self.quant_method.gguf_weight()
        if self.tp_size == 1:
            if blocks is not None:
                # --quantization gguf dropped the float table: dequantize the rows looked up.
                # Q8_0 and Q4_1 dequantize exactly as the table was made, so the result is
                # bitwise the float lookup's.
                return gguf_rows(blocks, input_ids).to(self.weight.dtype)
            return F.embedding(input_ids, self.weight).to(self.output_dtype)
        owned = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = torch.where(owned, input_ids - self.vocab_start, 0)
        if blocks is not None:  # this rank's vocabulary rows of the file's blocks
            out = gguf_rows(blocks, local_ids).to(self.output_dtype)
        else:
            out = F.embedding(local_ids, self.weight).to(self.output_dtype)
        out = out * owned.unsqueeze(-1).to(self.output_dtype)
        return ps.tensor_model_parallel_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; its weight is used by LogitsProcessor, not called directly."""

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.bias: nn.Parameter | None = None
        if bias:
            self.bias = nn.Parameter(torch.empty(self.rows_per_partition), requires_grad=False)
            self.bias.weight_loader = self.weight_loader

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied by LogitsProcessor, not called directly")
