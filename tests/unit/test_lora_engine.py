"""Multi-LoRA on a tiny random Llama (fast): each PEFT adapter's greedy output equals HF
transformers + PEFT token for token (float32), alone and with two adapters and the base model in
one batch; adapters never share cached prefixes; bad adapters are refused with clear errors;
runtime load/unload; unloading an adapter in use waits for its requests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")

from radixserve import Engine
from radixserve.lora.config import LoRAError
from tests.helpers.hf_reference import hf_greedy
from tests.helpers.lora_adapters import AdapterRef, make_peft_adapter
from tests.helpers.tiny_models import make_tiny_checkpoint, save_word_tokenizer
from tests.unit.test_http_errors import assert_error

MAX_NEW = 8
PROMPTS = [[1, 17, 42, 99, 5, 63], [1, 200, 201, 7], [1, 17, 42, 99, 5, 63, 8, 9, 11]]
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True}


class Setup:
    def __init__(self, root: Path) -> None:
        self.model_dir = root / "model"
        self.hf = make_tiny_checkpoint(self.model_dir)
        save_word_tokenizer(self.model_dir)
        self.adapter_dir = root / "adapters"
        self.base = [hf_greedy(self.hf, p, MAX_NEW) for p in PROMPTS]
        self.a: AdapterRef = make_peft_adapter(
            self.hf, self.adapter_dir / "a", PROMPTS, MAX_NEW, rank=4, seed=1, scale=0.3
        )
        self.b: AdapterRef = make_peft_adapter(
            self.hf,
            self.adapter_dir / "b",
            PROMPTS,
            MAX_NEW,
            rank=8,
            alpha=8,
            seed=2,
            scale=0.3,
            targets=("q_proj", "v_proj", "down_proj"),
        )
        self.c: AdapterRef = make_peft_adapter(
            self.hf,
            self.adapter_dir / "c",
            PROMPTS,
            MAX_NEW,
            rank=2,
            seed=3,
            scale=0.3,
            use_rslora=True,
            targets=("k_proj", "o_proj", "up_proj", "gate_proj"),
        )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    s = Setup(tmp_path_factory.mktemp("lora"))
    # The adapters really change the output (else the checks below prove little).
    assert s.a.greedy != s.base and s.b.greedy != s.base and s.c.greedy != s.base
    return s


def _engine(setup: Setup, **kwargs: Any) -> Engine:
    options: dict[str, Any] = {
        "model_path": str(setup.model_dir),
        "runtime": "thread",
        "dtype": "float32",
        "max_total_tokens": 2048,
        "attention_backend": "torch_native",
        "lora_paths": [f"a={setup.a.path}", f"b={setup.b.path}"],
        "max_loras_per_batch": 2,
    }
    options.update(kwargs)
    engine = Engine(**options)
    engine.scheduler.check_kv_each_step = True
    return engine


@pytest.fixture(scope="module")
def engine(setup: Setup) -> Iterator[Engine]:
    eng = _engine(setup)
    yield eng
    eng.shutdown()


def _ids(out: Any) -> list[list[int]]:
    return [o["output_ids"] for o in out]


def test_each_adapter_alone_equals_peft(engine: Engine, setup: Setup) -> None:
    for name, ref in (("a", setup.a.greedy), ("b", setup.b.greedy), (None, setup.base)):
        got = [
            engine.generate(input_ids=p, sampling_params=GREEDY, lora_path=name)["output_ids"]
            for p in PROMPTS
        ]
        assert got == ref, name


def test_mixed_batch_two_adapters_and_base(engine: Engine, setup: Setup) -> None:
    """One call, one batch: every prompt under a, b and the base model."""
    prompts = PROMPTS * 3
    names = ["a"] * 3 + ["b"] * 3 + [None] * 3
    got = _ids(engine.generate(input_ids=prompts, sampling_params=GREEDY, lora_path=names))
    assert got == setup.a.greedy + setup.b.greedy + setup.base


def test_adapters_never_share_cached_prefixes(engine: Engine, setup: Setup) -> None:
    """The same prompt, cached under the base model, then asked under adapters a and b: each
    answer stays the adapter's own, and no adapter request is served from the base's KV."""
    engine.flush_cache()
    prompt = PROMPTS[2]
    base = engine.generate(input_ids=prompt, sampling_params=GREEDY)
    assert base["output_ids"] == setup.base[2]
    for name, ref in (("a", setup.a.greedy[2]), ("b", setup.b.greedy[2])):
        out = engine.generate(input_ids=prompt, sampling_params=GREEDY, lora_path=name)
        assert out["output_ids"] == ref
        assert out["meta_info"]["cached_tokens"] == 0
    again = engine.generate(input_ids=prompt, sampling_params=GREEDY, lora_path="a")
    assert again["output_ids"] == setup.a.greedy[2]
    assert again["meta_info"]["cached_tokens"] > 0  # its own namespace is cached


def test_runtime_load_unload_and_slot_eviction(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A third adapter loaded at run time with 2 slots: batches rotate adapters through the
    slots (fifo), outputs stay exact; unload frees the name; a reload gets a fresh namespace."""
    monkeypatch.setenv("RADIXSERVE_LORA_DIRS", str(setup.adapter_dir))
    eng = _engine(setup, lora_eviction_policy="fifo")
    try:
        info = eng.load_lora_adapter("c", str(setup.c.path))
        assert info["success"] and set(info["loaded_adapters"]) == {"a", "b", "c"}
        prompts = PROMPTS * 3
        names = ["c"] * 3 + ["a"] * 3 + ["b"] * 3
        # Three adapters, two per batch: the scheduler splits them over batches.
        got = _ids(eng.generate(input_ids=prompts, sampling_params=GREEDY, lora_path=names))
        assert got == setup.c.greedy + setup.a.greedy + setup.b.greedy
        assert len(eng.scheduler.runner.lora.slots.resident()) == 2
        eng.unload_lora_adapter("c")
        with pytest.raises(LoRAError, match="not loaded"):
            eng.generate(input_ids=PROMPTS[0], sampling_params=GREEDY, lora_path="c")
        eng.load_lora_adapter("c", str(setup.c.path))
        out = eng.generate(input_ids=PROMPTS[0], sampling_params=GREEDY, lora_path="c")
        assert out["output_ids"] == setup.c.greedy[0]
    finally:
        eng.shutdown()


def test_unload_waits_for_requests_using_the_adapter(
    engine: Engine, setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RADIXSERVE_LORA_DIRS", str(setup.adapter_dir))
    engine.lora.allowed_dirs = (setup.adapter_dir.resolve(),)
    engine.load_lora_adapter("slow", str(setup.a.path))
    long = {"temperature": 0, "max_new_tokens": 150, "ignore_eos": True}
    result: dict[str, Any] = {}

    def run() -> None:
        result["out"] = engine.generate(
            input_ids=PROMPTS[0], sampling_params=long, lora_path="slow"
        )

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 30
    while not any(r.lora_id for r in engine.scheduler.running) and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(LoRAError, match="still in use"):
        engine.unload_lora_adapter("slow", wait_s=0.05)
    engine.unload_lora_adapter("slow")  # waits for the request to finish
    worker.join(timeout=60)
    out = result["out"]
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert out["output_ids"][:MAX_NEW] == setup.a.greedy[0]


def _write_adapter(folder: Path, config: dict[str, Any], tensors: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("missing", "no adapter folder"),
        ("rank", "above the server's --max-lora-rank"),
        ("target", "outside the server's --lora-target-modules"),
        ("shape", "does not fit this model"),
        ("unknown", "not a LoRA A/B matrix"),
        ("dora", "DoRA"),
    ],
)
def test_bad_adapters_are_refused(setup: Setup, tmp_path: Path, case: str, match: str) -> None:
    import torch

    prefix = "base_model.model.model.layers.0"
    cfg = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    a, b = torch.randn(4, 64), torch.randn(64, 4)
    tensors = {
        f"{prefix}.self_attn.q_proj.lora_A.weight": a,
        f"{prefix}.self_attn.q_proj.lora_B.weight": b,
    }
    if case == "rank":
        cfg["r"] = 16
        tensors = {
            k: torch.randn(16, 64) if "lora_A" in k else torch.randn(64, 16) for k in tensors
        }
    elif case == "target":
        tensors = {
            k.replace("self_attn.q_proj", "mlp.down_proj"): torch.randn(4, 128)
            if "lora_A" in k
            else torch.randn(64, 4)
            for k in tensors
        }
    elif case == "shape":
        tensors[f"{prefix}.self_attn.q_proj.lora_A.weight"] = torch.randn(4, 96)
    elif case == "unknown":
        tensors[f"{prefix}.self_attn.q_proj.magnitude.weight"] = torch.randn(64)
    elif case == "dora":
        cfg["use_dora"] = True
    folder = tmp_path / "bad"
    if case != "missing":
        _write_adapter(folder, cfg, tensors)
    eng = _engine(
        setup,
        lora_paths=None,
        enable_lora=True,
        max_lora_rank=8,
        lora_target_modules=["qkv_proj", "o_proj"],
    )
    try:
        eng.lora.allowed_dirs = (tmp_path.resolve(),)
        with pytest.raises(LoRAError, match=match):
            eng.load_lora_adapter("bad", str(folder))
        assert eng.lora.refs() == []
        # The server still serves the base model.
        out = eng.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
        assert out["output_ids"] == setup.base[0]
    finally:
        eng.shutdown()


def test_paths_outside_the_allowed_folders_are_refused(
    engine: Engine, setup: Setup, tmp_path: Path
) -> None:
    engine.lora.allowed_dirs = (setup.adapter_dir.resolve(),)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    link = setup.adapter_dir / "escape"
    link.symlink_to(outside)
    for path in (str(outside), str(setup.adapter_dir / ".." / "model"), str(link), "/etc"):
        with pytest.raises(LoRAError, match="outside the folders") as err:
            engine.load_lora_adapter("x", path)
        assert path not in str(err.value)
    link.unlink()


def test_unknown_adapter_name_is_a_client_error(engine: Engine) -> None:
    with pytest.raises(LoRAError, match="not loaded") as err:
        engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY, lora_path="nope")
    assert err.value.param == "lora_path"


# -- HTTP ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(engine: Engine, setup: Setup) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from radixserve.entrypoints.http_server import create_app

    app = create_app(engine, engine.server_args)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_http_native_lora_path_single_and_per_prompt(client: Any, setup: Setup) -> None:
    body = {"input_ids": PROMPTS[0], "sampling_params": GREEDY, "lora_path": "a"}
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == setup.a.greedy[0]
    body = {
        "input_ids": PROMPTS[:2] * 2,
        "sampling_params": GREEDY,
        "lora_path": ["a", "b", None, "b"],
    }
    got = [o["output_ids"] for o in client.post("/generate", json=body).json()]
    assert got == [setup.a.greedy[0], setup.b.greedy[1], setup.base[0], setup.b.greedy[1]]


def test_http_openai_model_names_the_adapter(client: Any, engine: Engine, setup: Setup) -> None:
    served = engine.server_args.served_model_name
    for model, want in (
        (f"{served}:b", setup.b.greedy[1]),
        ("b", setup.b.greedy[1]),
        (served, setup.base[1]),
    ):
        body = {
            "model": model,
            "prompt": PROMPTS[1],
            "max_tokens": MAX_NEW,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == served
        assert r.json()["choices"][0]["text"] == engine.tokenizer.decode(want)
    # An explicit lora_path wins over the model field, as in SGLang.
    body = {
        "model": "b",
        "prompt": [PROMPTS[0], PROMPTS[1]],
        "max_tokens": 2,
        "temperature": 0,
        "lora_path": ["a", None],
    }
    assert client.post("/v1/completions", json=body).status_code == 200
    assert_error(
        client.post("/v1/completions", json={**body, "lora_path": ["a"]}), 400, "lora_path"
    )
    body = {"model": f"{served}:zzz", "prompt": PROMPTS[0], "max_tokens": 2}
    assert_error(client.post("/v1/completions", json=body), 400, "model")
    body = {"prompt": PROMPTS[0], "max_tokens": 2, "lora_path": "zzz"}
    assert_error(client.post("/v1/completions", json=body), 400, "lora_path")
    assert_error(
        client.post("/generate", json={"input_ids": PROMPTS[0], "lora_path": "zzz"}),
        400,
        "lora_path",
    )
    # SGLang reads the adapter after the colon whatever the base name is (served as "a").
    body = {"model": "other-model:a", "prompt": PROMPTS[0], "max_tokens": 2}
    assert client.post("/v1/completions", json=body).status_code == 200


def test_http_models_list_adapters(client: Any, engine: Engine) -> None:
    served = engine.server_args.served_model_name
    cards = client.get("/v1/models").json()["data"]
    assert [c["id"] for c in cards][:3] == [served, "a", "b"]
    assert all(c["parent"] == served and c["root"] == c["id"] for c in cards[1:])
    assert client.get("/v1/models/a").json()["id"] == "a"


def test_http_load_and_unload_routes(
    client: Any, engine: Engine, setup: Setup, tmp_path: Path
) -> None:
    engine.lora.allowed_dirs = (setup.adapter_dir.resolve(),)
    r = client.post("/load_lora_adapter", json={"lora_name": "c", "lora_path": str(setup.c.path)})
    assert r.status_code == 200, r.text
    assert r.json()["success"] is True and "c" in r.json()["loaded_adapters"]
    assert "c" in [m["id"] for m in client.get("/v1/models").json()["data"]]
    body = {"input_ids": PROMPTS[2], "sampling_params": GREEDY, "lora_path": "c"}
    assert client.post("/generate", json=body).json()["output_ids"] == setup.c.greedy[2]
    # Refusals: a name taken, a missing folder, a path outside the allowed folders, bad JSON.
    again = {"lora_name": "c", "lora_path": str(setup.c.path)}
    assert_error(client.post("/load_lora_adapter", json=again), 400, "lora_name")
    missing = {"lora_name": "m", "lora_path": str(setup.adapter_dir / "nope")}
    assert_error(client.post("/load_lora_adapter", json=missing), 400, "lora_path")
    outside = {"lora_name": "o", "lora_path": "../../../../etc"}
    err = assert_error(client.post("/load_lora_adapter", json=outside), 400, "lora_path")
    assert "etc" not in err["message"]
    assert_error(client.post("/load_lora_adapter", json={"lora_name": "x"}), 400)
    r = client.post("/unload_lora_adapter", json={"lora_name": "c"})
    assert r.status_code == 200 and "c" not in r.json()["loaded_adapters"]
    assert_error(client.post("/unload_lora_adapter", json={"lora_name": "c"}), 400, "lora_name")
    assert_error(client.post("/generate", json=body), 400, "lora_path")


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_other_llama_family_models(tmp_path: Path, arch: str) -> None:
    """Qwen2 (q/k/v biases) and Qwen3 (per-head q/k norms, head_dim apart from hidden/heads):
    an adapter on every projection, mixed with the base model in one batch, equals PEFT."""
    model_dir = tmp_path / "model"
    hf = make_tiny_checkpoint(model_dir, arch=arch)
    prompts = PROMPTS[:2]
    base = [hf_greedy(hf, p, MAX_NEW) for p in prompts]
    ref = make_peft_adapter(hf, tmp_path / "a", prompts, MAX_NEW, rank=4, seed=5, scale=0.3)
    assert ref.greedy != base
    eng = Engine(
        model_path=str(model_dir),
        runtime="thread",
        dtype="float32",
        skip_tokenizer_init=True,
        max_total_tokens=1024,
        lora_paths=[f"a={ref.path}"],
    )
    try:
        out = eng.generate(
            input_ids=prompts * 2, sampling_params=GREEDY, lora_path=["a", "a", None, None]
        )
        assert [o["output_ids"] for o in out] == ref.greedy + base
    finally:
        eng.shutdown()


def test_speculative_decoding_with_adapters(engine: Engine, setup: Setup) -> None:
    """NGRAM speculation on a batch mixing two adapters and the base model: each request's
    verify rows run under its adapter, so greedy output equals the plain LoRA engine's, with
    drafts accepted."""
    prompts = [[1, *range(10, 30)] * 3, [1, 7, 8, 9] * 8, PROMPTS[0], [1, *range(40, 52)] * 4]
    names = ["a", "b", None, "a"]
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    want = _ids(engine.generate(input_ids=prompts, sampling_params=params, lora_path=names))
    spec = _engine(setup, speculative_algorithm="NGRAM")
    try:
        out = spec.generate(input_ids=prompts, sampling_params=params, lora_path=names)
        assert _ids(out) == want
        assert sum(o["meta_info"]["spec_accept_token_num"] for o in out) > 0
        # One by one too: no neighbours under other adapters in the round.
        alone = spec.generate(input_ids=prompts[1], sampling_params=params, lora_path="b")
        assert alone["output_ids"] == want[1]
    finally:
        spec.shutdown()


def test_bench_serving_lora_name_runs_requests_under_the_adapters(
    engine: Engine, tmp_path: Path
) -> None:
    """SGLang's `bench_serving --lora-name`: each request names one of the adapters (native
    lora_path / OpenAI model) and is served; a name the server does not have fails every one."""
    from radixserve import bench_serving
    from radixserve.entrypoints.http_server import create_app
    from tests.helpers.thread_server import serve_app
    from tests.unit.test_bench_datasets import WordTokenizer

    with serve_app(create_app(engine, engine.server_args)) as base:
        for backend in ("sglang", "sglang-oai"):
            # An unknown name: /generate's explicit lora_path is refused; the OpenAI model field
            # only selects adapters it names, so the base model answers (as SGLang).
            unknown = 0 if backend == "sglang" else 4
            for names, completed in ((["a", "b"], 4), (["nope"], unknown)):
                args = bench_serving.build_parser().parse_args(
                    [
                        "--base-url", base, "--backend", backend, "--dataset-name", "random",
                        "--num-prompts", "4", "--random-input-len", "6",
                        "--random-output-len", "3", "--warmup-requests", "0",
                        "--disable-tqdm", "--lora-name", *names,
                        "--output-file", str(tmp_path / "out.jsonl"),
                    ]
                )  # fmt: skip
                result = bench_serving.run_benchmark(args, tokenizer=WordTokenizer())
                assert result["completed"] == completed, (backend, names)
