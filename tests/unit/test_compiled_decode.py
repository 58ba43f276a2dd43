"""--enable-torch-compile: buckets, padding, refusals (fast) and compiled decode vs eager (slow:
inductor takes ~15-25 s per batch-size bucket even for a tiny model on 2 cores)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.model_executor.compiled_decode import (
    CompiledDecode,
    bucket_for,
    decode_buckets,
    pad_decode,
)
from radixserve.model_executor.model_runner import ModelRunner
from radixserve.model_executor.step_io import StepInputs
from radixserve.server_args import ServerArgs, ServerArgsError
from tests.unit.tiny_model import write_tiny_llama

# The tiny model's dummy weights are scaled up so greedy tokens vary from step to step (at the
# default std 0.02 every step repeats the last prompt token, which would prove little).
WEIGHT_STD = 0.3
ROW_LEN = 64  # KV slots per request row in these tests' request-to-token table
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 17]]
STEPS = 6


def test_default_buckets_follow_sglang_cpu_sizes() -> None:
    assert decode_buckets(32) == (1, 2, 4, 8, 12, 16, 24, 32)
    assert decode_buckets(80) == (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80)
    assert decode_buckets(10) == (1, 2, 4, 8, 10)  # the max is always a bucket
    assert decode_buckets(1) == (1,)


def test_explicit_buckets_are_sorted_and_capped() -> None:
    assert decode_buckets(32, [16, 3, 64, 1, 3]) == (1, 3, 16)
    with pytest.raises(ValueError, match=">= 1"):
        decode_buckets(32, [0, 4])


def test_batches_pad_to_the_next_bucket_or_run_eagerly() -> None:
    buckets = (1, 2, 4, 8)
    assert [bucket_for(n, buckets) for n in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert bucket_for(9, buckets) is None


def _decode_step(n: int) -> StepInputs:
    ids, positions, rows = [7, 8, 9, 10, 11][:n], [4, 3, 6, 2, 5][:n], [2, 0, 5, 1, 3][:n]
    return StepInputs(
        is_decode=True,
        input_ids=ids,
        positions=positions,
        req_pool_indices=rows,
        prefix_lens=positions,
        extend_lens=[1] * n,
        out_cache_loc=torch.tensor([40 + i for i in range(n)]),
        logits_rows=list(range(n)),
    )


def test_padded_rows_attend_nothing_and_store_in_the_spare_slot() -> None:
    padded = pad_decode(_decode_step(3), 4, 999)
    assert padded.is_decode
    assert padded.input_ids == [7, 8, 9, 0]
    assert padded.positions == [4, 3, 6, 0]
    assert padded.req_pool_indices == [2, 0, 5, 2]
    assert padded.prefix_lens == [4, 3, 6, 0]
    assert padded.extend_lens == [1, 1, 1, 0]
    assert padded.out_cache_loc.tolist() == [40, 41, 42, 999]
    assert padded.logits_rows == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        pad_decode(_decode_step(5), 4, 999)


@pytest.mark.parametrize(
    ("kwargs", "option", "message"),
    [
        ({"tp_size": 2}, "--enable-torch-compile", "--tp-size 1 only"),
        ({"pp_size": 2}, "--enable-torch-compile", "--pp-size 1 only"),
        ({"enable_lora": True}, "--enable-torch-compile", "--enable-lora"),
        ({"quantization": "w8a8_int8"}, "--enable-torch-compile", "w8a8_int8"),
        ({"quantization": "bitsandbytes"}, "--enable-torch-compile", "bitsandbytes"),
        ({"attention_backend": "torch_native"}, "--enable-torch-compile", "intel_amx"),
        ({"cuda_graph_bs_decode": [1, 0]}, "--cuda-graph-bs-decode", ">= 1"),
        ({"cuda_graph_bs_decode": [64]}, "--cuda-graph-bs-decode", "nothing would be compiled"),
    ],
)
def test_combinations_compile_cannot_run_are_refused(
    kwargs: dict[str, Any], option: str, message: str
) -> None:
    with pytest.raises(ServerArgsError, match=message) as info:
        ServerArgs.from_kwargs(model_path="m", enable_torch_compile=True, **kwargs)
    assert str(info.value).startswith(option)


def test_debug_mode_needs_compile() -> None:
    with pytest.raises(ServerArgsError, match="needs --enable-torch-compile"):
        ServerArgs.from_kwargs(model_path="m", enable_torch_compile_debug_mode=True)


def test_compile_options_resolve() -> None:
    args = ServerArgs.from_kwargs(
        model_path="m", enable_torch_compile=True, torch_compile_max_bs=3, cuda_graph_bs=[1, 3]
    )
    assert args.enable_torch_compile and args.torch_compile_max_bs == 3
    assert tuple(args.cuda_graph_bs_decode) == (1, 3)


def _tiny_runner(folder: Path, **options: Any) -> ModelRunner:
    from radixserve.layers.fast_path import use_fast_kernels
    from radixserve.models.dummy import init_dummy_weights

    args = ServerArgs.from_kwargs(
        model_path=str(folder),
        load_format="dummy",
        dtype="float32",
        skip_tokenizer_init=True,
        max_total_tokens=8 * ROW_LEN,
        random_seed=0,
        attention_backend="intel_amx",
        **options,
    )
    runner = ModelRunner(args)
    with torch.no_grad():
        init_dummy_weights(runner.model, seed=0, std=WEIGHT_STD)
    use_fast_kernels(runner.model, True)
    return runner


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="module")
def runner(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelRunner]:
    """A runner with --enable-torch-compile (buckets 1, 2, 4)."""
    monkeypatch = pytest.MonkeyPatch()
    # Inductor's cache in a per-run folder, not the user's radixserve cache.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
    yield _tiny_runner(tiny_folder, enable_torch_compile=True, torch_compile_max_bs=4)
    monkeypatch.undo()


def _greedy(
    runner: ModelRunner, rows: list[int], prompts: list[list[int]], compiled: CompiledDecode | None
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill `prompts` (eagerly) into request rows `rows`, then STEPS greedy decode steps with
    `compiled` as the runner's compiled decode (None: eager). Tokens per request and the logits
    of every decode step."""
    saved = runner.compiled_decode
    runner.compiled_decode = compiled
    try:
        table = torch.arange(8 * ROW_LEN, dtype=torch.int64).view(8, ROW_LEN)
        lens = [len(p) for p in prompts]
        slots = torch.cat([table[r, :n] for r, n in zip(rows, lens, strict=True)])
        last = [sum(lens[: i + 1]) - 1 for i in range(len(lens))]
        out = runner.forward(
            StepInputs(
                False,
                [t for p in prompts for t in p],
                [i for n in lens for i in range(n)],
                rows,
                [0] * len(rows),
                lens,
                slots,
                last,
            ),
            table,
        )
        tokens = out.logits.argmax(-1).tolist()
        outputs: list[list[int]] = [[t] for t in tokens]
        step_logits = []
        for _ in range(STEPS):
            out = runner.forward(
                StepInputs(
                    True,
                    tokens,
                    list(lens),
                    rows,
                    list(lens),
                    [1] * len(rows),
                    torch.stack([table[r, n] for r, n in zip(rows, lens, strict=True)]),
                    list(range(len(rows))),
                ),
                table,
            )
            step_logits.append(out.logits)
            tokens = out.logits.argmax(-1).tolist()
            lens = [n + 1 for n in lens]
            for seq, t in zip(outputs, tokens, strict=True):
                seq.append(t)
        return outputs, step_logits
    finally:
        runner.compiled_decode = saved


class _EagerPadded(CompiledDecode):
    """The compiled path's padding with an uncompiled model: checks padding alone, fast."""

    def __init__(self, buckets: tuple[int, ...]) -> None:
        self.buckets = buckets
        self.runs: list[int] = []

    def run(self, model: torch.nn.Module, fb: Any) -> torch.Tensor:
        self.runs.append(fb.batch_size)
        return model.compute_logits(model(fb.input_ids, fb.positions, fb)).float()


def test_padded_rows_do_not_touch_real_requests(tiny_folder: Path) -> None:
    # Without torch.compile itself (fast): the runner pads as the compiled path does and runs
    # the padded batch eagerly; the spare KV slot is allocated as --enable-torch-compile would.
    from radixserve.mem_cache.kv_cache import KVCache

    runner = _tiny_runner(tiny_folder)
    padded = _EagerPadded((1, 4))
    runner.compiled_decode = padded
    kv = runner.kv_cache
    runner.kv_cache = KVCache(
        runner.kv_cache_size, kv.num_layers, kv.num_kv_heads, kv.head_dim, kv.dtype, kv.device
    )
    rows = [0, 1, 2]
    want, want_logits = _greedy(runner, rows, PROMPTS, None)
    assert len({tuple(seq) for seq in want}) == 3 and any(len(set(s)) > 2 for s in want)
    got, got_logits = _greedy(runner, rows, PROMPTS, padded)
    assert padded.runs == [4] * STEPS  # 3 requests ran padded to 4
    assert got == want
    for a, b in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_compiled_decode_matches_eager(runner: ModelRunner) -> None:
    from torch._dynamo.utils import counters

    compiled = runner.compiled_decode
    assert compiled is not None and compiled.buckets == (1, 2, 4)
    rows = [0, 1, 2]
    want, want_logits = _greedy(runner, rows, PROMPTS, None)
    counters.clear()
    got, got_logits = _greedy(runner, rows, PROMPTS, compiled)  # 3 requests padded to 4
    assert got == want
    for a, b in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    # Each request alone (bucket 1) decodes exactly as it did in the padded batch.
    for (
        row,
        prompt,
        seq,
    ) in zip(rows, PROMPTS, got, strict=True):
        alone, _ = _greedy(runner, [row], [prompt], compiled)
        assert alone == [seq]
    # Contexts grew every step, yet each bucket compiled once: attention is opaque.
    assert counters["stats"]["unique_graphs"] == 2


@pytest.mark.slow  # importing dynamo and inductor alone takes seconds
def test_new_weights_drop_the_compiled_graphs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Freezing bakes the weights into the graphs: a new model object (update_weights_from_disk,
    resume_memory) gets fresh ones (compiled again on first use)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    compiled = CompiledDecode((1,))
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    fn = compiled._function(first)
    compiled._compiled.add(1)
    assert compiled._function(first) is fn and compiled._compiled == {1}
    assert compiled._function(second) is not fn and not compiled._compiled


@pytest.mark.slow  # the engines compile their buckets (~2-3 min)
def test_speculation_runs_with_compiled_decode(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Speculation under --enable-torch-compile: verify passes (and a draft model's tree steps)
    run eagerly, draftless rounds and a draft model's chain steps through compiled graphs;
    greedy output equals the compiled engine without speculation."""
    from torch._dynamo.utils import counters

    from tests.unit.tiny_model import tiny_engines

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    compile_args = {"enable_torch_compile": True, "torch_compile_max_bs": 4}
    prompts = [[7, 8, 9, 7, 8, 9, 7, 8], list(range(20, 40)), [5, 6, 7, 8]]
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    with tiny_engines(tiny_folder) as make:
        plain = make(**compile_args)
        want = [r["output_ids"] for r in plain.generate(input_ids=prompts, sampling_params=params)]
        counters.clear()
        spec = make(**compile_args, speculative_algorithm="NGRAM")
        decode_steps = []
        forward = spec.scheduler.step_runner.runner.forward

        def counting(step: StepInputs, table: torch.Tensor) -> Any:
            decode_steps.append(step.is_decode)
            return forward(step, table)

        spec.scheduler.step_runner.runner.forward = counting
        got = spec.generate(input_ids=prompts, sampling_params=params)
        assert [r["output_ids"] for r in got] == want
        assert sum(r["meta_info"]["spec_accept_token_num"] for r in got) > 0
        assert any(decode_steps)  # some rounds had no drafts and ran compiled
        # Compiled, one graph per bucket used (no recompiles as contexts grow).
        assert 1 <= counters["stats"]["unique_graphs"] <= 3
        for tree in ({}, {"speculative_eagle_topk": 2, "speculative_num_draft_tokens": 5}):
            counters.clear()
            standalone = make(
                **compile_args,
                speculative_algorithm="STANDALONE",
                speculative_draft_model_path=str(tiny_folder),
                speculative_num_steps=3,
                **tree,
            )
            got = standalone.generate(input_ids=prompts, sampling_params=params)
            assert [r["output_ids"] for r in got] == want
            assert sum(r["meta_info"]["spec_accept_token_num"] for r in got) > 0
            # The target's and the draft's graphs, each one per bucket used.
            assert counters["stats"]["unique_graphs"] <= 6
