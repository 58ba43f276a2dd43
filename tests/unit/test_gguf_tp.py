"""--quantization gguf with --tp-size 2: each rank keeps its slice of the file's blocks
(models/gguf_shard.py) and the greedy tokens equal one rank's, for a dense model on K-quant
blocks (its embedding and LM head on blocks too) and a MoE model whose experts are split by
intermediate size (--ep-size 1) or whole (--ep-size 2, also with redundant slots and EPLB
moving the blocks between ranks). A split that does not fall on block
boundaries is refused with the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve import Engine
from radixserve.distributed import parallel_state as ps
from radixserve.kernels import gguf_types as gt
from radixserve.kernels.build import load_extension
from radixserve.layers.kquant_paths import KQUANT_INT8_ENV
from radixserve.layers.linear import QKVParallelLinear, RowParallelLinear
from radixserve.models.gguf_shard import shard_linear_blocks, shard_vocab_blocks
from radixserve.options.errors import ServerArgsError
from tests.helpers.tiny_gguf import write_block_gguf, write_tiny_gguf
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

pytestmark = pytest.mark.skipif(load_extension() is None, reason="needs the C++ kernels")

PROMPTS = [[1, 5, 9, 30, 12], [1, 40, 41, 42, 43, 44, 45, 46, 47], [1, 7]]
GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
# K-quant blocks hold 256 weights: a hidden size of 512 leaves each of 2 ranks whole blocks.
TYPES = {"attn_v": gt.Q6_K, "token_embd": gt.Q6_K, "output": gt.Q8_0, "ffn_down": gt.Q5_K}


@pytest.fixture(autouse=True)
def _fixed_kquant_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The int8-or-int16 activation choice for K-quant layers is timed per process at start
    (layers/kquant_paths.py), and a rank times its half of a layer: under load the one-rank
    engine and the ranks could choose differently and round differently. Pinned here (the TP
    workers inherit it) so the comparison is about the split, not the timing."""
    monkeypatch.setenv(KQUANT_INT8_ENV, "0")


def _engine_kwargs(path: Path, **overrides: Any) -> dict[str, Any]:
    return {
        "model_path": str(path),
        "quantization": "gguf",
        "dtype": "float32",
        "skip_tokenizer_init": True,
        "max_total_tokens": 2048,
        "random_seed": 0,
        **overrides,
    }


def _generate(engine: Engine) -> tuple[list[list[int]], list[list[float]]]:
    outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY, return_logprob=True)
    ids = [o["output_ids"] for o in outs]
    logprobs = [[lp for lp, *_ in o["meta_info"]["output_token_logprobs"]] for o in outs]
    return ids, logprobs


def _compare_tp2_to_one_rank(path: Path, **tp_kwargs: Any) -> None:
    with Engine(runtime="thread", **_engine_kwargs(path)) as single:
        ids, logprobs = _generate(single)
    with Engine(tp_size=2, dist_timeout=30, **_engine_kwargs(path, **tp_kwargs)) as engine:
        got_ids, got_logprobs = _generate(engine)
    assert got_ids == ids
    # Only the row-split layers' partial sums are added in another order.
    for want, got in zip(logprobs, got_logprobs, strict=True):
        assert got == pytest.approx(want, abs=1e-3)


@pytest.fixture(scope="module")
def dense_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny_hf_config(
        "llama",
        vocab_size=59,
        hidden_size=512,
        intermediate_size=1024,
        head_dim=64,
        num_attention_heads=8,
    )
    folder = tmp_path_factory.mktemp("gguf-tp")
    return write_block_gguf(folder / "dense.gguf", tiny_hf_model(cfg), TYPES, gt.Q4_K)


def test_dense_k_quant_blocks_tp2_equal_one_rank(dense_gguf: Path) -> None:
    _compare_tp2_to_one_rank(dense_gguf)


# The last: 2 redundant expert slots and --enable-eplb every 2 forward passes, so the experts'
# blocks are rebalanced and moved between the ranks in the middle of generation.
EPLB = {"ep_num_redundant_experts": 2, "enable_eplb": True, "eplb_rebalance_num_iterations": 2}


@pytest.mark.parametrize(
    "tp_kwargs",
    [{"ep_size": 1}, {"ep_size": 2}, {"ep_size": 2, **EPLB}],
    ids=["experts-split", "experts-whole", "experts-rebalanced"],
)
def test_moe_blocks_tp2_equal_one_rank(tmp_path: Path, tp_kwargs: dict[str, Any]) -> None:
    # Q8_0 blocks of 32: a rank's 32 of 64 expert columns and 32 of 64 attention columns.
    cfg = tiny_hf_config("qwen3_moe", vocab_size=59, moe_intermediate_size=64)
    path = write_tiny_gguf(tmp_path / "moe.gguf", tiny_hf_model(cfg), arch="qwen3moe")
    _compare_tp2_to_one_rank(path, **tp_kwargs)


def test_a_split_inside_blocks_is_refused(tmp_path: Path) -> None:
    cfg = tiny_hf_config("llama", vocab_size=59, hidden_size=256, intermediate_size=512)
    path = write_block_gguf(tmp_path / "small.gguf", tiny_hf_model(cfg), {}, gt.Q4_K)
    with pytest.raises(ServerArgsError, match="cuts its Q4_K blocks"):
        Engine(tp_size=2, dist_timeout=30, **_engine_kwargs(path))


def test_each_rank_keeps_its_rows_and_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of 2: its q heads and (shared) kv head rows, and the second half of o's blocks."""
    monkeypatch.setattr(ps, "get_tp_size", lambda: 2)
    monkeypatch.setattr(ps, "get_tp_rank", lambda: 1)
    # 4 query heads of 8, 1 kv head (replicated on both ranks); rows numbered in byte 0.
    qkv = QKVParallelLinear(64, 8, total_num_heads=4, total_num_kv_heads=1)
    rows = [32, 8, 8]
    joined = torch.arange(48, dtype=torch.uint8)[:, None].repeat(1, 34)  # Q8_0: 2 blocks
    (q, _), (k, _), (v, _) = shard_linear_blocks(qkv, [(joined, gt.Q8_0)], rows)
    assert q[:, 0].tolist() == list(range(16, 32))
    assert k[:, 0].tolist() == list(range(32, 40)) and v[:, 0].tolist() == list(range(40, 48))
    o = RowParallelLinear(64, 16)
    blocks = torch.arange(68, dtype=torch.uint8).repeat(16, 1)  # 2 Q8_0 blocks a row
    [(cut, _)] = shard_linear_blocks(o, [(blocks, gt.Q8_0)], [16])
    assert cut.shape == (16, 34) and cut[0].tolist() == list(range(34, 68))
    assert cut.data_ptr() != blocks.data_ptr()  # the rank's own copy


def test_vocab_blocks_are_padded_with_zero_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    class Embedding:
        tp_size, vocab_start, vocab_end, rows_per_partition = 2, 3, 5, 3

    blocks = torch.arange(5, dtype=torch.uint8)[:, None].repeat(1, 34)
    shard = shard_vocab_blocks(Embedding(), blocks)
    assert shard[:, 0].tolist() == [3, 4, 0] and not shard[2].any()


def test_deterministic_tp2_on_blocks_same_bits_alone_and_in_a_batch(dense_gguf: Path) -> None:
    """--enable-deterministic-inference holds with the blocks cut over 2 ranks."""
    target = [1, *range(3, 40)]
    others = [[1, *range(5, 5 + n)] for n in (3, 20, 11, 50)]
    params = {**GREEDY, "temperature": 0.8, "sampling_seed": 5}
    kwargs = _engine_kwargs(dense_gguf, enable_deterministic_inference=True)
    with Engine(tp_size=2, dist_timeout=30, **kwargs) as engine:

        def run(prompts: list[list[int]], index: int) -> tuple:
            out = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
            meta = out[index]["meta_info"]["output_token_logprobs"]
            return out[index]["output_ids"], [lp for lp, *_ in meta]

        alone = run([target], 0)
        engine.flush_cache()
        assert run([others[0], others[1], target, *others[2:]], 2) == alone
