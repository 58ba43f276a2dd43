"""``radixserve chat``: an interactive terminal chat, streaming each reply as it is generated.

Talks to a running server (``--url``, default http://127.0.0.1:30000), or, with
``--model-path`` or when no server answers at the default address, loads the model into this
process (an Engine; the other ``radixserve serve`` options configure it). In the chat:
``/reset`` clears the history, ``/system <text>`` sets the system prompt, ``/exit`` (or
Ctrl-D) quits; Ctrl-C stops the reply being written. Lines piped to stdin are read one message
each, so a scripted conversation works too.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from radixserve.chat_backends import (
    ChatBackend,
    ChatError,
    ChatParams,
    EngineChatBackend,
    HttpChatBackend,
    Message,
)
from radixserve.defaults import DEFAULT_URL

PROG = "radixserve chat"
HELP = """commands:
  /reset          clear the conversation (the system prompt stays)
  /system <text>  set the system prompt (/system alone removes it)
  /exit           quit (also /quit, /bye, Ctrl-D)
  /help           this list
Ctrl-C stops the reply being written."""


class ChatSession:
    """The conversation: an optional system prompt and the turns so far."""

    def __init__(self, system: str | None = None) -> None:
        self.system = system or None
        self.turns: list[Message] = []

    def messages(self, user_text: str) -> list[Message]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, *self.turns, {"role": "user", "content": user_text}]

    def add_exchange(self, user_text: str, reply: str) -> None:
        self.turns += [
            {"role": "user", "content": user_text},
            {"role": "assistant", "content": reply},
        ]


def _command(line: str, session: ChatSession, out: TextIO) -> bool:
    """Runs a /command; returns False when the chat should end."""
    name, _, arg = line.partition(" ")
    if name in ("/exit", "/quit", "/bye"):
        return False
    if name == "/reset":
        session.turns.clear()
        out.write("(conversation cleared)\n")
    elif name == "/system":
        session.system = arg.strip() or None
        out.write("(system prompt set)\n" if session.system else "(system prompt removed)\n")
    elif name in ("/help", "/?"):
        out.write(HELP + "\n")
    else:
        out.write(f"unknown command {name}; /help lists them\n")
    out.flush()
    return True


def _reply(
    backend: ChatBackend, session: ChatSession, text: str, params: ChatParams, out: TextIO
) -> None:
    pieces: list[str] = []
    chunks = backend.stream(session.messages(text), params)
    try:
        for piece in chunks:
            pieces.append(piece)
            out.write(piece)
            out.flush()
    except KeyboardInterrupt:
        # The stopped exchange is left out of the history, so the next turn starts clean.
        chunks.close()
        out.write("\n(reply stopped)\n")
        out.flush()
        return
    except ChatError as exc:
        out.write(f"\nerror: {exc}\n")
        out.flush()
        return
    out.write("\n")
    out.flush()
    session.add_exchange(text, "".join(pieces))


def run_chat(
    backend: ChatBackend,
    params: ChatParams,
    *,
    system: str | None = None,
    read_line: Callable[[str], str] = input,
    out: TextIO | None = None,
    prompt: str = ">>> ",
) -> int:
    """The chat loop; returns the exit status (0 on /exit or end of input)."""
    out = out if out is not None else sys.stdout
    session = ChatSession(system)
    while True:
        try:
            line = read_line(prompt)
        except EOFError:
            if prompt:
                out.write("\n")
            return 0
        except KeyboardInterrupt:
            out.write("\n(Ctrl-D or /exit quits)\n")
            continue
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            if not _command(line, session, out):
                return 0
            continue
        _reply(backend, session, line, params, out)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Chat in the terminal with a running server or a model loaded here.",
        epilog=HELP + "\n\nOther options (with --model-path) are `radixserve serve` options "
        "for the in-process engine.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", help=f"server address (default {DEFAULT_URL})")
    parser.add_argument("--api-key", help="the server's --api-key, if it has one")
    parser.add_argument("--model", help="model name to send (default: the server's)")
    parser.add_argument(
        "--model-path", help="load this model in this process instead of using a server"
    )
    parser.add_argument("--system", help="system prompt")
    parser.add_argument("--max-tokens", type=int, help="longest reply, in tokens")
    parser.add_argument("--temperature", type=float, help="sampling temperature")
    return parser


def _engine_backend(model_path: str | None, serve_argv: Sequence[str]) -> EngineChatBackend:
    from radixserve.entrypoints.engine import Engine
    from radixserve.server_args import ServerArgs

    argv = ["--log-level", "error", *serve_argv]
    if model_path is not None:
        argv += ["--model-path", model_path]
    return EngineChatBackend(Engine(ServerArgs.from_cli(argv)))


def _backend(args: argparse.Namespace, rest: list[str], err: TextIO) -> ChatBackend:
    if args.model_path is None and args.url is None:
        probe = HttpChatBackend(DEFAULT_URL, args.api_key, args.model)
        if probe.healthy():
            return probe
        probe.close()
        err.write(f"{PROG}: no server at {DEFAULT_URL}; loading the default model here\n")
    if args.model_path is not None or args.url is None:
        return _engine_backend(args.model_path, rest)
    if rest:
        raise ChatError(f"unrecognized arguments: {' '.join(rest)} (serve options need no --url)")
    return HttpChatBackend(args.url, args.api_key, args.model)


def _enable_line_editing() -> None:
    """Arrow keys and history (in memory) for input(), where readline exists."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401 - importing it is what turns line editing on


def main(argv: Sequence[str], err: TextIO | None = None) -> int:
    from radixserve.server_args import OptionError, ServerArgsError

    err = err if err is not None else sys.stderr

    args, rest = _parser().parse_known_args(list(argv))
    interactive = sys.stdin.isatty()
    try:
        backend = _backend(args, rest, err)
    except (ChatError, OptionError, ServerArgsError) as exc:
        err.write(f"{PROG}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        err.write(f"{PROG}: interrupted\n")
        return 130
    if interactive:
        _enable_line_editing()
        err.write("Type a message; /help lists commands, Ctrl-D quits.\n")
    params = ChatParams(max_tokens=args.max_tokens, temperature=args.temperature)
    try:
        return run_chat(backend, params, system=args.system, prompt=">>> " if interactive else "")
    finally:
        backend.close()
