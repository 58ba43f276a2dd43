"""--enable-custom-logit-processor with SGLang's serialized processors, through HTTP on a real
(tiny) engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.sampling.custom_logit_processor import CustomLogitProcessor
from tests.unit.tiny_model import write_tiny_llama
from tests.unit.tiny_server import assert_kv_idle, tiny_client

PROMPT = [5, 17, 42, 99, 7, 311, 64, 8]


class ForceToken(CustomLogitProcessor):
    """Every row may only produce its request's custom_params["token_id"]."""

    def __call__(self, logits: torch.Tensor, custom_param_list: Any = None) -> torch.Tensor:
        assert custom_param_list is not None
        out = torch.full_like(logits, float("-inf"))
        for row, params in enumerate(custom_param_list):
            assert params["__req__"].rid  # SGLang passes the request too
            out[row, params["token_id"]] = 0.0
        return out


class Broken(CustomLogitProcessor):
    def __call__(self, logits: torch.Tensor, custom_param_list: Any = None) -> torch.Tensor:
        raise RuntimeError("broken on purpose")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def body(processor: str | None, token: int | None = None, **params: Any) -> dict[str, Any]:
    sampling = {"max_new_tokens": 5, "ignore_eos": True, **params}
    if token is not None:
        sampling["custom_params"] = {"token_id": token}
    out: dict[str, Any] = {"input_ids": PROMPT, "sampling_params": sampling}
    if processor is not None:
        out["custom_logit_processor"] = processor
    return out


def test_processor_steers_every_token(model_dir: Path) -> None:
    with tiny_client(model_dir, enable_custom_logit_processor=True) as (client, engine):
        proc = ForceToken.to_str()
        for params in ({"temperature": 0}, {"temperature": 1.0, "top_p": 0.9}):
            r = client.post("/generate", json=body(proc, 77, **params))
            assert r.status_code == 200, r.text
            assert r.json()["output_ids"] == [77] * 5
        # Two requests with different params in one batch each get their own token.
        r = client.post(
            "/generate",
            json={
                "input_ids": [PROMPT, PROMPT[:5]],
                "sampling_params": [
                    {"max_new_tokens": 3, "custom_params": {"token_id": 11}},
                    {"max_new_tokens": 3, "custom_params": {"token_id": 12}},
                ],
                "custom_logit_processor": proc,
            },
        )
        assert [x["output_ids"] for x in r.json()] == [[11] * 3, [12] * 3]
        plain = client.post("/generate", json=body(None, temperature=0)).json()["output_ids"]
        assert plain != [77] * 5
        assert_kv_idle(engine)


def test_failures_answer_once_and_harm_no_one_else(model_dir: Path) -> None:
    with tiny_client(model_dir, enable_custom_logit_processor=True) as (client, engine):
        r = client.post("/generate", json=body(Broken.to_str(), temperature=0))
        assert r.status_code == 500 and "broken on purpose" in r.json()["error"]["message"]
        assert client.post("/generate", json=body(None, temperature=0)).status_code == 200
        for bad in ("not json", '{"callable": "zz"}', '{"callable": "00ff"}'):
            r = client.post("/generate", json=body(bad, temperature=0))
            assert r.status_code == 400, r.text
            assert "custom_logit_processor" in r.json()["error"]["message"]
        assert_kv_idle(engine)


def test_refused_without_the_option(model_dir: Path) -> None:
    with tiny_client(model_dir) as (client, _):
        r = client.post("/generate", json=body(ForceToken.to_str(), 77, temperature=0))
        assert r.status_code == 400
        assert "--enable-custom-logit-processor" in r.json()["error"]["message"]
        # custom_params without a processor: nothing would read them.
        r = client.post("/generate", json=body(None, 77, temperature=0))
        assert r.status_code == 400 and "custom_params" in r.json()["error"]["message"]
