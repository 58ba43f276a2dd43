"""Schemathesis against the real server's /openapi.json (slow): the in-process fuzz of
tests/unit/test_http_schema_fuzz.py with more cases per route, the real tokenizer, sampling
and grammar backends (regex, JSON schema and EBNF strings reach the compilers), over HTTP."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.e2e.e2e_server import start_server
from tests.unit.test_http_schema_fuzz import check_response, response_json

pytestmark = pytest.mark.slow
# Cases per generation mode, spread over every route and method by hypothesis.
EXAMPLES = 100


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_real_server_no_5xx_and_every_4xx_in_openai_shape(mode: GenerationMode) -> None:
    # A short context keeps the valid generations (SGLang's default is 128 new tokens) quick.
    proc = start_server("--max-total-tokens", "4096", "--context-length", "256")
    try:
        # schemathesis' pytest loaders need the schema at import time or a fixture its lazy
        # loader cannot run under this pytest; a hypothesis test over the whole schema needs
        # neither, and the server starts only when this slow test runs.
        schema = schemathesis.openapi.from_url(f"{proc.base_url}/openapi.json")

        @given(case=schema.as_strategy(mode))
        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: Any) -> None:
            response = case.call(timeout=120)
            where = f"{case.method} {case.formatted_path} body={case.body!r}"
            check_response(response.status_code, response_json(response), where)

        fuzz()
        assert proc.proc.poll() is None, proc.logs()
    finally:
        proc.stop(signal.SIGKILL)
