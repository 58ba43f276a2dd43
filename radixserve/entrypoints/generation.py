"""Running generation requests against the engine for the HTTP routes.

Two shapes: `run` (non-streaming: one engine call for all items, abandoned and aborted when the
client disconnects) and `open_streams` + `merge` (one engine stream per item, all validated
before the first byte is sent, merged into `(index, chunk)` pairs; closing the merged iterator
aborts every unfinished item).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from starlette.requests import Request

from radixserve.entrypoints.engine_inputs import GenerateCall
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.managers.outputs import GenerateOutput
from radixserve.messages import BootstrapInfo
from radixserve.observability.metrics import ServingMetrics

logger = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.2


class ClientGone(ApiError):
    def __init__(self) -> None:
        # 499 is nginx's "client closed request"; nobody reads this response.
        super().__init__(499, "The client closed the connection.")


@dataclass
class GenItem:
    """One prompt times one sample: exactly one engine request."""

    sampling_params: dict[str, Any]
    prompt: str | None = None
    input_ids: list[int] | None = None
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    lora_path: str | None = None  # a loaded LoRA adapter's name (None: the base model)
    priority: int | None = None
    session_params: dict[str, Any] | None = None
    custom_logit_processor: str | None = None
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    image_data: list[str] | None = None  # a vision model's images (data URLs or paths)
    bootstrap: BootstrapInfo | None = None  # its room on a prefill server (PD disaggregation)


def sample_rids(base: str, n: int, given: str | None = None) -> list[str]:
    """The request ids of one prompt's n samples: the client's rid (else `base`) alone for one
    sample, `<rid>-<k>` for each of several (SGLang's naming)."""
    rid = given or base
    return [rid] if n == 1 else [f"{rid}-{k}" for k in range(n)]


def sample_copies(item: GenItem, rids: Sequence[str]) -> list[GenItem]:
    """`item` once per sample, each with its rid and its own sampling_params dict: the one
    place the HTTP routes expand `n`."""
    if len(rids) > 1 and item.bootstrap is not None:
        # One room holds one prompt's KV for one decode request.
        raise ApiError(400, "n > 1 cannot be combined with bootstrap_room.", param="n")
    return [
        dataclasses.replace(item, sampling_params=dict(item.sampling_params), rid=rid)
        for rid in rids
    ]


class LogprobOptions(NamedTuple):
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    token_ids_logprob: Any = None  # SGLang's list of token ids to report logprobs for


async def call_engine(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a blocking engine method off the event loop (or await it if it is async)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result


async def await_unless_disconnected(request: Request | None, task: asyncio.Future[Any]) -> Any:
    """Wait for `task`; if the client goes away first, cancel it and raise ClientGone."""
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if request is not None and await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


class GenerationRunner:
    def __init__(self, engine: Any, metrics: ServingMetrics | None = None) -> None:
        self.engine = engine
        self.metrics = metrics

    def _engine_kwargs(self, items: Sequence[GenItem], opts: LogprobOptions) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "sampling_params": [dict(it.sampling_params) for it in items],
            "rid": [it.rid for it in items],
            "return_logprob": opts.return_logprob,
            "logprob_start_len": opts.logprob_start_len,
            "top_logprobs_num": opts.top_logprobs_num,
        }
        # Only when set: engines (and test fakes) without these controls keep working.
        if opts.token_ids_logprob is not None:
            kwargs["token_ids_logprob"] = opts.token_ids_logprob
        if any(it.priority is not None for it in items):
            kwargs["priority"] = [it.priority for it in items]
        if any(it.session_params is not None for it in items):
            kwargs["session_params"] = [it.session_params for it in items]
        if any(it.custom_logit_processor is not None for it in items):
            kwargs["custom_logit_processor"] = [it.custom_logit_processor for it in items]
        if any(it.return_routed_experts for it in items):
            # One setting per engine call: the items of one HTTP request share it.
            kwargs["return_routed_experts"] = True
            kwargs["routed_experts_start_len"] = items[0].routed_experts_start_len
        if all(it.input_ids is not None for it in items):
            kwargs["input_ids"] = [list(it.input_ids or []) for it in items]
        elif all(it.prompt is not None for it in items):
            kwargs["prompt"] = [it.prompt for it in items]
        else:
            raise ValueError("items mix text prompts and token ids")
        if any(it.lora_path is not None for it in items):
            kwargs["lora_path"] = [it.lora_path for it in items]
        if any(it.image_data for it in items):
            kwargs["image_data"] = [it.image_data for it in items]
        if any(it.bootstrap is not None for it in items):
            kwargs["bootstrap"] = [it.bootstrap for it in items]
        return kwargs

    async def run(
        self, request: Request | None, items: Sequence[GenItem], opts: LogprobOptions
    ) -> list[GenerateOutput]:
        """All items in one engine call; one result per item, in order."""
        start = time.monotonic()
        call = GenerateCall(**self._engine_kwargs(items, opts), stream=False)
        task = asyncio.ensure_future(self.engine.async_generate_outputs(call))
        try:
            results = await await_unless_disconnected(request, task)
        except ClientGone:
            for it in items:
                self.engine.abort_request(rid=it.rid)
            logger.info("Client disconnected; aborted %d requests", len(items))
            raise
        results = results if isinstance(results, list) else [results]
        if self.metrics is not None:
            for res in results:
                self.metrics.observe_finished(res.meta_info, time.monotonic() - start)
        return results

    async def open_streams(
        self, items: Sequence[GenItem], opts: LogprobOptions
    ) -> list[AsyncIterator[GenerateOutput]]:
        """Validate every item and return its (not yet started) stream. Raises before any
        stream starts, so a bad item leaves nothing running."""
        streams: list[AsyncIterator[GenerateOutput]] = []
        try:
            for it in items:
                kwargs = self._engine_kwargs([it], opts)
                kwargs["sampling_params"] = kwargs["sampling_params"][0]
                kwargs["rid"] = it.rid
                if "lora_path" in kwargs:
                    kwargs["lora_path"] = kwargs["lora_path"][0]
                for name in (
                    "priority",
                    "session_params",
                    "custom_logit_processor",
                    "image_data",
                    "bootstrap",
                ):
                    if name in kwargs:
                        kwargs[name] = kwargs[name][0]
                key = "input_ids" if "input_ids" in kwargs else "prompt"
                kwargs[key] = kwargs[key][0]
                call = GenerateCall(**kwargs, stream=True)
                streams.append(await self.engine.async_generate_outputs(call))
        except BaseException:
            for stream in streams:
                await _aclose(stream)
            raise
        return streams

    async def merge(
        self, streams: Sequence[AsyncIterator[GenerateOutput]]
    ) -> AsyncIterator[tuple[int, GenerateOutput]]:
        """Chunks of all streams as they come, tagged with the stream's index."""
        tracked = [self._tracked(s) for s in streams]
        if len(tracked) == 1:
            try:
                async for chunk in tracked[0]:
                    yield 0, chunk
            finally:
                await _aclose(tracked[0])
            return
        queue: asyncio.Queue[tuple[int, GenerateOutput | None, BaseException | None]]
        queue = asyncio.Queue()

        async def pump(index: int, stream: AsyncIterator[GenerateOutput]) -> None:
            try:
                async for chunk in stream:
                    queue.put_nowait((index, chunk, None))
            except Exception as exc:
                queue.put_nowait((index, None, exc))
                return
            queue.put_nowait((index, None, None))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(tracked)]
        try:
            remaining = len(tasks)
            while remaining:
                index, chunk, exc = await queue.get()
                if exc is not None:
                    raise exc
                if chunk is None:
                    remaining -= 1
                    continue
                yield index, chunk
        finally:
            # Cancelling a pump closes its engine stream, which aborts that request.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for stream in tracked:
                await _aclose(stream)

    async def _tracked(
        self, stream: AsyncIterator[GenerateOutput]
    ) -> AsyncIterator[GenerateOutput]:
        tracker = self.metrics.stream_tracker() if self.metrics is not None else None
        try:
            async for chunk in stream:
                if tracker is not None:
                    tracker.on_chunk(chunk)
                yield chunk
        finally:
            await _aclose(stream)


async def _aclose(stream: Any) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
