"""Pipeline parallelism without processes: how layers split into stages, how a step splits into
micro-batches, what each stage builds and loads, and which option combinations are refused.
The multi-process runs are in tests/unit/test_pp_engine.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.distributed import parallel_state as ps
from radixserve.distributed.pipeline_layout import PipelineLayout, micro_batches, stage_layers
from radixserve.mem_cache.kv_cache import KVCache
from radixserve.model_executor.micro_batch import split_step
from radixserve.model_executor.step_io import StepInputs
from radixserve.models.loader import load_model
from radixserve.models.pipeline_stage import PPMissingLayer
from radixserve.server_args import ServerArgs, ServerArgsError
from tests.helpers.tiny_models import make_tiny_checkpoint


@pytest.mark.parametrize(
    ("layers", "pp", "expected"),
    [
        (4, 2, [range(0, 2), range(2, 4)]),
        (5, 2, [range(0, 3), range(3, 5)]),  # the extra layer is not on the last stage
        (7, 4, [range(0, 2), range(2, 4), range(4, 6), range(6, 7)]),
        (30, 4, [range(0, 7), range(7, 15), range(15, 23), range(23, 30)]),
        (3, 3, [range(0, 1), range(1, 2), range(2, 3)]),
        (2, 1, [range(0, 2)]),
    ],
)
def test_stage_layers_are_contiguous_near_equal_and_cover_the_model(
    layers: int, pp: int, expected: list[range]
) -> None:
    got = [stage_layers(layers, s, pp) for s in range(pp)]
    assert got == expected
    assert [i for r in got for i in r] == list(range(layers))
    sizes = [len(r) for r in got]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_more_stages_than_layers_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="--pp-size 3 needs at least one decoder layer per stage"):
        stage_layers(2, 0, 3)


def test_sglang_layer_partition_overrides_the_split() -> None:
    assert [stage_layers(5, s, 2, "1,4") for s in range(2)] == [range(0, 1), range(1, 5)]
    for bad in ("2,2", "1,2,2", "0,5", "a,b"):
        with pytest.raises(ValueError, match="SGLANG_PP_LAYER_PARTITION"):
            stage_layers(5, 0, 2, bad)


def test_layout_pairs_each_rank_with_its_tp_peer_in_the_next_stage() -> None:
    layout = PipelineLayout(tp_size=2, pp_size=3)
    assert layout.world_size == 6
    assert layout.stage_ranks(1) == [2, 3]
    assert [layout.next_rank(r) for r in range(6)] == [2, 3, 4, 5, None, None]
    assert [layout.prev_rank(r) for r in range(6)] == [None, None, 0, 1, 2, 3]
    assert layout.logits_sender == 4
    assert (layout.stage_of(5), layout.tp_rank_of(5)) == (2, 1)


def test_micro_batches_cap_the_requests_per_part() -> None:
    assert micro_batches(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert micro_batches(3, None) == [range(0, 3)]
    assert micro_batches(0, 2) == []


def test_split_step_keeps_every_token_and_puts_rows_back_in_order() -> None:
    # Three requests extending by 3, 1 and 2 tokens; logits wanted for the first request's
    # every token (prompt logprobs) and the others' last; an embedding row for the last.
    step = StepInputs(
        is_decode=False,
        input_ids=[10, 11, 12, 13, 14, 15],
        positions=[0, 1, 2, 7, 4, 5],
        req_pool_indices=[3, 1, 2],
        prefix_lens=[0, 7, 4],
        extend_lens=[3, 1, 2],
        out_cache_loc=torch.tensor([20, 21, 22, 23, 24, 25]),
        logits_rows=[0, 1, 2, 3, 5],
        hidden_rows=(5,),
    )
    parts = split_step(step, 2)
    assert [p.step.extend_lens for p in parts] == [[3, 1], [2]]
    first, second = parts[0].step, parts[1].step
    assert first.input_ids == [10, 11, 12, 13] and second.input_ids == [14, 15]
    assert second.positions == [4, 5] and second.req_pool_indices == [2]
    assert second.out_cache_loc.tolist() == [24, 25]
    assert first.logits_rows == [0, 1, 2, 3] and parts[0].logits_at == (0, 1, 2, 3)
    assert second.logits_rows == [1] and parts[1].logits_at == (4,)
    assert first.hidden_rows == () and second.hidden_rows == (1,) and parts[1].hidden_at == (0,)
    whole = split_step(step, None)
    assert len(whole) == 1 and whole[0].step.input_ids == step.input_ids


def test_a_stage_caches_only_its_own_layers() -> None:
    cache = KVCache(16, 4, 2, 8, torch.float32, "cpu", owned_layers=range(2, 4))
    assert [len(b) for b in cache.k_buffers] == [0, 0, 17, 17]
    assert [len(b) for b in cache.v_buffers] == [0, 0, 17, 17]
    assert cache.get_kv(3)[0][16].abs().sum() == 0  # the pad slot


def _as_stage(monkeypatch: pytest.MonkeyPatch, stage: int, stages: int) -> None:
    monkeypatch.setattr(ps, "_PP_RANK", stage)
    monkeypatch.setattr(ps, "_PP_SIZE", stages)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_each_stage_builds_and_loads_only_its_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tied: bool
) -> None:
    make_tiny_checkpoint(tmp_path, "llama", num_hidden_layers=3, tie_word_embeddings=tied)
    full = load_model(str(tmp_path), dtype="float32").model
    whole = dict(full.named_parameters())
    stages = []
    for stage in range(2):
        _as_stage(monkeypatch, stage, 2)
        stages.append(load_model(str(tmp_path), dtype="float32").model)
    first, last = stages
    assert first.model.stage.layers == range(0, 2) and last.model.stage.layers == range(2, 3)
    assert isinstance(first.model.layers[2], PPMissingLayer)
    assert isinstance(last.model.layers[0], PPMissingLayer)
    assert isinstance(first.model.norm, PPMissingLayer)
    assert isinstance(first.lm_head, PPMissingLayer)
    assert isinstance(last.model.embed_tokens, PPMissingLayer)
    # Every parameter of each stage holds the checkpoint's value, and between them the stages
    # hold every parameter of the whole model once (a tied head is the embedding's copy).
    seen = set()
    for model in stages:
        for name, param in model.named_parameters():
            source = "model.embed_tokens.weight" if name == "lm_head.weight" and tied else name
            torch.testing.assert_close(param, whole[source], rtol=0, atol=0)
            seen.add(source)
    assert seen == set(whole)
    stage_params = [sum(p.numel() for p in m.parameters()) for m in stages]
    assert all(n < sum(p.numel() for p in full.parameters()) for n in stage_params)


def test_pipeline_options_are_checked() -> None:
    args = ServerArgs(pp_size=2, tp_size=2, pp_max_micro_batch_size=4)
    assert (args.pp_size, args.pp_max_micro_batch_size) == (2, 4)
    refused = [
        ({"pp_max_micro_batch_size": 0, "pp_size": 2}, "--pp-max-micro-batch-size: must be >= 1"),
        ({"pp_max_micro_batch_size": 2}, "--pp-max-micro-batch-size: .*needs --pp-size > 1"),
        ({"pp_size": 2, "enable_lora": True}, "--pp-size: 2 cannot be combined with --enable-lora"),
        ({"pp_size": 2, "speculative_algorithm": "NGRAM"}, "--speculative-algorithm"),
        ({"pp_size": 2, "enable_hierarchical_cache": True}, "--enable-hierarchical-cache"),
        ({"pp_size": 2, "quantization": "w8a8_int8"}, "--quantization w8a8_int8"),
        ({"pp_size": 2, "quantization": "bitsandbytes"}, "--quantization bitsandbytes"),
        ({"pp_size": 2, "dp_size": 2}, "--dp-size 2"),
        ({"pp_size": 2, "pp_async_batch_depth": 2}, "--pp-async-batch-depth"),
    ]
    for kwargs, message in refused:
        with pytest.raises(ServerArgsError, match=message) as info:
            ServerArgs.from_kwargs(**kwargs)
        assert "\n" not in str(info.value)


def test_stage_plan_reads_the_partition_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from radixserve.models.pipeline_stage import stage_plan

    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "1,4")
    _as_stage(monkeypatch, 1, 2)
    plan = stage_plan(5)
    assert (plan.layers, plan.first, plan.last) == (range(1, 5), False, True)
    assert plan.skip_names(tie_word_embeddings=False) == ["model.layers.0.", "model.embed_tokens."]
