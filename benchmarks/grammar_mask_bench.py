"""Per-step grammar mask cost, old path against new, interleaved in one process.

    nice -n 19 .venv/bin/python benchmarks/grammar_mask_bench.py --batch-sizes 1 8 32

old: a [B, V] bool mask, each constrained row filled through ``GrammarMatcher.fill_bitmask``
(packed fill, then unpacked in torch), then ``process_logits`` masks out of place.
new: ``GrammarManager.grammar_mask`` (one packed int32 [B, ceil(V/32)], each row filled by the
library) and ``process_logits`` applying it in place (xgrammar's CPU kernel when installed).

Every request is JSON-schema constrained, on the default model's vocabulary (49152), each
matcher advanced a different number of tokens into a document so the masks differ. Blocks of
``--iters`` steps alternate old / new / the new fill alone for ``--rounds`` rounds; the median
block is reported. Both paths must give identical processed logits (checked before timing).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from radixserve.default_model import ensure_default_model
from radixserve.managers.grammar_manager import GrammarManager
from radixserve.models.tokenizer import get_tokenizer
from radixserve.sampling.constrained import GrammarSpec, create_grammar_backend
from radixserve.sampling.constrained.mask_apply import xgrammar_kernel
from radixserve.sampling.sampling_batch_info import SamplingBatchInfo
from radixserve.sampling.sampling_params import SamplingParams

VOCAB = 49152
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
}
DOCUMENT = '{"name": "Alice Smith", "age": 42, "tags": ["red", "green", "blue"]}'


def make_requests(backend: Any, tokenizer: Any, batch: int) -> list[SimpleNamespace]:
    """``batch`` requests whose matchers sit at different points of DOCUMENT."""
    compiled = backend.compile(GrammarSpec("json_schema", json.dumps(SCHEMA)))
    ids = tokenizer.encode(DOCUMENT, add_special_tokens=False)
    reqs = []
    for i in range(batch):
        matcher = backend.matcher(compiled)
        for token in ids[: (i * 3) % len(ids)]:
            if not matcher.accept_token(token):
                break
        reqs.append(SimpleNamespace(grammar=matcher))
    return reqs


def old_step(reqs: list[SimpleNamespace], info: SamplingBatchInfo, logits: torch.Tensor) -> Any:
    mask = torch.ones((len(reqs), VOCAB), dtype=torch.bool)
    for i, req in enumerate(reqs):
        req.grammar.fill_bitmask(mask[i])
    info.vocab_mask, info.grammar_mask = mask, None
    return info.process_logits(logits)


def new_step(reqs: list[SimpleNamespace], info: SamplingBatchInfo, logits: torch.Tensor) -> Any:
    info.vocab_mask = None
    info.grammar_mask = GrammarManager.grammar_mask(reqs, VOCAB)  # type: ignore[arg-type]
    return info.process_logits(logits)


def block_seconds(step: Callable[[], Any], iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - start) / iters


def measure(
    reqs: list[SimpleNamespace],
    info: SamplingBatchInfo,
    logits: torch.Tensor,
    iters: int,
    rounds: int,
) -> tuple[float, float, float]:
    """Median ms per step of old, new, and the new path's fill alone, blocks interleaved."""
    steps = {
        "old": functools.partial(old_step, reqs, info, logits),
        "new": functools.partial(new_step, reqs, info, logits),
        "fill": functools.partial(GrammarManager.grammar_mask, reqs, VOCAB),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].append(block_seconds(step, iters))
    old, new, fill = (statistics.median(times[name]) * 1e3 for name in steps)
    return old, new, fill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--backend", default="xgrammar")
    parser.add_argument("--iters", type=int, default=20, help="steps per timed block")
    parser.add_argument(
        "--rounds", type=int, default=15, help="interleaved old/new/fill block rounds"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = get_tokenizer(ensure_default_model())
    backend = create_grammar_backend(args.backend, tokenizer, VOCAB)
    kernel = "xgrammar CPU kernel" if xgrammar_kernel() is not None else "torch fallback"
    print(f"backend {args.backend}, apply: {kernel}, torch threads {args.threads}")
    print("batch | old ms/step | new ms/step | old/new | new: fill only")
    for batch in args.batch_sizes:
        reqs = make_requests(backend, tokenizer, batch)
        logits = torch.randn(batch, VOCAB)
        params = [SamplingParams(temperature=0.0)] * batch
        info = SamplingBatchInfo.from_requests(params, [[]] * batch, VOCAB, "cpu")
        assert torch.equal(old_step(reqs, info, logits), new_step(reqs, info, logits))

        o, n, f = measure(reqs, info, logits, args.iters, args.rounds)
        print(f"{batch:5d} | {o:11.3f} | {n:11.3f} | {o / n:6.2f}x | {f:.3f} ms")


if __name__ == "__main__":
    main()
