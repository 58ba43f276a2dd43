"""--enable-mixed-chunk under KV pressure (issue 11): decode tokens ride along with a prefill
chunk, and reserving their slots must never release a request already in the batch."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from radixserve.managers.scheduler_factory import build_scheduler
from radixserve.messages import ReqOutput, TokenizedGenerateReq
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.server_args import ServerArgs
from tests.unit.tiny_model import TINY_VOCAB, write_tiny_llama

# Nine 5-token prompts and one 54-token prompt in a 96-token pool with 48-token chunks, arriving
# over a few steps: (arrival step, rid, max_new_tokens). Before the fix, the decode reserve gave
# back the long prompt's chunk after it had joined the batch, and the step failed.
SCHEDULE = [
    (0, "s0", 11),
    (0, "s8", 16),
    (2, "s1", 16),
    (2, "s2", 6),
    (3, "s7", 37),
    (4, "s5", 17),
    (5, "s4", 23),
    (12, "s6", 38),
    (14, "s3", 23),
    (16, "long", 31),
]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def prompt_ids() -> dict[str, list[int]]:
    rng = random.Random(68)
    ids = {f"s{i}": [rng.randrange(3, TINY_VOCAB) for _ in range(5)] for i in range(9)}
    ids["long"] = [rng.randrange(3, TINY_VOCAB) for _ in range(54)]
    return ids


def run_schedule(model_dir: Path, mixed: bool) -> tuple[dict[str, ReqOutput], dict[str, list[int]]]:
    """Run SCHEDULE to the end; each request's final output and all its tokens."""
    args = ServerArgs.from_kwargs(
        model_path=str(model_dir),
        load_format="dummy",
        dtype="float32",
        skip_tokenizer_init=True,
        max_total_tokens=96,
        chunked_prefill_size=48,
        enable_mixed_chunk=mixed,
        random_seed=0,
    )
    scheduler, _, _ = build_scheduler(args)
    scheduler.check_kv_each_step = True
    ids = prompt_ids()
    arrivals = list(SCHEDULE)
    tokens: dict[str, list[int]] = {rid: [] for _, rid, _ in SCHEDULE}
    final: dict[str, ReqOutput] = {}
    step = 0
    while arrivals or scheduler.has_work():
        while arrivals and arrivals[0][0] <= step:
            _, rid, max_new = arrivals.pop(0)
            params = SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True)
            scheduler.add_request(TokenizedGenerateReq(rid, ids[rid], params))
        for out in scheduler.step():
            tokens[out.rid].extend(out.new_token_ids)
            if out.finished is not None:
                final[out.rid] = out
        step += 1
        assert step < 1000, "the scheduler made no progress"
    kv = scheduler.kv
    assert kv.allocator.available_size() + kv.prefix_cache.total_size() == kv.allocator.size
    assert kv.req_to_token_pool.available_size() == kv.req_to_token_pool.max_reqs
    assert kv.prefix_cache.evictable_size() == kv.prefix_cache.total_size()  # nothing locked
    return final, tokens


def test_mixed_chunk_under_kv_pressure_finishes_every_request(tiny_model_dir: Path) -> None:
    final, tokens = run_schedule(tiny_model_dir, mixed=True)
    _, plain_tokens = run_schedule(tiny_model_dir, mixed=False)
    assert sorted(final) == sorted(rid for _, rid, _ in SCHEDULE)
    for _, rid, max_new in SCHEDULE:
        assert final[rid].finished.type == "length", (rid, final[rid].finished)
        assert len(tokens[rid]) == max_new
    assert tokens == plain_tokens  # greedy: batching does not change the output
