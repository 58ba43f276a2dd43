"""The radixserve program: exit codes and one-line errors, in-process and as a real subprocess."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from radixserve import __version__
from radixserve.cli import main

REPO = Path(__file__).resolve().parents[2]
# An existing folder standing in for a model: the fake servers below never load it.
MODEL = str(REPO / "tests")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fail(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert err.startswith("radixserve serve: error: ")
    return err.removeprefix("radixserve serve: error: ")


def test_version_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"radixserve {__version__}\n"
    assert main([]) == 2
    assert "radixserve <command>" in capsys.readouterr().err
    assert main(["serv"]) == 2
    assert capsys.readouterr().err == (
        "radixserve: error: unknown command 'serv' (did you mean 'serve'?)\n"
    )


def test_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert _fail(["serve", "--mem-fraction-statik", "0.5"], capsys) == (
        "unrecognized option '--mem-fraction-statik' (did you mean --mem-fraction-static?)"
    )


def test_ambiguous_option(capsys: pytest.CaptureFixture[str]) -> None:
    message = _fail(["serve", "--cuda-graph-max", "8"], capsys)
    assert message.startswith("ambiguous option: --cuda-graph-max could match")


def test_bad_choice(capsys: pytest.CaptureFixture[str]) -> None:
    message = _fail(["serve", "--schedule-policy", "fifo"], capsys)
    assert message.startswith("argument --schedule-policy: invalid choice: 'fifo' (choose from")


def test_bad_type(capsys: pytest.CaptureFixture[str]) -> None:
    assert _fail(["serve", "--port", "http"], capsys) == "argument --port: invalid integer 'http'"


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.yaml"
    assert _fail(["serve", "--config", str(missing)], capsys) == (
        f"config file not found: {missing}"
    )


def test_bad_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("port: [1\n", encoding="utf-8")
    assert _fail(["serve", "--config", str(config)], capsys).startswith(
        f"config file {config}: invalid YAML (line"
    )


def test_unknown_config_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("warp_speed: 9\n", encoding="utf-8")
    assert _fail(["serve", "--config", str(config)], capsys) == (
        f"config file {config}: unknown option 'warp_speed'"
    )


def test_unsupported_option_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    message = _fail(["serve", "m", "--device", "cpu", "--enable-lora-overlap-loading"], capsys)
    assert message == (
        "--enable-lora-overlap-loading: not supported by radixserve yet: "
        "--enable-lora-overlap-loading=True (leave at the default)"
    )


def test_help_with_legacy_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--cuda-graph-max-bs", "8", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: radixserve serve")
    assert "--max-total-tokens" in out and "--help-all" in out
    assert main(["serve", "--cuda-graph-max-bs", "8", "--help-all"]) == 0
    assert "--cuda-graph-max-bs-decode" in capsys.readouterr().out


@pytest.fixture
def fake_server(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    from radixserve.entrypoints import launch

    launched: list[object] = []
    monkeypatch.setattr(launch, "launch_server", launched.append)
    return launched


def test_serve_launches_with_resolved_args(
    fake_server: list[object], caplog: pytest.LogCaptureFixture
) -> None:
    port = str(_free_port())
    argv = ["serve", MODEL, "--device", "cpu", "--port", port, "--cuda-graph-max-bs", "8"]
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0
    (args,) = fake_server
    assert args.model_path == MODEL and args.cuda_graph_max_bs_decode == 8  # type: ignore[attr-defined]
    ignored = [r for r in caplog.records if "no effect" in r.getMessage()]
    assert len(ignored) == 1
    assert "--cuda-graph-max-bs-decode=8" in ignored[0].getMessage()


def test_busy_port_is_refused(
    fake_server: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        message = _fail(["serve", MODEL, "--device", "cpu", "--port", str(port)], capsys)
    assert message.startswith(f"--port: cannot listen on 127.0.0.1:{port}")
    assert fake_server == []


def test_missing_http_server_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "radixserve.entrypoints.http_server", None)
    assert main(["serve", MODEL, "--device", "cpu", "--port", str(_free_port())]) == 1
    err = capsys.readouterr().err
    assert err.startswith("radixserve serve: error: the HTTP server is not available")
    assert err.count("\n") == 1


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "radixserve", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_real_subprocess_bad_choice_and_legacy_help() -> None:
    bad = _run("serve", "--dtype", "fp64")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "radixserve serve: error: argument --dtype: invalid choice: 'fp64' "
        "(choose from 'auto', 'half', 'float16', 'bfloat16', 'float', 'float32')"
    ]
    legacy = _run("serve", "--cuda-graph-max-bs", "8", "--help")
    assert legacy.returncode == 0, legacy.stderr
    assert "usage: radixserve serve" in legacy.stdout
    assert "'--cuda-graph-max-bs' is deprecated" in legacy.stderr


def test_missing_local_model_path_is_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixserve.entrypoints import launch

    def never(*_: object) -> None:
        raise AssertionError("the server must not start")

    monkeypatch.setattr(launch, "launch_server", never)
    for missing in (tmp_path / "nope", tmp_path / "model.gguf"):
        message = _fail(["serve", "--model-path", str(missing)], capsys)
        assert message.startswith(f"--model-path: {missing} does not exist")
