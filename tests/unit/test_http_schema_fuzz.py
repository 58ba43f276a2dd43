"""Schemathesis against /openapi.json (issue 11): every documented route and method gets
generated bodies, valid and invalid by the schema; none may get a 5xx, and every 4xx must carry
OpenAI's error body `{"error": {"message", "type", "param", "code"}}`.

The app runs in-process on the fake engine of test_http_fakes.py, so a few hundred requests
take seconds; examples are derandomized (the same cases every run) and bounded per route. The
slow variant in tests/e2e/test_http_e2e_schema_fuzz.py sends more of them to the real server.
"""

from __future__ import annotations

import time
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.python import asgi

from radixserve.entrypoints.http_server import create_app
from radixserve.managers.tokenizer_manager import TokenizerManager
from tests.unit.test_http_fakes import VOCAB, FakeEngine, server_args

EXAMPLES_PER_ROUTE = 20
# SGLang's default max_new_tokens is 128: on the fakes' 128-token context every generated body
# without its own small limit would stop at the length check, never reaching generation.
FUZZ_CONTEXT = 4096


def fuzz_engine() -> FakeEngine:
    engine = FakeEngine()
    engine.model_info.context_len = FUZZ_CONTEXT
    engine.tokenizer_manager = TokenizerManager(engine.tokenizer, VOCAB, FUZZ_CONTEXT)
    return engine


def check_response(status: int, body: Any, where: str) -> None:
    """No 5xx; a 4xx has exactly OpenAI's error body, with the status as its code."""
    assert status < 500, f"{where}: {status} {body!r}"
    if 400 <= status < 500:
        assert isinstance(body, dict) and set(body) == {"error"}, f"{where}: {body!r}"
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"}, f"{where}: {body!r}"
        assert err["code"] == status and isinstance(err["message"], str) and err["message"]
        assert isinstance(err["type"], str) and (
            err["param"] is None or isinstance(err["param"], str)
        )
        assert "Traceback" not in err["message"], f"{where}: {body!r}"


def response_json(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def load_schema() -> Any:
    app = create_app(fuzz_engine(), server_args())
    loaded = schemathesis.openapi.from_asgi("/openapi.json", app)
    # The lifespan (started by the loader) marks the server ready from a task; wait for it so
    # that no case meets the 503 of a server still starting.
    with asgi.get_client(app) as client:
        deadline = time.monotonic() + 10
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the in-process app never became ready"
            time.sleep(0.01)
    return loaded


# Built at import: schemathesis makes one test per route and method from it. (Its lazy
# from_fixture loader does not run under this pytest.)
schema = load_schema()


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_ROUTE,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_5xx_and_every_4xx_in_openai_shape(case: Any) -> None:
    response = case.call(timeout=10)
    where = f"{case.method} {case.formatted_path} body={case.body!r}"
    check_response(response.status_code, response_json(response), where)
