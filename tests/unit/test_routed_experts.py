"""--enable-return-routed-experts: a request's meta_info["routed_experts"] is base64 of int32
[tokens, layers, top_k], the experts transformers' routers pick for the prompt and the
generated tokens but the last, -1 in dense layers; refused (400) while the flag is off, and
the flag refused for a model without MoE layers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from radixserve.managers.routed_experts import (
    RoutedExpertsRecord,
    decode_routed_experts,
    keep_routed_experts,
)
from radixserve.managers.schedule_batch import Req
from radixserve.sampling.sampling_params import SamplingParams
from tests.helpers.family_check import require_hf_arch
from tests.helpers.tiny_models import make_tiny_checkpoint, save_word_tokenizer

GREEDY = {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}
PROMPT = [3, 5, 9, 30, 12, 7, 44]
NUM_LAYERS, TOP_K = 4, 2


def test_record_keeps_ids_by_position_and_grows() -> None:
    record = RoutedExpertsRecord()
    first = torch.arange(10 * 3 * 2, dtype=torch.int32).reshape(10, 3, 2)
    record.write(0, first)
    later = torch.full((20, 3, 2), 7, dtype=torch.int32)
    record.write(10, later)  # past the first allocation: grows
    record.write(2, first[:1] + 100)  # a recomputed position overwrites
    got = decode_routed_experts(record.encode(), 3, 2)
    assert got.shape == (30, 3, 2) and got.dtype == np.int32
    want = torch.cat([first, later]).numpy()
    want[2] = first[0].numpy() + 100
    assert np.array_equal(got, want)


def test_a_step_hands_each_asking_request_its_rows() -> None:
    asks, skips = (
        Req(rid=rid, origin_input_ids=[1, 2, 3], sampling_params=SamplingParams())
        for rid in ("a", "b")
    )
    asks.return_routed_experts = True
    ids = torch.arange(5 * 1 * 2, dtype=torch.int32).reshape(5, 1, 2)
    # "b" extends 2 rows at position 0, then "a" 3 rows from position 4.
    keep_routed_experts([skips, asks], [0, 4], [2, 3], ids)
    assert skips.routed_experts is None
    assert asks.routed_experts.num_tokens == 7
    got = asks.routed_experts.array()
    assert np.array_equal(got[4:], ids[2:].numpy())
    assert (got[:4] == -1).all()  # not written: no expert


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    require_hf_arch("qwen3_moe")
    folder = tmp_path_factory.mktemp("qwen3_moe_routed")
    # Text and chat for the OpenAI routes: "w<i>" is token i.
    save_word_tokenizer(folder)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}w3 {{ m['content'] }} {% endfor %}w4"
    )
    # Layer 0 dense (mlp_only_layers), layer 2 dense (step of 2): ids -1 there.
    hf = make_tiny_checkpoint(
        folder,
        "qwen3_moe",
        num_hidden_layers=NUM_LAYERS,
        decoder_sparse_step=2,
        mlp_only_layers=[0],
        norm_topk_prob=True,
    )
    return folder, hf


def transformers_experts(hf: torch.nn.Module, tokens: list[int]) -> np.ndarray:
    """[tokens, layers, top_k]: what each HF router picks over the whole sequence, -1 in its
    dense layers."""
    with torch.no_grad():
        out = hf(torch.tensor([tokens]), output_router_logits=True)
    sparse = [
        i
        for i, layer in enumerate(hf.model.layers)
        if type(layer.mlp).__name__.endswith("SparseMoeBlock")
    ]
    want = np.full((len(tokens), NUM_LAYERS, TOP_K), -1, dtype=np.int32)
    for layer, logits in zip(sparse, out.router_logits, strict=True):
        scores = torch.softmax(logits.float(), dim=-1)
        want[:, layer] = torch.topk(scores, TOP_K, dim=-1).indices.numpy()
    return want


@pytest.fixture(scope="module")
def engine(moe_model: tuple[Path, torch.nn.Module]) -> Iterator[Any]:
    from radixserve import Engine

    eng = Engine(
        runtime="thread",
        model_path=str(moe_model[0]),
        dtype="float32",
        max_total_tokens=1024,
        chunked_prefill_size=4,  # the prompt runs in two chunks: ids from both
        enable_return_routed_experts=True,
        skip_server_warmup=True,
    )
    try:
        yield eng
    finally:
        eng.shutdown()


def test_ids_equal_transformers_routers(
    engine: Any, moe_model: tuple[Path, torch.nn.Module]
) -> None:
    hf = moe_model[1]
    out = engine.generate(input_ids=PROMPT, sampling_params=GREEDY, return_routed_experts=True)
    got = decode_routed_experts(out["meta_info"]["routed_experts"], NUM_LAYERS, TOP_K)
    # Every token the model ran: the prompt and the generated tokens but the last.
    tokens = PROMPT + out["output_ids"][:-1]
    assert got.shape == (len(tokens), NUM_LAYERS, TOP_K)
    assert (got[:, [0, 2]] == -1).all()
    assert np.array_equal(got, transformers_experts(hf, tokens))
    # Asked again, the prompt is in the prefix cache: it is recomputed, so the ids are whole.
    again = engine.generate(input_ids=PROMPT, sampling_params=GREEDY, return_routed_experts=True)
    assert again["meta_info"]["routed_experts"] == out["meta_info"]["routed_experts"]
    plain = engine.generate(input_ids=PROMPT, sampling_params=GREEDY)
    assert "routed_experts" not in plain["meta_info"]
    assert plain["output_ids"] == out["output_ids"]


def test_start_len_returns_the_tail_and_lets_the_cache_serve_the_head(engine: Any) -> None:
    full = engine.generate(input_ids=PROMPT, sampling_params=GREEDY, return_routed_experts=True)
    whole = decode_routed_experts(full["meta_info"]["routed_experts"], NUM_LAYERS, TOP_K)
    tail = engine.generate(
        input_ids=PROMPT,
        sampling_params=GREEDY,
        return_routed_experts=True,
        routed_experts_start_len=3,
    )
    assert tail["meta_info"]["cached_tokens"] == 3  # the positions it does not return
    got = decode_routed_experts(tail["meta_info"]["routed_experts"], NUM_LAYERS, TOP_K)
    assert np.array_equal(got, whole[3:])
    past = engine.generate(
        input_ids=PROMPT,
        sampling_params=GREEDY,
        return_routed_experts=True,
        routed_experts_start_len=1000,
    )
    assert past["meta_info"]["routed_experts"] == ""  # nothing from there on
    with pytest.raises(ValueError, match="routed_experts_start_len"):
        engine.generate(
            input_ids=PROMPT,
            sampling_params=GREEDY,
            return_routed_experts=True,
            routed_experts_start_len=-1,
        )


def test_batched_requests_get_their_own_ids(
    engine: Any, moe_model: tuple[Path, torch.nn.Module]
) -> None:
    hf = moe_model[1]
    prompts = [PROMPT, [4, *range(40, 52)]]
    outs = engine.generate(input_ids=prompts, sampling_params=GREEDY, return_routed_experts=True)
    for prompt, out in zip(prompts, outs, strict=True):
        tokens = prompt + out["output_ids"][:-1]
        got = decode_routed_experts(out["meta_info"]["routed_experts"], NUM_LAYERS, TOP_K)
        assert np.array_equal(got, transformers_experts(hf, tokens))


def test_stream_sends_them_in_the_final_chunk(engine: Any) -> None:
    chunks = list(
        engine.generate(
            input_ids=PROMPT, sampling_params=GREEDY, stream=True, return_routed_experts=True
        )
    )
    assert all("routed_experts" not in c["meta_info"] for c in chunks[:-1])
    got = decode_routed_experts(chunks[-1]["meta_info"]["routed_experts"], NUM_LAYERS, TOP_K)
    assert got.shape == (len(PROMPT) + GREEDY["max_new_tokens"] - 1, NUM_LAYERS, TOP_K)


def test_http_generate(engine: Any, moe_model: tuple[Path, torch.nn.Module]) -> None:
    from fastapi.testclient import TestClient

    from radixserve.entrypoints.http_server import create_app

    with TestClient(create_app(engine, engine.server_args)) as client:
        body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_routed_experts": True}
        r = client.post("/generate", json=body)
        assert r.status_code == 200, r.text
        res = r.json()
        tokens = PROMPT + res["output_ids"][:-1]
        got = decode_routed_experts(res["meta_info"]["routed_experts"], NUM_LAYERS, TOP_K)
        assert np.array_equal(got, transformers_experts(moe_model[1], tokens))


def _sse(text: str) -> list[dict[str, Any]]:
    import json

    lines = [ln[len("data: ") :] for ln in text.splitlines() if ln.startswith("data: ")]
    return [json.loads(ln) for ln in lines if ln != "[DONE]"]


def test_openai_routes_put_them_in_sgl_ext(engine: Any) -> None:
    """SGLang's extra field on /v1/completions and /v1/chat/completions: each choice's
    sgl_ext.routed_experts (the last chunk's, streaming), as /generate's meta_info."""
    from fastapi.testclient import TestClient

    from radixserve.entrypoints.http_server import create_app

    with TestClient(create_app(engine, engine.server_args)) as client:
        body = {
            "input_ids": PROMPT,
            "sampling_params": {"temperature": 0, "max_new_tokens": 4},
            "return_routed_experts": True,
        }
        want = client.post("/generate", json=body).json()["meta_info"]["routed_experts"]
        completion = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        plain = client.post("/v1/completions", json=completion).json()
        assert "sgl_ext" not in plain["choices"][0]
        asked = {**completion, "return_routed_experts": True}
        r = client.post("/v1/completions", json=asked)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["sgl_ext"]["routed_experts"] == want
        chunks = _sse(client.post("/v1/completions", json={**asked, "stream": True}).text)
        finals = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
        assert [f["sgl_ext"]["routed_experts"] for f in finals] == [want]
        chat = {
            "messages": [{"role": "user", "content": "w5 w9 w30"}],
            "max_tokens": 3,
            "temperature": 0,
            "return_routed_experts": True,
            "routed_experts_start_len": 1,
        }
        r = client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        res = r.json()
        got = decode_routed_experts(
            res["choices"][0]["sgl_ext"]["routed_experts"], NUM_LAYERS, TOP_K
        )
        usage = res["usage"]
        assert got.shape[0] == usage["prompt_tokens"] + usage["completion_tokens"] - 1 - 1
        chunks = _sse(client.post("/v1/chat/completions", json={**chat, "stream": True}).text)
        finals = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
        assert [f["sgl_ext"]["routed_experts"] for f in finals] == [
            res["choices"][0]["sgl_ext"]["routed_experts"]
        ]


def test_refused_while_the_flag_is_off(moe_model: tuple[Path, torch.nn.Module]) -> None:
    from fastapi.testclient import TestClient

    from radixserve import Engine
    from radixserve.entrypoints.http_server import create_app
    from radixserve.errors import InvalidRequestError

    eng = Engine(
        runtime="thread",
        model_path=str(moe_model[0]),
        dtype="float32",
        skip_tokenizer_init=True,
        max_total_tokens=512,
        skip_server_warmup=True,
    )
    try:
        with pytest.raises(InvalidRequestError, match="--enable-return-routed-experts"):
            eng.generate(input_ids=PROMPT, sampling_params=GREEDY, return_routed_experts=True)
        with TestClient(create_app(eng, eng.server_args)) as client:
            body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_routed_experts": True}
            r = client.post("/generate", json=body)
            assert r.status_code == 400
            assert "--enable-return-routed-experts" in r.text
    finally:
        eng.shutdown()


def test_refused_for_a_dense_model(tmp_path: Path) -> None:
    from radixserve import Engine

    make_tiny_checkpoint(tmp_path, "llama")
    with pytest.raises(Exception, match="has no MoE layers") as err:
        Engine(
            runtime="thread",
            model_path=str(tmp_path),
            dtype="float32",
            skip_tokenizer_init=True,
            max_total_tokens=256,
            enable_return_routed_experts=True,
        )
    assert "\n" not in str(err.value)


def test_the_one_call_cpp_layers_step_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On GGUF experts every layer runs in one C++ call (the layer chain; its single-row path
    at batch 1), which routes inside C++: a step that captures runs the layers module by
    module instead, with the same tokens, and its ids are the routing those modules took."""
    from radixserve import Engine
    from radixserve.kernels import build, ops
    from radixserve.kernels import gguf_types as gt
    from radixserve.layers.kquant_paths import KQUANT_INT8_ENV
    from radixserve.layers.moe import fused_moe, routed_capture
    from tests.helpers.tiny_gguf import write_block_moe_gguf
    from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

    if build.load_extension() is None:
        pytest.skip("C++ kernels unavailable")
    require_hf_arch("qwen3_moe")
    monkeypatch.setenv(KQUANT_INT8_ENV, "0")
    # K-quants need K to be a multiple of 256: hidden and the experts' size are 256.
    cfg = tiny_hf_config(
        "qwen3_moe",
        vocab_size=59,
        hidden_size=256,
        moe_intermediate_size=256,
        head_dim=64,
        norm_topk_prob=True,
    )
    types = {"ffn_gate_exps": gt.Q4_K, "ffn_up_exps": gt.Q8_0, "ffn_down_exps": gt.Q6_K}
    path = write_block_moe_gguf(
        tmp_path / "moe.gguf", tiny_hf_model(cfg), "qwen3moe", types, gt.Q8_0
    )
    chain_calls: list[bool] = []
    real_chain = ops.run_layer_chain
    monkeypatch.setattr(
        ops,
        "run_layer_chain",
        lambda *a: chain_calls.append(routed_capture.capturing()) or real_chain(*a),
    )
    routed: list[torch.Tensor] = []  # each Python routing while capturing, in call order
    real_route = fused_moe.route

    def spy(*args: Any, **kwargs: Any) -> Any:
        routing = real_route(*args, **kwargs)
        if routed_capture.capturing():
            routed.append(routing.experts.clone())
        return routing

    monkeypatch.setattr(fused_moe, "route", spy)
    prompt = [1, 5, 9, 30, 12, 7]
    with Engine(
        model_path=str(path),
        runtime="thread",
        dtype="float32",
        max_total_tokens=1024,
        attention_backend="intel_amx",
        quantization="gguf",
        skip_tokenizer_init=True,
        enable_return_routed_experts=True,
    ) as eng:
        plain = eng.generate(input_ids=prompt, sampling_params=GREEDY)
        assert chain_calls and not any(chain_calls)  # the chain ran every plain step
        chain_calls.clear()
        asked = eng.generate(input_ids=prompt, sampling_params=GREEDY, return_routed_experts=True)
    assert not chain_calls  # no capturing step went through the chain
    assert asked["output_ids"] == plain["output_ids"]
    layers = cfg.num_hidden_layers
    got = decode_routed_experts(asked["meta_info"]["routed_experts"], layers, TOP_K)
    # One prefill step, then one decode step per token but the last: layer after layer.
    steps = [torch.stack(routed[i : i + layers], dim=1) for i in range(0, len(routed), layers)]
    assert np.array_equal(got, torch.cat(steps).numpy())
    assert got.shape[0] == len(prompt) + GREEDY["max_new_tokens"] - 1


def test_the_flag_is_accepted() -> None:
    from radixserve.server_args import ServerArgs

    assert ServerArgs.from_kwargs(enable_return_routed_experts=True).enable_return_routed_experts


@pytest.mark.parametrize(("kwargs", "conflict"), [({"pp_size": 2}, "--pp-size")])
def test_the_flag_refuses_steps_it_cannot_capture(kwargs: dict[str, Any], conflict: str) -> None:
    from radixserve.options.errors import ServerArgsError
    from radixserve.server_args import ServerArgs

    with pytest.raises(ServerArgsError, match="--enable-return-routed-experts") as err:
        ServerArgs.from_kwargs(enable_return_routed_experts=True, **kwargs)
    assert conflict in str(err.value)


def test_retracted_requests_recompute_their_ids(moe_model: tuple[Path, torch.nn.Module]) -> None:
    """A KV pool too small for every request at once: retracted requests are re-prefilled and
    their rows routed again; each ends with the ids transformers' routers pick."""
    from radixserve import Engine

    hf = moe_model[1]
    prompts = [[3 + i, *range(10 + i, 40 + i)] for i in range(6)]
    with Engine(
        model_path=str(moe_model[0]),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=160,
        page_size=4,
        enable_return_routed_experts=True,
    ) as eng:
        outs = eng.generate(
            input_ids=prompts,
            sampling_params={"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},
            return_routed_experts=True,
        )
    assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0
    for prompt, out in zip(prompts, outs, strict=True):
        tokens = prompt + out["output_ids"][:-1]
        got = decode_routed_experts(out["meta_info"]["routed_experts"], NUM_LAYERS, TOP_K)
        assert np.array_equal(got, transformers_experts(hf, tokens))


def test_an_aborted_request_frees_its_ids(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc
    import time
    import weakref

    made: list[weakref.ref[RoutedExpertsRecord]] = []
    real_init = RoutedExpertsRecord.__init__

    def tracked(self: RoutedExpertsRecord) -> None:
        real_init(self)
        made.append(weakref.ref(self))

    monkeypatch.setattr(RoutedExpertsRecord, "__init__", tracked)
    stream = engine.generate(
        input_ids=PROMPT,
        sampling_params={"temperature": 0, "max_new_tokens": 400, "ignore_eos": True},
        stream=True,
        return_routed_experts=True,
    )
    next(stream)
    stream.close()  # the consumer stops early: the engine aborts the request
    deadline = time.monotonic() + 30
    while engine.scheduler._live_reqs() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.scheduler._live_reqs()
    gc.collect()
    assert made and all(ref() is None for ref in made)


def hf_gate_experts(hf: torch.nn.Module, tokens: list[int], top_k: int) -> np.ndarray:
    """[tokens, layers, top_k]: the expert ids each HF MoE block's router returns (its
    output's last element), -1 in layers without one."""
    layers = hf.model.layers
    want = np.full((len(tokens), len(layers), top_k), -1, dtype=np.int32)
    hooks = []
    for i, layer in enumerate(layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(layer.mlp, "experts"):

            def keep(_m: Any, _i: Any, out: Any, i: int = i) -> None:
                want[:, i] = out[-1].reshape(len(tokens), top_k).numpy()

            hooks.append(gate.register_forward_hook(keep))
    try:
        with torch.no_grad():
            hf(torch.tensor([tokens]))
    finally:
        for hook in hooks:
            hook.remove()
    return want


@pytest.mark.parametrize("arch", ["olmoe", "mixtral", "qwen2_moe", "deepseek_v2"])
def test_other_moe_families(arch: str, tmp_path: Path) -> None:
    """Other routers (OLMoE's, Mixtral's, a shared expert beside them, DeepSeek-V2's
    grouped top-k with a first dense layer): the ids transformers' routers return."""
    from radixserve import Engine

    require_hf_arch(arch)
    hf = make_tiny_checkpoint(tmp_path, arch)
    with Engine(
        model_path=str(tmp_path),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=256,
        enable_return_routed_experts=True,
    ) as eng:
        out = eng.generate(input_ids=PROMPT, sampling_params=GREEDY, return_routed_experts=True)
    layers = hf.config.num_hidden_layers
    got = decode_routed_experts(out["meta_info"]["routed_experts"], layers, TOP_K)
    want = hf_gate_experts(hf, PROMPT + out["output_ids"][:-1], TOP_K)
    assert np.array_equal(got, want)


def test_capturing_steps_skip_the_compiled_decode_graphs() -> None:
    """--enable-torch-compile: the graphs run the experts inside, where nothing reports, so
    a decode step that captures runs eagerly (one that does not keeps its graph)."""
    from types import SimpleNamespace

    from radixserve.model_executor.model_runner import ModelRunner
    from radixserve.model_executor.step_io import StepInputs

    runner = SimpleNamespace(
        compiled_decode=SimpleNamespace(bucket=lambda n: 8),
        capture_final=False,
        capture_layers=(),
    )
    step = StepInputs(True, [5], [7], [0], [7], [1], torch.zeros(1, dtype=torch.int64), [0])
    assert ModelRunner._compiled_bucket(runner, step) == 8  # type: ignore[arg-type]
    step = step._replace(capture_routing=True)
    assert ModelRunner._compiled_bucket(runner, step) is None  # type: ignore[arg-type]


def test_two_tensor_parallel_ranks(moe_model: tuple[Path, torch.nn.Module]) -> None:
    """--tp-size 2 in processes: rank 0 captures (every rank routes every row alike) and the
    ids cross to the API process in the final output."""
    from radixserve import Engine

    folder, hf = moe_model
    with Engine(
        model_path=str(folder),
        tp_size=2,
        dist_timeout=20,
        dtype="float32",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        max_total_tokens=512,
        enable_return_routed_experts=True,
    ) as eng:
        out = eng.generate(input_ids=PROMPT, sampling_params=GREEDY, return_routed_experts=True)
    got = decode_routed_experts(out["meta_info"]["routed_experts"], NUM_LAYERS, TOP_K)
    assert np.array_equal(got, transformers_experts(hf, PROMPT + out["output_ids"][:-1]))


@pytest.mark.parametrize("tree", [False, True], ids=["chains", "trees"])
def test_speculative_rounds_return_the_verified_tokens_ids(
    moe_model: tuple[Path, torch.nn.Module], tree: bool
) -> None:
    """NGRAM verify rounds run drafts that are not kept: only the positions that are (the last
    token and the accepted drafts) are recorded, so the ids are transformers' routers' over the
    request's own tokens, as without speculation; a request that stops inside its accepted
    drafts (a stop token) returns no rows past its end."""
    from radixserve import Engine

    hf = moe_model[1]
    prompt = [3, 5, 9, 3, 5, 9, 3, 5, 9, 3, 5]  # repeats: the n-gram cache drafts "9 3 5 ..."
    extra = {} if tree else {"speculative_ngram_max_bfs_breadth": 1}
    with Engine(
        runtime="thread",
        model_path=str(moe_model[0]),
        dtype="float32",
        max_total_tokens=1024,
        enable_return_routed_experts=True,
        speculative_algorithm="NGRAM",
        speculative_num_draft_tokens=6,
        skip_server_warmup=True,
        **extra,
    ) as eng:
        eng.scheduler.check_kv_each_step = True
        greedy = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
        full = eng.generate(input_ids=prompt, sampling_params=greedy, return_routed_experts=True)
        assert full["meta_info"]["spec_accept_token_num"] > 0
        # A stop string ends the request inside a round's accepted tokens (a stop token would
        # end the acceptance itself): the text ("w<id>") of the first token that first appears
        # a few tokens in.
        ids = full["output_ids"]
        stop = next(f"w{t} " for i, t in enumerate(ids) if i >= 3 and t not in ids[:i])
        short = eng.generate(
            input_ids=prompt,
            sampling_params={**greedy, "stop": [stop]},
            return_routed_experts=True,
        )
        assert len(short["output_ids"]) < len(full["output_ids"])
        for out in (full, short):
            got = decode_routed_experts(out["meta_info"]["routed_experts"], NUM_LAYERS, TOP_K)
            tokens = prompt + out["output_ids"][:-1]
            assert got.shape == (len(tokens), NUM_LAYERS, TOP_K)
            assert np.array_equal(got, transformers_experts(hf, tokens))
