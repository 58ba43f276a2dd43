"""/update_weights_from_disk, /get_weights_by_name and /release_memory_occupation +
/resume_memory_occupation through HTTP on a real (tiny) engine."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from tests.unit.tiny_model import write_tiny_llama
from tests.unit.tiny_server import assert_kv_idle, tiny_client

PROMPT = [5, 17, 42, 99, 7, 311, 64, 8]
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
LONG = {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}
EMBED = "model.embed_tokens.weight"


def _save_hf_llama(folder: Path, seed: int, hidden: int = 64) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    write_tiny_llama(folder)
    config = LlamaConfig.from_pretrained(folder)
    config.hidden_size = hidden
    config.intermediate_size = 2 * hidden
    config.initializer_range = 0.5  # the default 0.02 makes a tiny model repeat one token
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights")
    return {
        "dummy": write_tiny_llama(root / "dummy"),
        "real": _save_hf_llama(root / "real", seed=1),
        "wider": _save_hf_llama(root / "wider", seed=2, hidden=96),
    }


def gen(client: TestClient, params: dict[str, Any] = GREEDY) -> dict[str, Any]:
    r = client.post("/generate", json={"input_ids": PROMPT, "sampling_params": params})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_update_weights_from_disk(dirs: dict[str, Path]) -> None:
    with tiny_client(dirs["real"], load_format="auto") as (ref, _):
        expected = gen(ref)["output_ids"]
        expected_rows = ref.post("/get_weights_by_name", json={"name": EMBED, "truncate_size": 2})
        assert expected_rows.status_code == 200
    with tiny_client(dirs["dummy"]) as (client, engine):
        before = gen(client)["output_ids"]
        assert before != expected
        r = client.post(
            "/update_weights_from_disk",
            json={"model_path": str(dirs["real"]), "weight_version": "v2"},
        )
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        assert gen(client)["output_ids"] == expected
        rows = client.post("/get_weights_by_name", json={"name": EMBED, "truncate_size": 2}).json()
        assert rows == expected_rows.json() and len(rows) == 2
        assert client.get("/model_info").json()["weight_version"] == "v2"
        # Another architecture's files (different shapes) are refused; the old weights stay.
        r = client.post("/update_weights_from_disk", json={"model_path": str(dirs["wider"])})
        assert r.status_code == 400 and "do not match" in r.json()["error"]["message"]
        outside = dirs["real"].parent.parent / "elsewhere"  # a model folder, but not beside it
        shutil.copytree(dirs["real"], outside, dirs_exist_ok=True)
        r = client.post("/update_weights_from_disk", json={"model_path": str(outside)})
        assert r.status_code == 400 and "RADIXSERVE_WEIGHT_DIRS" in r.text, r.text
        escape = str(dirs["real"].parent / ".." / "elsewhere")
        assert (
            client.post("/update_weights_from_disk", json={"model_path": escape}).status_code == 400
        )
        for bad in ("/no/such/dir", "../../../../etc/passwd", "/etc/shadow", "/etc"):
            r = client.post("/update_weights_from_disk", json={"model_path": bad})
            assert r.status_code == 400, r.text
            assert "etc" not in r.text and "such" not in r.text and ".." not in r.text
        assert gen(client)["output_ids"] == expected
        assert client.post("/update_weights_from_disk", json={}).status_code == 400
        assert client.post("/get_weights_by_name", json={"name": "nope"}).status_code == 400
        assert_kv_idle(engine)


@pytest.mark.parametrize("abort", [False, True])
def test_update_waits_for_running_requests_or_aborts_them(
    dirs: dict[str, Path], abort: bool
) -> None:
    with tiny_client(dirs["dummy"]) as (client, engine), ThreadPoolExecutor(2) as pool:
        expected = gen(client, LONG)["output_ids"]
        running = pool.submit(gen, client, LONG)
        while not engine.scheduler.running:
            time.sleep(0.01)
        r = client.post(
            "/update_weights_from_disk",
            json={
                "model_path": str(dirs["real"]),
                "load_format": "auto",
                "abort_all_requests": abort,
            },
        )
        assert r.status_code == 200 and r.json()["success"] is True
        result = running.result(timeout=60)
        if abort:
            assert result["meta_info"]["finish_reason"]["type"] == "abort"
        else:  # it finished on the old (dummy) weights: the swap waited for it
            assert result["output_ids"] == expected
            assert result["meta_info"]["finish_reason"]["type"] == "length"
        assert_kv_idle(engine)


def test_release_and_resume_memory(dirs: dict[str, Path]) -> None:
    with tiny_client(dirs["dummy"]) as (client, engine), ThreadPoolExecutor(2) as pool:
        expected = gen(client)["output_ids"]
        assert client.post("/release_memory_occupation", json={}).status_code == 200
        runner = engine.scheduler.runner
        assert runner.kv_cache is None and runner.model is None
        assert client.get("/server_info").json()["paused"] is True
        waiting = pool.submit(gen, client)
        time.sleep(0.3)
        assert not waiting.done()  # queued while the memory is gone
        r = client.post("/continue_generation")
        assert r.status_code == 400 and "resume_memory_occupation" in r.json()["error"]["message"]
        assert client.post("/resume_memory_occupation", json={"tags": ["bogus"]}).status_code == 400
        assert (
            client.post("/resume_memory_occupation", json={"tags": ["kv_cache"]}).status_code == 200
        )
        time.sleep(0.2)
        assert not waiting.done()  # the weights are still released
        assert client.post("/resume_memory_occupation", json={}).status_code == 200
        assert waiting.result(timeout=60)["output_ids"] == expected
        assert_kv_idle(engine)


def test_weight_routes_need_the_admin_key(dirs: dict[str, Path]) -> None:
    with tiny_client(dirs["dummy"], admin_api_key="adm") as (client, _):
        for path in (
            "/update_weights_from_disk",
            "/get_weights_by_name",
            "/release_memory_occupation",
            "/resume_memory_occupation",
        ):
            assert client.post(path, json={}).status_code == 401
        r = client.post(
            "/get_weights_by_name",
            json={"name": EMBED, "truncate_size": 1},
            headers={"Authorization": "Bearer adm"},
        )
        assert r.status_code == 200 and len(r.json()) == 1


def test_get_weights_of_a_quantized_layer_is_a_clear_400(dirs: dict[str, Path]) -> None:
    # w8a8_int8 keeps the projections as int8 blocks and frees their float weights: the route
    # must say so instead of answering an empty list.
    with tiny_client(dirs["real"], dtype="float32", quantization="w8a8_int8") as (client, _):
        name = "model.layers.0.mlp.down_proj.weight"
        r = client.post("/get_weights_by_name", json={"name": name, "truncate_size": 2})
        assert r.status_code == 400, r.text
        assert "w8a8_int8" in r.json()["error"]["message"]
        rows = client.post("/get_weights_by_name", json={"name": EMBED, "truncate_size": 2})
        assert rows.status_code == 200 and len(rows.json()) == 2


def _gguf_pair(root: Path) -> dict[str, Path]:
    """Two Q8_0 GGUF files of one tiny llama shape with different weights, and one wider."""
    from transformers import LlamaForCausalLM

    from tests.helpers.tiny_gguf import write_tiny_gguf
    from tests.helpers.tiny_models import tiny_hf_config

    files = {}
    for name, seed, hidden in (("a", 1, 64), ("b", 2, 64), ("wider", 3, 96)):
        cfg = tiny_hf_config(
            "llama", vocab_size=59, hidden_size=hidden, intermediate_size=2 * hidden
        )
        cfg.initializer_range = 0.5
        torch.manual_seed(seed)
        files[name] = write_tiny_gguf(root / f"{name}.gguf", LlamaForCausalLM(cfg).eval())
    return files


def test_update_weights_of_a_gguf_server_onto_blocks(tmp_path: Path) -> None:
    """Issue 31: the default model is a GGUF run on its blocks (--quantization gguf), and
    /update_weights_from_disk reloads another .gguf of the same architecture onto blocks."""
    files = _gguf_pair(tmp_path)
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    prompt = [5, 17, 42, 9, 7, 31, 6, 8]

    def gen_ids(client: TestClient) -> list[int]:
        r = client.post("/generate", json={"input_ids": prompt, "sampling_params": params})
        assert r.status_code == 200, r.text
        return list(r.json()["output_ids"])

    with tiny_client(files["b"], quantization="gguf", dtype="float32", load_format="auto") as (
        ref,
        _,
    ):
        expected = gen_ids(ref)
    with tiny_client(files["a"], quantization="gguf", dtype="float32", load_format="auto") as (
        client,
        engine,
    ):
        assert engine.server_args.quantization == "gguf"
        before = gen_ids(client)
        assert before != expected
        r = client.post("/update_weights_from_disk", json={"model_path": str(files["b"])})
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        assert gen_ids(client) == expected
        # The new weights run on their blocks too: a projection has no float values.
        name = "model.layers.0.mlp.down_proj.weight"
        r = client.post("/get_weights_by_name", json={"name": name, "truncate_size": 2})
        assert r.status_code == 400 and "gguf" in r.json()["error"]["message"], r.text
        # Another shape is refused and the served weights stay; so is a folder.
        r = client.post("/update_weights_from_disk", json={"model_path": str(files["wider"])})
        assert r.status_code == 400 and "do not match" in r.json()["error"]["message"], r.text
        r = client.post("/update_weights_from_disk", json={"model_path": str(tmp_path)})
        assert r.status_code == 400 and ".gguf file" in r.json()["error"]["message"], r.text
        assert gen_ids(client) == expected
        assert_kv_idle(engine)


def test_update_weights_of_a_w8a8_server_quantizes_the_new_weights(dirs: dict[str, Path]) -> None:
    quant = {"dtype": "float32", "quantization": "w8a8_int8"}
    with tiny_client(dirs["real"], load_format="auto", **quant) as (ref, _):
        expected = gen(ref)["output_ids"]
    with tiny_client(dirs["dummy"], **quant) as (client, engine):
        assert gen(client)["output_ids"] != expected
        r = client.post("/update_weights_from_disk", json={"model_path": str(dirs["real"])})
        assert r.status_code == 200, r.text
        assert gen(client)["output_ids"] == expected
        name = "model.layers.0.mlp.down_proj.weight"  # int8 blocks again, not float
        r = client.post("/get_weights_by_name", json={"name": name, "truncate_size": 2})
        assert r.status_code == 400 and "w8a8_int8" in r.json()["error"]["message"]
        assert_kv_idle(engine)
