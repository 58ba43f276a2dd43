"""Prefill/decode disaggregation behind SGLang's router (sglang-router 0.3.2 in PD mode):
a prefill server and a decode server on the tiny model, KV moved by Mooncake over TCP. Greedy
/generate (with logprobs, the router prepending the prefill's input logprobs), chat and
streaming answers equal a single server's; a decode that dies leaves the prefill's pages
freed, and a prefill that dies ends the decode's waiting request once, with an error."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.e2e_server import ServerProcess, free_port, start_server
from tests.helpers.tiny_models import make_tiny_checkpoint, save_word_tokenizer


def _mooncake_ok() -> bool:
    # Its engine links libibverbs even for TCP: a subprocess, so a failed load cannot hurt.
    code = "from mooncake.engine import TransferEngine"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


pytestmark = [
    pytest.mark.slow,  # three servers and a router: about a minute and a half on 2 cores
    pytest.mark.skipif(
        importlib.util.find_spec("sglang_router") is None,
        reason="sglang-router not installed (pip install 'radixserve[router]')",
    ),
    pytest.mark.skipif(
        not _mooncake_ok(),
        reason="Mooncake's transfer engine not loadable (pip install 'radixserve[disaggregation]'"
        " and libibverbs1)",
    ),
]

MODEL = "tiny-pd"
TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
PROMPTS = ["w5 w6 w7", "w40 w41 w9 w33 w21", "w90 w12 w3"]
READY_S = 120.0
# Short timeouts so that the fault tests end quickly (SGLang's variables).
ENV = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "4",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "30",
}


class PDRouter:
    def __init__(self, prefill: str, bootstrap_port: int, decode: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the process
            mode="w+", prefix="sglang-router-pd-", suffix=".log", delete=False
        )
        command = [
            sys.executable,
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--pd-disaggregation",
            "--prefill",
            prefill,
            str(bootstrap_port),
            "--decode",
            decode,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warn",
        ]
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)

    def logs(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        body = {"text": "w1", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.logs()
            try:
                if httpx.post(f"{self.url}/generate", json=body, timeout=30).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the PD router never answered:\n{self.logs()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp(MODEL)
    make_tiny_checkpoint(folder, "llama")
    save_word_tokenizer(folder)
    template = folder / "chat.jinja"
    template.write_text(TEMPLATE)
    args = ("--model-path", str(folder), "--chat-template", str(template))
    args += ("--served-model-name", MODEL)
    pd = ("--disaggregation-transfer-backend", "mooncake_tcp", "--enable-metrics")
    bootstrap = free_port()
    servers: list[ServerProcess] = []
    router = None
    try:
        single = start_server(*args)
        servers.append(single)
        prefill = start_server(
            *args,
            *pd,
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            str(bootstrap),
            env=ENV,
        )
        servers.append(prefill)
        decode = start_server(*args, *pd, "--disaggregation-mode", "decode", env=ENV)
        servers.append(decode)
        router = PDRouter(prefill.base_url, bootstrap, decode.base_url)
        router.wait_ready()
        yield {
            "single": single,
            "prefill": prefill,
            "decode": decode,
            "router": router,
            "bootstrap": bootstrap,
        }
    finally:
        if router is not None:
            router.stop()
        for server in servers:
            server.stop(signal.SIGKILL)


def _generate(url: str, prompt: str, **extra: Any) -> dict[str, Any]:
    body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 8}, **extra}
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(url: str, prompt: str) -> list[list[int]]:
    body = {
        "text": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": 8},
        "stream": True,
    }
    chunks = []
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:])["output_ids"])
    return chunks


def _chat(url: str, prompt: str, stream: bool = False) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 6,
        "stream": stream,
    }
    if not stream:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["message"]["content"])
    text = ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:])["choices"]
                text += (choices[0]["delta"].get("content") or "") if choices else ""
    return text


def _info(server: ServerProcess) -> dict[str, Any]:
    info = httpx.get(f"{server.base_url}/server_info", timeout=10).json()
    return info["internal_states"][0] if "internal_states" in info else info


def _wait_idle(server: ServerProcess, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        info = _info(server)
        held = info.get("num_prefill_inflight_queue_reqs", 0)
        held += info.get("num_decode_transfer_queue_reqs", 0)
        idle = info["available_kv_tokens"] + info["cached_tokens"] == info["max_total_num_tokens"]
        if idle and held == 0 and info["num_running_reqs"] == 0:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"KV not idle on {server.base_url}: {info}")
        time.sleep(0.2)


def _logprobs(meta: dict[str, Any], key: str) -> list[tuple[float | None, int]]:
    return [(None if e[0] is None else round(e[0], 4), e[1]) for e in meta[key]]


def test_outputs_equal_a_single_server(setup: dict[str, Any]) -> None:
    single, router = setup["single"].base_url, setup["router"].url
    for prompt in PROMPTS:
        want = _generate(single, prompt, return_logprob=True, logprob_start_len=0)
        got = _generate(router, prompt, return_logprob=True, logprob_start_len=0)
        assert got["output_ids"] == want["output_ids"] and got["text"] == want["text"]
        for key in ("output_token_logprobs", "input_token_logprobs"):
            assert _logprobs(got["meta_info"], key) == _logprobs(want["meta_info"], key), key
        assert _stream(router, prompt) == _stream(single, prompt)
        assert _chat(router, prompt) == _chat(single, prompt)
        assert _chat(router, prompt, stream=True) == _chat(single, prompt, stream=True)
    prefill = _wait_idle(setup["prefill"])
    decode = _wait_idle(setup["decode"])
    assert prefill["disaggregation_mode"] == "prefill" and prefill["kv_transfer_total"] > 0
    assert decode["disaggregation_mode"] == "decode" and decode["kv_transfer_total"] > 0
    metrics = httpx.get(f"{setup['prefill'].base_url}/metrics", timeout=10).text
    assert "sglang:kv_transfer_total" in metrics
    assert "sglang:num_prefill_inflight_queue_reqs" in metrics
    dashboard = httpx.get(f"{setup['decode'].base_url}/dashboard/state", timeout=10).json()
    assert dashboard["role"] == "decode"


def test_decode_killed_mid_request_frees_the_prefill(setup: dict[str, Any]) -> None:
    """The decode dies while it streams a long answer; a room whose decode never comes (as
    when it dies before claiming) expires. The prefill's pool comes back to idle either way."""
    router, prefill, decode = setup["router"], setup["prefill"], setup["decode"]
    body = {
        "text": PROMPTS[1],
        "sampling_params": {"temperature": 0, "max_new_tokens": 4000, "ignore_eos": True},
        "stream": True,
    }
    with httpx.stream("POST", f"{router.url}/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # the decode is streaming: its KV arrived
        decode.stop(signal.SIGKILL)
    # A prefill half whose decode is gone: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=4 s.
    boot = {"bootstrap_host": "127.0.0.1", "bootstrap_port": setup["bootstrap"]}
    out = _generate(prefill.base_url, PROMPTS[2], bootstrap_room=12345, **boot)
    assert len(out["output_ids"]) == 1
    assert _info(prefill)["num_prefill_inflight_queue_reqs"] >= 1
    _wait_idle(prefill)


def test_prefill_killed_fails_the_waiting_decode_once(setup: dict[str, Any]) -> None:
    """A decode request whose prefill dies before producing its room gets one error."""
    prefill = setup["prefill"]
    args = setup["single"].proc.args
    model = args[args.index("--model-path") + 1]
    decode = start_server(
        "--model-path",
        model,
        "--disaggregation-mode",
        "decode",
        "--disaggregation-transfer-backend",
        "mooncake_tcp",
        env=ENV,
    )
    try:
        body = {
            "text": PROMPTS[0],
            "sampling_params": {"temperature": 0, "max_new_tokens": 8},
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": setup["bootstrap"],
            "bootstrap_room": 777,
        }
        with ThreadPoolExecutor(max_workers=1) as pool:
            sent = pool.submit(httpx.post, f"{decode.base_url}/generate", json=body, timeout=60)
            # The decode has claimed room 777, which its prefill never produces; then it dies.
            deadline = time.monotonic() + 30
            while _info(decode).get("num_decode_transfer_queue_reqs", 0) == 0:
                assert time.monotonic() < deadline, "the decode never started its transfer"
                time.sleep(0.1)
            prefill.stop(signal.SIGKILL)
            r = sent.result()
        assert r.status_code >= 500, r.text
        assert "prefill" in r.text
        _wait_idle(decode)
    finally:
        decode.stop(signal.SIGKILL)
