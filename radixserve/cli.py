"""The ``radixserve`` program: ``radixserve serve [options]``, ``radixserve chat``,
``radixserve cache`` and ``radixserve version``.

``serve`` takes SGLang's ``sglang serve`` command line unchanged. Exit codes: 0 success (and
``--help``), 1 the server could not start, 2 a bad command line or unusable option values.
"""

from __future__ import annotations

import difflib
import logging
import sys
from collections.abc import Sequence

from radixserve import __version__

logger = logging.getLogger(__name__)

_COMMANDS = ("serve", "chat", "cache", "version")
_USAGE = """usage: radixserve <command> [options]

commands:
  serve     start the HTTP server; takes the `sglang serve` command line
            (--help: the options that work here; --help-all: every one)
  chat      chat in the terminal with a running server (--url) or a model loaded
            in this process (--model-path); radixserve chat --help
  cache     list or clear the converted-GGUF cache (radixserve cache --help)
  version   print the radixserve version
"""
_LOG_FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"


def _configure_logging(level: str) -> None:
    # basicConfig leaves logging alone when the embedding program already configured it.
    logging.basicConfig(format=_LOG_FORMAT)
    logging.getLogger().setLevel(level.upper())
    # torch logs its FakeTensor cache statistics at exit at INFO: noise after every Ctrl-C.
    torch_logger = logging.getLogger("torch")
    torch_logger.setLevel(max(logging.WARNING, logging.getLogger().level))


def _error(prog: str, message: str, code: int) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def _missing_local_model(model_path: str) -> str | None:
    """A one-line error for a --model-path that names a local file or folder that is not there
    (checked before any process starts); hub-style ids are left to the loader."""
    from pathlib import Path

    looks_local = model_path.startswith(("/", ".", "~")) or model_path.endswith(".gguf")
    if looks_local and not Path(model_path).expanduser().exists():
        return (
            f"--model-path: {model_path} does not exist (give a Hugging Face model folder or a "
            ".gguf file; leave it out for the default model)"
        )
    return None


def _serve(argv: Sequence[str]) -> int:
    from radixserve.server_args import OptionError, ServerArgs, ServerArgsError

    # Deprecation notices are printed while parsing, before --log-level is known.
    _configure_logging("info")
    try:
        server_args = ServerArgs.from_cli(argv)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except (OptionError, ServerArgsError) as exc:
        return _error("radixserve serve", str(exc), 2)
    _configure_logging(server_args.log_level)
    missing = _missing_local_model(server_args.model_path)
    if missing is not None:
        return _error("radixserve serve", missing, 2)
    server_args.warn_not_applicable()
    if server_args.node_rank > 0:
        # Like SGLang's non-zero node ranks: this node's tensor-parallel ranks only, no HTTP.
        from radixserve.managers.worker_node import run_worker_node

        return run_worker_node(server_args)
    try:
        server_args.check_port_available()
    except ServerArgsError as exc:
        return _error("radixserve serve", str(exc), 2)
    from radixserve.entrypoints.launch import launch_server, missing_http_stack

    missing = missing_http_stack()
    if missing is not None:
        return _error("radixserve serve", f"the HTTP server is not available (no {missing})", 1)
    launch_server(server_args)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the program with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(_USAGE, end="", file=sys.stderr)
        return 2
    command, rest = args[0], args[1:]
    if command in ("-h", "--help"):
        print(_USAGE, end="")
        return 0
    if command in ("version", "--version"):
        print(f"radixserve {__version__}")
        return 0
    if command == "serve":
        try:
            return _serve(rest)
        except KeyboardInterrupt:  # Ctrl-C while loading: the children are already stopped
            print("radixserve serve: interrupted", file=sys.stderr)
            return 130
    if command == "chat":
        from radixserve.chat_cli import main as chat_main

        return chat_main(rest)
    if command == "cache":
        from radixserve.cache_cli import run

        return run(rest)
    close = difflib.get_close_matches(command, _COMMANDS, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else f" (commands: {', '.join(_COMMANDS)})"
    return _error("radixserve", f"unknown command '{command}'{hint}", 2)
