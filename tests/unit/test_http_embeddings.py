"""/v1/embeddings and /encode on a real (tiny, in-process) embedding engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from radixserve import Engine
from radixserve.entrypoints.http_server import create_app
from tests.unit.tiny_model import write_tiny_llama


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    model_dir = write_tiny_llama(tmp_path_factory.mktemp("tiny-embed"))
    engine = Engine(
        runtime="thread",
        model_path=str(model_dir),
        load_format="dummy",
        dtype="float32",
        skip_tokenizer_init=True,
        is_embedding=True,
        max_total_tokens=2048,
        random_seed=0,
    )
    with TestClient(create_app(engine, engine.server_args)) as test_client:
        yield test_client
    engine.shutdown()


def test_openai_embeddings_route(client: TestClient) -> None:
    r = client.post("/v1/embeddings", json={"input": [[5, 6, 7], [8, 9]], "model": None})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(len(d["embedding"]) == 64 for d in body["data"])
    assert body["usage"]["prompt_tokens"] == 5


def test_native_encode_route_and_generate_refused(client: TestClient) -> None:
    r = client.post("/encode", json={"input_ids": [5, 6, 7]})
    assert r.status_code == 200, r.text
    assert len(r.json()["embedding"]) == 64
    g = client.post("/generate", json={"input_ids": [5, 6], "sampling_params": {}})
    assert g.status_code == 400
    assert "embedding" in g.json()["error"]["message"]
