"""--enable-torch-compile: decode steps through torch.compile, one static graph per batch bucket.

Like SGLang's CPU graph runner: only decode batches of at most --torch-compile-max-bs requests
run compiled; prefill, extend and mixed batches (and larger decode batches) run eagerly. A batch is
padded up to the next bucket size (--cuda-graph-bs, else DEFAULT_BUCKETS up to the max), so at most
one graph per bucket is ever compiled. Padded rows are requests of zero new tokens for attention:
their KV goes to a spare slot no request owns, they read no one's KV, and their logits are dropped.

Attention (with RoPE and the KV store) and GGUF matmuls are opaque custom ops
(layers/compile_ops.py), so growing contexts never recompile. The rest of the decoder (norms,
matmuls, SiLU, residual adds, the LM head) is plain PyTorch that inductor compiles, with freezing
on (the weights are constants, prepacked for the matmul kernels). The C++ one-call decoder layer
is not used inside the graph: dynamo cannot trace into it, and as one opaque op it would leave
inductor nothing to compile.

Compiling costs tens of seconds to minutes per bucket on a small CPU, so graphs are compiled on
first use (a log line per bucket with its time), and inductor's cache lives on disk under the
radixserve cache folder: a restart reuses the generated kernels and skips their C++ build.
Compiled float32 is not bitwise equal to eager (inductor reorders float sums: max logit
difference ~1e-5 on SmolLM2-135M, greedy tokens unchanged); the eager path is untouched.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch import nn

    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.model_executor.step_io import StepInputs

logger = logging.getLogger(__name__)

# SGLang's CPU capture sizes, denser at small batches where most decode steps run.
_SMALL_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32)
_LARGE_STEP = 16
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def decode_buckets(max_bs: int, explicit: Sequence[int] | None = None) -> tuple[int, ...]:
    """The decode batch sizes that get a compiled graph, ascending.

    `explicit` (--cuda-graph-bs) gives them exactly, less those above `max_bs`. Otherwise the
    small sizes 1, 2, 4, 8, 12, 16, 24, 32, then every 16 up to `max_bs`, which is always one."""
    if max_bs < 1:
        raise ValueError(f"the largest compiled batch size must be >= 1, got {max_bs}")
    if explicit:
        if min(explicit) < 1:
            raise ValueError(f"batch sizes must be >= 1, got {sorted(explicit)}")
        return tuple(sorted({b for b in explicit if b <= max_bs}))
    sizes = [b for b in _SMALL_BUCKETS if b <= max_bs]
    size = _SMALL_BUCKETS[-1] + _LARGE_STEP
    while size <= max_bs:
        sizes.append(size)
        size += _LARGE_STEP
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return tuple(sizes)


def bucket_for(batch_size: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds `batch_size` requests, None when none does (eager)."""
    for bucket in buckets:
        if bucket >= batch_size:
            return bucket
    return None


def pad_decode(step: StepInputs, bucket: int, spare_slot: int) -> StepInputs:
    """Pad a decode step of n requests (one new token each) to `bucket` rows, with logits for
    every row. A padded row is token 0 at position 0 of a request that attends over nothing
    (zero new tokens, zero prefix: the attention kernel skips it) and stores its KV in
    `spare_slot`; it borrows the first request's req_to_token row only as a valid index, which
    is never read."""
    n = len(step.input_ids)
    if not 0 < n <= bucket:
        raise ValueError(f"cannot pad a decode batch of {n} to {bucket}")
    pad = bucket - n
    slots = step.out_cache_loc.to(torch.int64)
    if pad:
        spare = torch.full((pad,), spare_slot, dtype=torch.int64, device=slots.device)
        slots = torch.cat([slots, spare])
    return step._replace(
        input_ids=[*step.input_ids, *[0] * pad],
        positions=[*step.positions, *[0] * pad],
        req_pool_indices=[*step.req_pool_indices, *[step.req_pool_indices[0]] * pad],
        prefix_lens=[*step.prefix_lens, *[0] * pad],
        extend_lens=[1] * n + [0] * pad,
        out_cache_loc=slots,
        logits_rows=list(range(bucket)),
    )


def _keep_eager(model: nn.Module) -> None:
    """Modules whose forward must stay out of the compiled graph (`eager_under_compile`, e.g.
    the MoE experts' data-dependent loop) run it eagerly, as a graph break."""
    for module in model.modules():
        if getattr(module, "eager_under_compile", False) and not getattr(
            module, "_eager_wrapped", False
        ):
            module.forward = torch.compiler.disable(module.forward)
            module._eager_wrapped = True


def inductor_cache_dir() -> Path:
    """Where inductor keeps its compiled graphs and kernels: $TORCHINDUCTOR_CACHE_DIR when set,
    else `torch_compile` in radixserve's cache folder (RADIXSERVE_CACHE_DIR overrides it)."""
    override = os.environ.get(INDUCTOR_CACHE_ENV)
    if override:
        return Path(override)
    from radixserve.utils.cache_dir import radixserve_cache_dir

    return radixserve_cache_dir() / "torch_compile"


class CompiledDecode:
    """The compiled decode forward of one model: logits [bucket, vocab] float32 for a padded
    ForwardBatch. Graphs are compiled per bucket on first use and dropped when the model object
    changes (new weights: freezing baked the old ones into the graphs)."""

    def __init__(self, buckets: Sequence[int], debug: bool = False) -> None:
        import radixserve.layers.compile_ops  # noqa: F401  (registers the opaque ops)

        self.buckets = tuple(buckets)
        self.debug = debug
        self._model: nn.Module | None = None
        self._fn: Callable[..., torch.Tensor] | None = None
        self._compiled: set[int] = set()
        cache = inductor_cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        os.environ[INDUCTOR_CACHE_ENV] = str(cache)
        # One graph per bucket, plus headroom: dynamo falls back to eager past its limit.
        limit = len(self.buckets) + 4
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
        torch._dynamo.config.accumulated_recompile_limit = max(
            torch._dynamo.config.accumulated_recompile_limit, 4 * limit
        )
        if debug:
            # --enable-torch-compile-debug-mode: say why each graph breaks or recompiles.
            torch._logging.set_logs(graph_breaks=True, recompiles=True)
        logger.info(
            "torch.compile: decode batches padded to buckets %s; inductor cache %s",
            list(self.buckets),
            cache,
        )

    def bucket(self, batch_size: int) -> int | None:
        return bucket_for(batch_size, self.buckets)

    def _function(self, model: nn.Module) -> Callable[..., torch.Tensor]:
        if self._fn is None or self._model is not model:
            if self._model is not None:
                logger.info("torch.compile: new weights, recompiling the decode graphs")
                torch._dynamo.reset()
            self._compiled.clear()
            self._model = model
            _keep_eager(model)

            def decode(
                input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch
            ) -> torch.Tensor:
                hidden = model(input_ids, positions, fb)
                return model.compute_logits(hidden).float()

            self._fn = torch.compile(
                decode,
                dynamic=False,
                fullgraph=self.debug,
                options={"freezing": True},
            )
        return self._fn

    def run(self, model: nn.Module, fb: ForwardBatch) -> torch.Tensor:
        fn = self._function(model)
        bucket = fb.batch_size
        if bucket in self._compiled:
            return fn(fb.input_ids, fb.positions, fb)
        start = time.perf_counter()
        logits = fn(fb.input_ids, fb.positions, fb)
        self._compiled.add(bucket)
        logger.info(
            "torch.compile: decode batch size %d compiled in %.1f s (%d of %d buckets)",
            bucket,
            time.perf_counter() - start,
            len(self._compiled),
            len(self.buckets),
        )
        return logits
