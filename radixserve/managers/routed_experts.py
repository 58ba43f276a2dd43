"""A request's routed experts (`return_routed_experts`, --enable-return-routed-experts): the
expert ids every MoE layer chose for each of its tokens, kept by position while it runs and
sent once, base64 of an int32 [tokens, layers, top_k] array, in its final meta_info.

Which tokens: the prompt and the generated tokens but the last (it is sampled, never run
through the model), as SGLang's `seqlen - 1` rows, from `routed_experts_start_len` on (0 by
default). Such a request takes no cached prefix past that start (BatchFormer._admit_waiting), so
every position it returns is computed, and routed, in its own forwards: SGLang instead reads
ids it stored per KV slot when a cached prefix was first computed; both answer the same ids
for a deterministic model.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from radixserve.layers.moe.routed_capture import NO_EXPERT

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req


class RoutedExpertsRecord:
    """One request's ids by position: grows by doubling, so its memory is at most twice its
    tokens' (context length x layers x top_k x 4 bytes), and dies with the request."""

    def __init__(self) -> None:
        self._ids: torch.Tensor | None = None
        self.num_tokens = 0  # positions [0, num_tokens) written

    def write(self, start: int, ids: torch.Tensor) -> None:
        """The ids [n, layers, top_k] of positions [start, start + n) (a retracted request
        recomputes its positions and overwrites them)."""
        end = start + ids.shape[0]
        if self._ids is None:
            self._ids = torch.full((max(end, 16), *ids.shape[1:]), NO_EXPERT, dtype=torch.int32)
        elif end > self._ids.shape[0]:
            grown = torch.full(
                (max(end, 2 * self._ids.shape[0]), *self._ids.shape[1:]),
                NO_EXPERT,
                dtype=torch.int32,
            )
            grown[: self.num_tokens] = self._ids[: self.num_tokens]
            self._ids = grown
        self._ids[start:end] = ids
        self.num_tokens = max(self.num_tokens, end)

    def array(self, start: int = 0, end: int | None = None) -> np.ndarray:
        """[n, layers, top_k] int32: positions [start, min(end, num_tokens)) (a copy; empty
        when start is past them)."""
        if self._ids is None:
            return np.zeros((0, 0, 0), dtype=np.int32)
        stop = self.num_tokens if end is None else min(end, self.num_tokens)
        return self._ids[min(start, stop) : stop].numpy().copy()

    def encode(self, start: int = 0, end: int | None = None) -> str:
        """Base64 of the int32 array's bytes (native little-endian, C order) of positions
        [start, end), as SGLang's meta_info["routed_experts"]."""
        data = np.ascontiguousarray(self.array(start, end)).tobytes()
        return base64.b64encode(data).decode("ascii")


def decode_routed_experts(data: str, num_layers: int, top_k: int) -> np.ndarray:
    """meta_info["routed_experts"] back to [tokens, num_layers, top_k] int32 (for clients and
    tests)."""
    flat = np.frombuffer(base64.b64decode(data), dtype=np.int32)
    return flat.reshape(-1, num_layers, top_k)


def keep_routed_experts(
    reqs: Sequence[Req],
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    ids: torch.Tensor,
) -> None:
    """Hand each request that asked its rows of a step's ids [rows, layers, top_k]: the
    step's rows are the requests' new tokens in turn, request i's at positions
    [prefix_lens[i], prefix_lens[i] + extend_lens[i])."""
    row = 0
    for req, start, n in zip(reqs, prefix_lens, extend_lens, strict=True):
        if req.return_routed_experts:
            if req.routed_experts is None:
                req.routed_experts = RoutedExpertsRecord()
            req.routed_experts.write(start, ids[row : row + n])
        row += n
