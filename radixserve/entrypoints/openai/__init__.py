"""OpenAI-compatible API: request models, handlers and the error shape."""

from __future__ import annotations
