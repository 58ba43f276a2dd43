"""Where `radixserve chat` sends a conversation: a running server's /v1/chat/completions, or an
Engine in this process. Both stream the reply's text as it arrives; closing the iterator early
(Ctrl-C) stops the request in the engine (a closed HTTP stream is a client disconnect, which the
server aborts; a closed Engine stream aborts its request)."""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

Message = dict[str, str]


class ChatError(Exception):
    """A reply could not be produced (the server refused, or is unreachable)."""


@dataclass(frozen=True)
class ChatParams:
    max_tokens: int | None = None
    temperature: float | None = None

    def openai_fields(self) -> dict[str, Any]:
        fields = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        return {k: v for k, v in fields.items() if v is not None}


class ChatBackend(Protocol):
    def stream(self, messages: list[Message], params: ChatParams) -> Generator[str, None, None]: ...

    def close(self) -> None: ...


def _error_message(body: Any, fallback: str) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message") or fallback)
    return fallback


class HttpChatBackend:
    """A running radixserve (or any OpenAI-compatible) server."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No read timeout: a long reply on a slow CPU may take minutes between connect and end.
        self._client = client or httpx.Client(timeout=httpx.Timeout(10.0, read=None))
        self._headers = headers

    def healthy(self) -> bool:
        try:
            r = self._client.get(f"{self.base_url}/health", headers=self._headers, timeout=2.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def stream(self, messages: list[Message], params: ChatParams) -> Generator[str, None, None]:
        body: dict[str, Any] = {"messages": messages, "stream": True, **params.openai_fields()}
        if self.model:
            body["model"] = self.model
        url = f"{self.base_url}/v1/chat/completions"
        try:
            with self._client.stream("POST", url, json=body, headers=self._headers) as r:
                if r.status_code != 200:
                    r.read()
                    try:
                        payload = r.json()
                    except ValueError:
                        payload = None
                    raise ChatError(_error_message(payload, f"HTTP {r.status_code}"))
                yield from _sse_content(r.iter_lines())
        except httpx.HTTPError as exc:
            raise ChatError(f"cannot reach {self.base_url}: {exc}") from exc

    def close(self) -> None:
        self._client.close()


def _sse_content(lines: Iterator[str]) -> Generator[str, None, None]:
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data.strip() == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise ChatError(_error_message(event, "the server failed mid-reply"))
        for choice in event.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                yield text


class EngineChatBackend:
    """An Engine in this process (the model loads once, when the chat starts)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def stream(self, messages: list[Message], params: ChatParams) -> Generator[str, None, None]:
        tokenizer = self.engine.tokenizer
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template writes the special tokens itself (as the chat route does).
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        sampling: dict[str, Any] = {"max_new_tokens": params.max_tokens}
        if params.temperature is not None:
            sampling["temperature"] = params.temperature
        from radixserve.entrypoints.engine_inputs import GenerateCall  # with the Engine, lazily

        call = GenerateCall(input_ids=ids, sampling_params=sampling, stream=True)
        try:
            chunks = self.engine.generate_outputs(call)  # typed chunks (managers/outputs.py)
        except Exception as exc:  # a client error such as a prompt over the context length
            raise ChatError(str(exc)) from exc
        try:
            for chunk in chunks:
                if chunk.text:
                    yield chunk.text
        finally:
            chunks.close()  # stops the request when the reader stopped early

    def close(self) -> None:
        self.engine.shutdown()
