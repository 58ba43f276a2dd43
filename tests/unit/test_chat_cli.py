"""`radixserve chat`: the loop driven by piped lines, against a recording backend and against
the fake-engine app over HTTP (streamed replies, /reset, /system, Ctrl-C, errors)."""

from __future__ import annotations

import io
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from radixserve.chat_backends import ChatParams, HttpChatBackend, Message
from radixserve.chat_cli import run_chat
from radixserve.cli import main
from tests.unit.test_http_fakes import REPLY, make_client


def lines(*items: str) -> Any:
    """A read_line that returns `items` one by one, then raises EOFError (end of stdin)."""
    feed: Iterator[str] = iter(items)

    def read_line(prompt: str) -> str:
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    return read_line


class Recorder:
    """A backend that records what it is sent and replies "r<n>" in two pieces."""

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.sent: list[list[Message]] = []
        self.interrupt_at = interrupt_at
        self.closed_early = False

    def stream(self, messages: list[Message], params: ChatParams) -> Generator[str, None, None]:
        self.sent.append([dict(m) for m in messages])
        n = len(self.sent)
        try:
            yield "r"
            if n == self.interrupt_at:
                raise KeyboardInterrupt  # as Ctrl-C arrives while the reply is read
            yield str(n)
        except GeneratorExit:
            self.closed_early = True
            raise

    def close(self) -> None:
        pass


def test_reply_history_system_and_reset() -> None:
    backend, out = Recorder(), io.StringIO()
    read = lines("Hi", "/system Be brief.", "Again", "/reset", "Third", "/exit", "never sent")
    assert run_chat(backend, ChatParams(), read_line=read, out=out, prompt="") == 0
    assert out.getvalue() == ("r1\n(system prompt set)\nr2\n(conversation cleared)\nr3\n")
    first, second, third = backend.sent
    assert first == [{"role": "user", "content": "Hi"}]
    assert second == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "r1"},
        {"role": "user", "content": "Again"},
    ]
    # /reset drops the turns; the system prompt stays.
    assert third == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Third"},
    ]


def test_ctrl_c_stops_the_reply_and_leaves_it_out_of_the_history() -> None:
    backend, out = Recorder(interrupt_at=1), io.StringIO()
    run_chat(backend, ChatParams(), read_line=lines("Hi", "Next"), out=out, prompt="")
    assert out.getvalue() == "r\n(reply stopped)\nr2\n"
    assert backend.sent[1] == [{"role": "user", "content": "Next"}]


def test_system_flag_unknown_command_and_blank_lines() -> None:
    backend, out = Recorder(), io.StringIO()
    read = lines("", "/nope", "/system", "x")
    run_chat(backend, ChatParams(), system="S", read_line=read, out=out, prompt="")
    assert (
        out.getvalue() == "unknown command /nope; /help lists them\n(system prompt removed)\nr1\n"
    )
    assert backend.sent == [[{"role": "user", "content": "x"}]]


def test_http_backend_streams_from_the_app() -> None:
    with make_client() as (client, engine):
        backend = HttpChatBackend("http://testserver", client=client)
        out = io.StringIO()
        read = lines("/system Sys", "Hi", "/reset", "Yo")
        run_chat(backend, ChatParams(max_tokens=64), read_line=read, out=out, prompt="")
        assert out.getvalue() == f"(system prompt set)\n{REPLY}\n(conversation cleared)\n{REPLY}\n"
        prompts = [engine.tokenizer.decode(call["input_ids"]) for call in engine.calls]
        assert prompts == [
            "<system>Sys\n<user>Hi\n<assistant>",
            "<system>Sys\n<user>Yo\n<assistant>",
        ]
        assert all(call["stream"] for call in engine.calls)
        assert engine.calls[0]["sampling_params"]["max_new_tokens"] == 64


def test_http_backend_prints_the_server_error_and_goes_on() -> None:
    with make_client() as (client, _):
        backend = HttpChatBackend("http://testserver", client=client)
        out = io.StringIO()
        run_chat(backend, ChatParams(), read_line=lines("x" * 500, "Hi"), out=out, prompt="")
    first, second = out.getvalue().splitlines()[1:3]
    assert first.startswith("error: ") and "context length" in first
    assert second == REPLY


def test_chat_command_against_an_unreachable_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    assert main(["chat", "--url", "http://127.0.0.1:9"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("\nerror: cannot reach http://127.0.0.1:9")
    assert main(["--help"]) == 0
    assert "  chat " in capsys.readouterr().out


def test_engine_backend_streams_the_engine_reply(tmp_path: Any) -> None:
    """The in-process path: a real Engine on a tiny checkpoint (thread runtime); the streamed
    reply printed by the chat equals the engine's own greedy reply to the same prompt."""
    from radixserve.chat_backends import EngineChatBackend
    from radixserve.entrypoints.engine import Engine
    from tests.helpers.tiny_models import make_tiny_checkpoint, save_word_tokenizer

    make_tiny_checkpoint(tmp_path, vocab_size=256)
    save_word_tokenizer(tmp_path)
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}w3 {{ m['content'] }} {% endfor %}w4"
    )
    engine = Engine(
        model_path=str(tmp_path), runtime="thread", dtype="float32", max_total_tokens=1024
    )
    backend = EngineChatBackend(engine)
    try:
        out = io.StringIO()
        params = ChatParams(max_tokens=6, temperature=0.0)
        run_chat(backend, params, read_line=lines("w5 w6 w7"), out=out, prompt="")
        ids = engine.tokenizer.encode("w3 w5 w6 w7 w4", add_special_tokens=False)
        want = engine.generate(
            input_ids=ids, sampling_params={"max_new_tokens": 6, "temperature": 0.0}
        )["text"]
        assert want and out.getvalue() == want + "\n"
    finally:
        backend.close()
