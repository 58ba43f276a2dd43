"""Defaults more than one layer needs: the HTTP server's address (the option table, ServerArgs,
the API process's HttpConfig and the chat client all start from these). A leaf: it imports
nothing, so the light API process and the CLI client can take it without the option table."""

from __future__ import annotations

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
