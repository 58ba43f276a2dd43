"""What a newcomer sees first: `/` points somewhere useful, /health shows a body, FastAPI's
/docs and /openapi.json exist (one operation id per route and method), and /v1/models says
who serves the model."""

from __future__ import annotations

import warnings

from tests.unit.test_http_fakes import MODEL, make_client


def test_root_points_to_docs_api_and_health() -> None:
    with make_client() as (client, _):
        r = client.get("/")
        assert r.status_code == 200
        body = r.json()
        assert body["name"] == "radixserve"
        for key, path in (("docs", "/docs"), ("openai_api", "/v1"), ("health", "/health")):
            assert body[key] == path
            assert client.get(path if key != "openai_api" else "/v1/models").status_code == 200


def test_health_answers_with_a_small_body() -> None:
    with make_client() as (client, _):
        r = client.get("/health")
        assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_openapi_document_lists_the_routes_without_duplicate_ids() -> None:
    with make_client() as (client, _), warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI warns on duplicate operation ids
        spec = client.get("/openapi.json").json()
        assert "swagger" in client.get("/docs").text.lower()
    paths = spec["paths"]
    assert {"post", "put"} <= set(paths["/generate"])
    assert "post" in paths["/v1/chat/completions"] and "get" in paths["/v1/models"]
    ids = [op["operationId"] for item in paths.values() for op in item.values()]
    assert len(ids) == len(set(ids))


def test_models_are_owned_by_radixserve() -> None:
    with make_client() as (client, _):
        (model,) = client.get("/v1/models").json()["data"]
    assert model["id"] == MODEL and model["owned_by"] == "radixserve"


# Runtime-control routes SGLang serves on GET and POST alike, each with a JSON body.
_GET_OR_POST_BODIES = (
    "/open_session",
    "/close_session",
    "/get_weights_by_name",
    "/release_memory_occupation",
    "/resume_memory_occupation",
)


def test_openapi_document_describes_every_json_body() -> None:
    """The routes read their bodies themselves; /openapi.json still documents each body, and
    the documented schemas accept what the server accepts and refuse unknown sampling keys."""
    import jsonschema

    with make_client() as (client, _):
        spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    bodies = {
        (path, method): op["requestBody"]["content"]["application/json"]["schema"]
        for path, item in paths.items()
        for method, op in item.items()
        if "requestBody" in op
    }
    expected = {
        ("/generate", "post"),
        ("/generate", "put"),
        ("/encode", "post"),
        ("/encode", "put"),
        ("/abort_request", "post"),
        ("/pause_generation", "post"),
        ("/update_weights_from_disk", "post"),
        *((path, method) for path in _GET_OR_POST_BODIES for method in ("get", "post")),
        ("/v1/completions", "post"),
        ("/v1/chat/completions", "post"),
        ("/v1/responses", "post"),
        ("/v1/embeddings", "post"),
        ("/v1/tokenize", "post"),
        ("/v1/detokenize", "post"),
    }
    assert set(bodies) == expected
    assert "$ref" not in str(bodies)  # every schema stands alone
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    jsonschema.validate(chat, bodies[("/v1/chat/completions", "post")])
    generate = bodies[("/generate", "post")]
    jsonschema.validate({"text": "Hi", "sampling_params": {"max_new_tokens": 4}}, generate)
    # /v1/tokenize takes a prompt or chat messages (as SGLang's), and the schema says both.
    tokenize = bodies[("/v1/tokenize", "post")]
    jsonschema.validate({"prompt": "Hi"}, tokenize)
    jsonschema.validate({"messages": [{"role": "user", "content": "Hi"}]}, tokenize)
    for bad in (
        {"text": "Hi", "input_ids": [1]},  # one input, not both
        {"text": "Hi", "sampling_params": {"no_such_key": 1}},
        {"messages": []},
        {"add_special_tokens": True},  # /v1/tokenize: neither a prompt nor messages
    ):
        if "add_special_tokens" in bad:
            schema = tokenize
        elif "messages" in bad:
            schema = bodies[("/v1/chat/completions", "post")]
        else:
            schema = generate
        try:
            jsonschema.validate(bad, schema)
        except jsonschema.ValidationError:
            continue
        raise AssertionError(f"the schema accepts {bad}")


def test_served_name_defaults_to_the_folder_name_and_the_path_still_works(tmp_path) -> None:
    from radixserve.options.resolve import default_served_model_name

    folder = tmp_path / "my-model"
    folder.mkdir()
    (tmp_path / "tiny.Q8_0.gguf").write_bytes(b"GGUF")
    typed = f"{folder}/"
    assert default_served_model_name(typed) == "my-model"
    assert default_served_model_name(str(tmp_path / "tiny.Q8_0.gguf")) == "tiny.Q8_0"
    assert default_served_model_name("org/hub-model") == "org/hub-model"  # not a local path

    with make_client(model_path=typed, tokenizer_path=typed, served_model_name="my-model") as (
        client,
        _,
    ):
        models = client.get("/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["my-model"]
        assert str(tmp_path) not in client.get("/v1/models").text
        for name in ("my-model", typed, str(folder)):  # SGLang clients send the path
            r = client.post("/v1/completions", json={"model": name, "prompt": "Hi"})
            assert r.status_code == 200, name
            assert r.json()["model"] == "my-model"
        # Another name is served by the loaded model too, as SGLang does.
        r = client.post("/v1/completions", json={"model": "other", "prompt": "Hi"})
        assert r.status_code == 200 and r.json()["model"] == "my-model"

    # An explicit --served-model-name is the name answered; the path is served as well.
    with make_client(model_path=typed, tokenizer_path=typed, served_model_name="alias") as (
        client,
        _,
    ):
        r = client.post("/v1/completions", json={"model": typed, "prompt": "Hi"})
        assert r.status_code == 200 and r.json()["model"] == "alias"
