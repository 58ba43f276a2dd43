"""--expert-distribution-recorder-mode stat: SGLang's start/stop/dump routes count each MoE
layer's routings per expert, the counts equal the routing the layers actually took, and
/metrics and the dashboard show them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.errors import InvalidRequestError
from radixserve.layers.moe import expert_record, expert_stats
from tests.helpers.family_check import require_hf_arch
from tests.helpers.tiny_models import make_tiny_checkpoint

require_hf_arch("qwen3_moe")

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
NUM_EXPERTS = 8  # tests/helpers/tiny_models.py's qwen3_moe


def test_routes_need_the_recorder_mode() -> None:
    with pytest.raises(InvalidRequestError, match="--expert-distribution-recorder-mode stat"):
        expert_record.handle("start", None)


def test_recording_turns_the_one_call_layer_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixserve.layers.moe import FusedMoE
    from radixserve.layers.moe.router import RouterSpec

    layer = FusedMoE(NUM_EXPERTS, 16, 32, RouterSpec(top_k=2))
    assert layer.fused_call_allowed()
    monkeypatch.setattr(expert_stats, "_RECORDING", True)
    assert not layer.fused_call_allowed()


def test_counts_equal_the_routing_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from radixserve import Engine
    from radixserve.entrypoints.http_server import create_app
    from radixserve.layers.moe import fused_moe

    folder = tmp_path / "qwen3_moe"
    hf = make_tiny_checkpoint(folder, "qwen3_moe")
    num_layers = hf.config.num_hidden_layers
    # Every MoE layer's routing, in call order, while recording is on.
    taken: list[torch.Tensor] = []
    real_route = fused_moe.route

    def spy(*args: Any, **kwargs: Any) -> Any:
        weights, experts = real_route(*args, **kwargs)
        if expert_stats.recording():
            taken.append(experts.clone())
        return weights, experts

    monkeypatch.setattr(fused_moe, "route", spy)
    monkeypatch.setenv(expert_record.DIR_ENV, str(tmp_path / "dumps"))
    engine = Engine(
        runtime="thread",
        model_path=str(folder),
        dtype="float32",
        skip_tokenizer_init=True,
        max_total_tokens=1024,
        enable_metrics=True,
        expert_distribution_recorder_mode="stat",
    )
    try:
        with TestClient(create_app(engine, engine.server_args)) as client:
            body = {"input_ids": [5, 6, 7, 8], "sampling_params": GREEDY}
            assert client.post("/generate", json=body).status_code == 200  # not recorded
            r = client.post("/start_expert_distribution_record")
            assert r.status_code == 200 and r.text == "Start recording the expert distribution.\n"
            for ids in ([11, 12, 13, 14], list(range(20, 40))):
                body = {"input_ids": ids, "sampling_params": GREEDY}
                assert client.post("/generate", json=body).status_code == 200
            assert client.get("/stop_expert_distribution_record").status_code == 200
            body = {"input_ids": [9, 9, 9], "sampling_params": GREEDY}
            assert client.post("/generate", json=body).status_code == 200  # not recorded
            r = client.post("/dump_expert_distribution_record")
            assert r.status_code == 200 and r.text == "Dump expert distribution record.\n"
            metrics = client.get("/metrics").text
            dashboard = client.get("/dashboard/state").json()
    finally:
        engine.shutdown()

    expected = torch.zeros(num_layers, NUM_EXPERTS, dtype=torch.int64)
    assert taken and len(taken) % num_layers == 0  # each forward calls every layer in order
    for i, experts in enumerate(taken):
        expected[i % num_layers] += torch.bincount(experts.reshape(-1), minlength=NUM_EXPERTS)
    (dump,) = (tmp_path / "dumps").glob("expert_distribution_recorder_*.pt")
    record = torch.load(dump)
    assert record["rank"] == 0
    assert torch.equal(record["logical_count"], expected)
    # Prompt tokens of the two requests (no cached prefix), and every decode step's token
    # (top-2 each).
    assert int(expected[0].sum()) == 2 * (4 + 20 + 2 * (GREEDY["max_new_tokens"] - 1))

    line = 'sglang:moe_expert_load{expert="3",layer="1",model_name="qwen3_moe"}'
    value = next(x for x in metrics.splitlines() if x.startswith(line))
    assert float(value.rsplit(" ", 1)[1]) == float(expected[1, 3])
    assert "sglang:moe_expert_balancedness{" in metrics
    panel = dashboard["expert_load"]
    assert panel["recording"] is False
    assert [row["counts"] for row in panel["layers"]] == expected.tolist()
