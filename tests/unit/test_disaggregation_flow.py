"""Prefill/decode disaggregation end to end in one process: a prefill engine and a decode
engine on the same tiny random model, KV moved by the in-process LocalTransfer backend, the
control messages over real ZMQ and the bootstrap server over real HTTP. Greedy outputs must
equal a single engine's, and both KV pools must come back to idle after successes and
failures."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixserve.disaggregation.transfer import LocalTransfer
from radixserve.messages import BootstrapInfo
from radixserve.observability.metrics import engine_gauges
from tests.unit.tiny_model import TINY_VOCAB, tiny_engines, write_tiny_llama

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(autouse=True)
def short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "3")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "2")


@pytest.fixture
def pd(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(
        "radixserve.managers.disagg_setup.make_backend", lambda args, host: LocalTransfer()
    )
    port = _free_port()
    with tiny_engines(tiny_model_dir, disaggregation_transfer_backend="fake") as factory:
        prefill = factory(disaggregation_mode="prefill", disaggregation_bootstrap_port=port)
        decode = factory(disaggregation_mode="decode")
        yield prefill, decode, port, factory


def _prompts(count: int) -> list[list[int]]:
    return [
        [(7 * i + 3 * j) % (TINY_VOCAB - 3) + 3 for j in range(5 + 9 * i)] for i in range(count)
    ]


def _wait_idle(engine: Any, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        info = engine.get_server_info()
        idle = info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]
        # Held rooms keep their requests' pages (partly in the prefix cache, locked).
        held = info.get("num_prefill_inflight_queue_reqs", 0)
        held += info.get("num_decode_transfer_queue_reqs", 0)
        if idle and held == 0 and info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"KV not idle: {info}")
        time.sleep(0.05)


def _pair(prefill: Any, decode: Any, ids: list[int], room: BootstrapInfo, **kw: Any) -> tuple:
    """Both halves at once, as the router sends them."""
    out: dict[str, Any] = {}

    def run_prefill() -> None:
        out["prefill"] = prefill.generate(
            input_ids=ids, sampling_params=GREEDY, bootstrap=room, **kw
        )

    t = threading.Thread(target=run_prefill)
    t.start()
    got = decode.generate(input_ids=ids, sampling_params=GREEDY, bootstrap=room, **kw)
    t.join(timeout=30)
    return out["prefill"], got


def test_greedy_outputs_equal_a_single_engine(pd: Any) -> None:
    prefill, decode, port, factory = pd
    base = factory()
    for i, ids in enumerate(_prompts(4)):
        want = base.generate(input_ids=ids, sampling_params=GREEDY, return_logprob=True)
        room = BootstrapInfo("127.0.0.1", port, 1000 + i)
        pre, got = _pair(prefill, decode, ids, room, return_logprob=True)
        assert got["output_ids"] == want["output_ids"]
        assert pre["output_ids"] == want["output_ids"][:1]  # the prefill stops at one token
        assert got["meta_info"]["finish_reason"]["type"] == "length"
        lp_got = [e[0] for e in got["meta_info"]["output_token_logprobs"]]
        lp_want = [e[0] for e in want["meta_info"]["output_token_logprobs"]]
        assert lp_got == pytest.approx(lp_want, abs=1e-4)
    info = _wait_idle(prefill)
    assert info["disaggregation_mode"] == "prefill" and info["kv_transfer_total"] == 4
    assert _wait_idle(decode)["kv_transfer_total"] == 4
    gauges = engine_gauges(info, 0.0)  # what /metrics exports as sglang:<name>
    assert gauges["kv_transfer_total"] == 4 and gauges["kv_transfer_bytes_total"] > 0


def test_warmup_host_runs_as_a_plain_request(pd: Any) -> None:
    prefill, decode, _, factory = pd
    ids = _prompts(1)[0]
    want = factory().generate(input_ids=ids, sampling_params=GREEDY)["output_ids"]
    room = BootstrapInfo("2.2.2.2", 8998, 1)
    assert (
        decode.generate(input_ids=ids, sampling_params=GREEDY, bootstrap=room)["output_ids"] == want
    )
    assert (
        prefill.generate(input_ids=ids, sampling_params=GREEDY, bootstrap=room)["output_ids"]
        == want
    )
    _wait_idle(prefill)
    _wait_idle(decode)


def test_unclaimed_room_expires_on_the_prefill(pd: Any) -> None:
    prefill, _, port, _ = pd
    ids = _prompts(2)[1]
    out = prefill.generate(
        input_ids=ids, sampling_params=GREEDY, bootstrap=BootstrapInfo("127.0.0.1", port, 7)
    )
    assert len(out["output_ids"]) == 1
    assert prefill.get_server_info()["num_prefill_inflight_queue_reqs"] == 1
    _wait_idle(prefill, timeout_s=10)  # SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=2 s


def test_decode_without_its_prefill_fails_once_and_frees_its_pages(pd: Any) -> None:
    _, decode, port, _ = pd
    ids = _prompts(2)[1]
    got = decode.generate(
        input_ids=ids, sampling_params=GREEDY, bootstrap=BootstrapInfo("127.0.0.1", port, 99)
    )
    reason = got["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "never produced room 99" in reason["message"]
    assert got["output_ids"] == []
    _wait_idle(decode)


def test_decode_with_unreachable_bootstrap_fails(pd: Any) -> None:
    _, decode, _, _ = pd
    got = decode.generate(
        input_ids=_prompts(1)[0],
        sampling_params=GREEDY,
        bootstrap=BootstrapInfo("127.0.0.1", _free_port(), 5),
    )
    reason = got["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "unreachable" in reason["message"]
    _wait_idle(decode)


class _FailingTransfer(LocalTransfer):
    """A peer that dies mid-transfer: the write fails."""

    def _start(self, handle: int, peer: Any, runs: Any) -> None:
        pass  # poll() reports FAILED for a handle it never completed


def test_failed_transfer_frees_both_sides(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backends = iter([_FailingTransfer(), LocalTransfer()])  # the prefill's, then the decode's
    monkeypatch.setattr(
        "radixserve.managers.disagg_setup.make_backend", lambda args, host: next(backends)
    )
    port = _free_port()
    with tiny_engines(tiny_model_dir, disaggregation_transfer_backend="fake") as factory:
        prefill = factory(disaggregation_mode="prefill", disaggregation_bootstrap_port=port)
        decode = factory(disaggregation_mode="decode")
        ids = _prompts(3)[2]
        _, got = _pair(prefill, decode, ids, BootstrapInfo("127.0.0.1", port, 42))
        reason = got["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "KV transfer for room 42 failed" in reason["message"]
        assert _wait_idle(prefill)["kv_transfer_failed_total"] == 1
        _wait_idle(decode)


def _pd_pair(factory: Any, port: int, prefill_kw: dict[str, Any], decode_kw: dict[str, Any]):
    prefill = factory(
        disaggregation_mode="prefill", disaggregation_bootstrap_port=port, **prefill_kw
    )
    return prefill, factory(disaggregation_mode="decode", **decode_kw)


def test_paged_pools_and_a_page_size_mismatch(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "radixserve.managers.disagg_setup.make_backend", lambda args, host: LocalTransfer()
    )
    with tiny_engines(tiny_model_dir, disaggregation_transfer_backend="fake") as factory:
        base = factory()
        port = _free_port()
        prefill, decode = _pd_pair(factory, port, {"page_size": 4}, {"page_size": 4})
        for i, ids in enumerate(_prompts(3)):
            want = base.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"]
            # The same prompt twice: the second prefill comes from the radix cache.
            for repeat in range(2):
                room = BootstrapInfo("127.0.0.1", port, 10 * i + repeat)
                assert _pair(prefill, decode, ids, room)[1]["output_ids"] == want
        _wait_idle(prefill)
        _wait_idle(decode)
        port = _free_port()
        prefill, decode = _pd_pair(factory, port, {"page_size": 4}, {})
        _, got = _pair(prefill, decode, _prompts(1)[0], BootstrapInfo("127.0.0.1", port, 1))
        reason = got["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "same --page-size" in reason["message"]
        _wait_idle(decode)
        _wait_idle(prefill, timeout_s=10)  # the unclaimed room expires (2 s)


def test_concurrent_pairs_while_others_decode(pd: Any) -> None:
    """Transfers start and finish while other requests decode (KV checked after each step)."""
    from concurrent.futures import ThreadPoolExecutor

    prefill, decode, port, factory = pd
    base = factory()
    inputs = _prompts(6)
    want = [base.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in inputs]

    def one(i: int) -> list[int]:
        room = BootstrapInfo("127.0.0.1", port, 500 + i)
        return _pair(prefill, decode, inputs[i], room)[1]["output_ids"]

    with ThreadPoolExecutor(max_workers=6) as pool:
        assert list(pool.map(one, range(6))) == want
    _wait_idle(prefill)
    _wait_idle(decode)
