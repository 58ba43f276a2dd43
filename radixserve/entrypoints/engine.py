"""The offline Engine: SGLang's `Engine` API for batch use in Python.

engine = Engine(model_path=..., **server_args)
engine.generate("Hello", {"max_new_tokens": 16, "temperature": 0})

Longer than this project's ~450-line norm because it is SGLang's whole Engine surface, one
small method per control call, with generate's keyword arguments spelled out in both the sync
and async forms (SGLang's signature); the request building is in engine_inputs.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from radixserve.entrypoints.engine_inputs import (
    Built,
    GenerateCall,
    InputIds,
    Params,
    Prompt,
    expand_call,
    normalise_inputs,
    per_item,
)
from radixserve.lora.config import LoRAError, lora_config_from_args
from radixserve.lora.registry import LoRARef, LoRARegistry
from radixserve.managers.grammar_backend import make_grammar_backend
from radixserve.managers.inprocess_runtime import InProcessRuntime
from radixserve.managers.lora_scheduling import LoRAInUse
from radixserve.managers.multiprocess_runtime import MultiProcessRuntime
from radixserve.managers.outputs import GenerateOutput
from radixserve.managers.process_utils import apply_gc_threshold
from radixserve.managers.runtime_control import check_pause_mode
from radixserve.managers.scheduler_factory import EarlyTokenizer
from radixserve.managers.tokenizer_manager import RequestError, RequestState, TokenizerManager
from radixserve.messages import (
    BootstrapInfo,
    CloseSessionReq,
    ContinueGenerationReq,
    ExpertDistributionReq,
    FlushCacheReq,
    GetInfoReq,
    GetWeightsByNameReq,
    LoadLoRAReq,
    OpenSessionReq,
    PauseGenerationReq,
    RadixTreeReq,
    ReleaseMemoryReq,
    ReqOutput,
    ResumeMemoryReq,
    TokenizedGenerateReq,
    UnloadLoRAReq,
    UpdateWeightsFromDiskReq,
)
from radixserve.multimodal.media_fetch import MediaFetchPolicy
from radixserve.multimodal.request_images import (
    ImageData,
    RequestImages,
    image_limit,
)
from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

# /unload_lora_adapter waits this long for requests using the adapter to finish.
UNLOAD_WAIT_S = 60.0
UNLOAD_POLL_S = 0.05
# A weight update first waits for the running requests to finish.
WEIGHT_UPDATE_TIMEOUT_S = 1800.0


class Engine:
    """SGLang's offline Engine.

    Keyword arguments are ServerArgs fields (SGLang's names), e.g. `mem_fraction_static=0.5`.
    `runtime="process"` (the default, as in SGLang) runs the scheduler and the detokenizer in
    child processes; `runtime="thread"` runs them on a thread of this process, which starts
    faster and exposes `engine.scheduler` for inspection.
    """

    def __init__(
        self,
        server_args: ServerArgs | None = None,
        runtime: str = "process",
        on_spawned: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        # Offline use logs errors only unless asked (SGLang's Engine does the same): INFO lines
        # from the child processes would interleave with what the program prints.
        self.server_args = server_args or ServerArgs.from_kwargs(**{"log_level": "error", **kwargs})
        args = self.server_args
        # Checked before any process starts: a bad --lora-paths fails fast.
        self.lora = LoRARegistry(lora_config_from_args(args))
        image_cap = image_limit(args.limit_mm_data_per_request)
        media_fetch = MediaFetchPolicy.from_options(
            args.media_url_max_file_size_mb, args.allowed_media_domains
        )
        apply_gc_threshold(args.gc_threshold)
        self.runtime: InProcessRuntime | MultiProcessRuntime
        if runtime == "thread":
            self.runtime = InProcessRuntime(args)
            self.tokenizer = self.runtime.tokenizer
        elif runtime == "process":
            early = EarlyTokenizer(args, start=False)  # loads while the model loads

            def spawned() -> None:
                early.start()
                if on_spawned is not None:
                    on_spawned()

            self.runtime = MultiProcessRuntime(args, on_spawned=spawned)
            ready = self.runtime.ready
            self.tokenizer = early.get(ready.model_dir, ready.tokenizer_class)
        else:
            raise ValueError(f"runtime must be 'process' or 'thread', not {runtime!r}")
        self.model_info = self.runtime.ready
        tokenizer = self.tokenizer
        eos = [tokenizer.eos_token_id] if tokenizer is not None else []
        self.tokenizer_manager = TokenizerManager(
            tokenizer,
            self.model_info.vocab_size,
            self.model_info.context_len,
            lambda: make_grammar_backend(args, tokenizer, self.model_info.vocab_size, eos),
        )
        self.tokenizer_manager.enable_custom_logit_processor = bool(
            args.enable_custom_logit_processor
        )
        self.tokenizer_manager.enable_return_routed_experts = bool(
            args.enable_return_routed_experts
        )
        self.tokenizer_manager.images = RequestImages(
            getattr(self.model_info, "image_prompt", None),
            image_cap,
            media_fetch,
            self.model_info.model_dir,
        )

    @property
    def scheduler(self) -> Any:
        """The live Scheduler (runtime="thread" only)."""
        if not isinstance(self.runtime, InProcessRuntime):
            raise AttributeError("engine.scheduler is only available with runtime='thread'")
        return self.runtime.scheduler

    # -- context manager --------------------------------------------------------------------
    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        self.runtime.shutdown()

    # -- generation -------------------------------------------------------------------------
    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: Params = None,
        input_ids: InputIds = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
        rid: str | Sequence[str] | None = None,
        priority: int | Sequence[int | None] | None = None,
        lora_path: str | Sequence[str | None] | None = None,
        session_params: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        custom_logit_processor: str | Sequence[str | None] | None = None,
        token_ids_logprob: Sequence[int] | None = None,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        image_data: ImageData = None,
        bootstrap: BootstrapInfo | Sequence[BootstrapInfo | None] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """One prompt gives one dict; a list gives a list (n > 1 gives n dicts per prompt,
        prompt-major). With stream=True, an iterator of chunks whose "text" is the new text.
        The dicts are SGLang's; `generate_outputs` gives the typed results."""
        call = GenerateCall(
            prompt,
            sampling_params,
            input_ids,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            stream,
            rid,
            priority,
            lora_path,
            session_params,
            custom_logit_processor,
            token_ids_logprob,
            return_routed_experts,
            routed_experts_start_len,
            image_data,
            bootstrap,
        )
        return _json_of(self.generate_outputs(call))

    def generate_outputs(
        self, call: GenerateCall
    ) -> GenerateOutput | list[GenerateOutput] | Iterator[GenerateOutput]:
        """`generate` with typed results (managers/outputs.py)."""
        items, single = self._expand(call)
        if call.stream:
            return self._stream(*items[0])
        sinks = [self._submit(msg) for msg, _ in items]
        results = [
            self._collect(state, sink) for (_, state), sink in zip(items, sinks, strict=True)
        ]
        return results[0] if single else results

    async def async_generate(
        self,
        prompt: Prompt = None,
        sampling_params: Params = None,
        input_ids: InputIds = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
        rid: str | Sequence[str] | None = None,
        priority: int | Sequence[int | None] | None = None,
        lora_path: str | Sequence[str | None] | None = None,
        session_params: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        custom_logit_processor: str | Sequence[str | None] | None = None,
        token_ids_logprob: Sequence[int] | None = None,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        image_data: ImageData = None,
        bootstrap: BootstrapInfo | Sequence[BootstrapInfo | None] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]] | AsyncIterator[dict[str, Any]]:
        """`generate` for an event loop; `async_generate_outputs` gives the typed results."""
        call = GenerateCall(
            prompt,
            sampling_params,
            input_ids,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            stream,
            rid,
            priority,
            lora_path,
            session_params,
            custom_logit_processor,
            token_ids_logprob,
            return_routed_experts,
            routed_experts_start_len,
            image_data,
            bootstrap,
        )
        results = await self.async_generate_outputs(call)
        if isinstance(results, GenerateOutput | list):
            return _json_of(results)
        return _ajson_stream(results)

    async def async_generate_outputs(
        self, call: GenerateCall
    ) -> GenerateOutput | list[GenerateOutput] | AsyncIterator[GenerateOutput]:
        """`async_generate` with typed results (managers/outputs.py): what the HTTP routes use."""
        expand = functools.partial(self._expand, call, check_grammar=False)
        # Images are decoded and hashed while the request is built: off the event loop.
        items, single = await asyncio.to_thread(expand) if call.image_data else expand()
        # Compiling a grammar can take seconds: await it here instead of blocking the loop.
        # (Copies of one request share a compile through the backend's cache.)
        await asyncio.gather(
            *(self.tokenizer_manager.check_grammar_async(msg.sampling_params) for msg, _ in items)
        )
        if call.stream:
            return self._astream(*items[0])
        results = await asyncio.gather(*(self._acollect(msg, state) for msg, state in items))
        return results[0] if single else list(results)

    def encode(
        self,
        prompt: Prompt = None,
        input_ids: InputIds = None,
        rid: str | Sequence[str] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Embeddings (an --is-embedding server): {"embedding": [...], "meta_info": {...}} per
        prompt; the last token's final hidden state, L2-normalised."""
        items, single = self._expand_embedding(prompt, input_ids, rid)
        sinks = [self._submit(msg) for msg, _ in items]
        results = [
            self._collect(state, sink) for (_, state), sink in zip(items, sinks, strict=True)
        ]
        return _json_of(results[0] if single else results)

    async def async_encode(
        self,
        prompt: Prompt = None,
        input_ids: InputIds = None,
        rid: str | Sequence[str] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        return _json_of(await self.async_encode_outputs(prompt, input_ids, rid))

    async def async_encode_outputs(
        self,
        prompt: Prompt = None,
        input_ids: InputIds = None,
        rid: str | Sequence[str] | None = None,
    ) -> GenerateOutput | list[GenerateOutput]:
        """`async_encode` with typed results (each with `embedding` set)."""
        items, single = self._expand_embedding(prompt, input_ids, rid)
        results = await asyncio.gather(*(self._acollect(msg, state) for msg, state in items))
        return results[0] if single else list(results)

    def _expand_embedding(
        self, prompt: Prompt, input_ids: InputIds, rid: Any
    ) -> tuple[list[tuple[TokenizedGenerateReq, RequestState]], bool]:
        if not self.server_args.is_embedding:
            raise RequestError("This server does not serve an embedding model (--is-embedding).")
        prompts, ids_list, single = normalise_inputs(prompt, input_ids)
        count = len(prompts) if prompts is not None else len(ids_list or [])
        rids = per_item(rid, count, "rid")
        items = [
            self.tokenizer_manager.build_request(
                prompt=prompts[i] if prompts is not None else None,
                input_ids=ids_list[i] if ids_list is not None else None,
                sampling_params={"max_new_tokens": 0},
                rid=rids[i],
                embedding=True,
            )
            for i in range(count)
        ]
        return items, single

    def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None:
        self.runtime.abort(rid, abort_all)

    def flush_cache(self) -> bool:
        return bool(self.runtime.call(FlushCacheReq()))

    def start_expert_distribution_record(self) -> None:
        """Count each MoE layer's routings per expert from zero (needs
        --expert-distribution-recorder-mode stat)."""
        self.runtime.call(ExpertDistributionReq("start"))

    def stop_expert_distribution_record(self) -> None:
        self.runtime.call(ExpertDistributionReq("stop"))

    def dump_expert_distribution_record(self) -> str:
        """Save the counts (layers/moe/expert_record.py); the file's path."""
        return str(self.runtime.call(ExpertDistributionReq("dump")))

    def pause_generation(self, mode: str = "abort") -> None:
        """SGLang's modes: "abort" (end every request), "retract" (running requests give their
        KV back and wait), "in_place" (keep them as they are). New requests wait meanwhile."""
        check_pause_mode(mode)
        self.runtime.call(PauseGenerationReq(mode))

    def continue_generation(self) -> None:
        self.runtime.call(ContinueGenerationReq())

    def open_session(
        self, capacity_of_str_len: int | None = None, session_id: str | None = None
    ) -> str:
        return str(self.runtime.call(OpenSessionReq(session_id, capacity_of_str_len)))

    def close_session(self, session_id: str) -> None:
        self.runtime.call(CloseSessionReq(session_id))

    def update_weights_from_disk(
        self,
        model_path: str,
        load_format: str | None = None,
        abort_all_requests: bool = False,
        timeout: float = WEIGHT_UPDATE_TIMEOUT_S,
    ) -> dict[str, Any]:
        """New weights of the same architecture, without a restart. Started requests finish
        first (or are aborted with abort_all_requests); {"success", "message", ...}."""
        req = UpdateWeightsFromDiskReq(model_path, load_format, abort_all_requests)
        return dict(self.runtime.call(req, timeout=timeout))

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list[Any]:
        return list(self.runtime.call(GetWeightsByNameReq(name, truncate_size)))

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.runtime.call(ReleaseMemoryReq(tags))

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.runtime.call(ResumeMemoryReq(tags), timeout=WEIGHT_UPDATE_TIMEOUT_S)

    def get_server_info(self) -> dict[str, Any]:
        info = dict(self.runtime.call(GetInfoReq()))
        # --attention-backend keeps SGLang's name (intel_amx) on every CPU; this says what runs.
        info.setdefault("kernels", getattr(self.model_info, "kernels", ""))
        return info

    def get_radix_tree(self, max_nodes: int = 120) -> dict[str, Any] | None:
        """A bounded picture of the scheduler's radix tree (mem_cache/tree_snapshot.py), or None
        when the radix cache is disabled."""
        return self.runtime.call(RadixTreeReq(max_nodes))

    def is_alive(self) -> bool:
        return self.runtime.is_alive()

    # -- LoRA adapters ----------------------------------------------------------------------
    def load_lora_adapter(
        self, lora_name: str, lora_path: str, pinned: bool = False
    ) -> dict[str, Any]:
        """Load a PEFT adapter folder at run time (SGLang's /load_lora_adapter). The folder must
        lie inside the allowed folders (radixserve.lora.registry); errors are LoRAError (400)."""
        if not self.lora.enabled:
            raise LoRAError("LoRA is not enabled on this server (start it with --enable-lora).")
        if not isinstance(pinned, bool):
            raise LoRAError("pinned must be true or false.", "pinned")
        path = self.lora.check_path(lora_path)
        lora_id = self.lora.begin_load(lora_name, pinned)
        ref = None
        try:
            info = self.runtime.call(LoadLoRAReq(lora_id, lora_name, path, pinned))
            ref = LoRARef(lora_id, lora_name, path, pinned)
        finally:
            self.lora.end_load(ref, lora_name)
        return {"success": True, "message": "", "loaded_adapters": self._adapter_paths(), **info}

    def unload_lora_adapter(self, lora_name: str, wait_s: float = UNLOAD_WAIT_S) -> dict[str, Any]:
        """Unload an adapter: new requests naming it are refused at once; the unload itself
        waits (up to wait_s) for the requests already using it to finish, and is refused if
        they do not, so no running request ever loses its adapter."""
        if not self.lora.enabled:
            raise LoRAError("LoRA is not enabled on this server (start it with --enable-lora).")
        ref = self.lora.begin_unload(lora_name)
        unloaded = False
        deadline = time.monotonic() + wait_s
        try:
            while True:
                try:
                    self.runtime.call(UnloadLoRAReq(ref.lora_id))
                    unloaded = True
                    break
                except LoRAInUse as exc:
                    if time.monotonic() >= deadline:
                        raise LoRAError(
                            f"LoRA adapter {lora_name!r} is still in use after {wait_s:g} s "
                            f"({exc}); it stays loaded.",
                            "lora_name",
                        ) from None
                    time.sleep(UNLOAD_POLL_S)
        finally:
            self.lora.end_unload(ref, unloaded)
        return {"success": True, "message": "", "loaded_adapters": self._adapter_paths()}

    def _adapter_paths(self) -> dict[str, str]:
        return {ref.name: ref.path for ref in self.lora.refs()}

    # -- internals --------------------------------------------------------------------------
    def _expand(self, call: GenerateCall, check_grammar: bool = True) -> tuple[list[Built], bool]:
        if self.server_args.is_embedding:
            raise RequestError(
                "This server serves an embedding model: use encode (or /v1/embeddings).", "model"
            )
        return expand_call(call, self.tokenizer_manager, self.lora.resolve, check_grammar)

    def _submit(self, msg: TokenizedGenerateReq) -> queue.Queue[ReqOutput]:
        sink: queue.Queue[ReqOutput] = queue.Queue()
        self.runtime.submit(msg, sink.put)
        return sink

    def _collect(self, state: RequestState, sink: queue.Queue[ReqOutput]) -> GenerateOutput:
        while True:
            out = sink.get()
            self.tokenizer_manager.apply_output(state, out)
            if out.finished is not None:
                return self.tokenizer_manager.final_result(state, out)

    def _stream(self, msg: TokenizedGenerateReq, state: RequestState) -> Iterator[GenerateOutput]:
        sink = self._submit(msg)
        finished = False
        try:
            while not finished:
                out = sink.get()
                finished = out.finished is not None
                yield self.tokenizer_manager.apply_output(state, out)
        finally:
            if not finished:  # the consumer stopped early: free the request's KV
                self.runtime.abort(msg.rid)

    async def _acollect(self, msg: TokenizedGenerateReq, state: RequestState) -> GenerateOutput:
        async for out in self._aoutputs(msg):
            self.tokenizer_manager.apply_output(state, out)
            if out.finished is not None:
                return self.tokenizer_manager.final_result(state, out)
        raise RuntimeError("request ended without a finish reason")  # unreachable by design

    async def _astream(
        self, msg: TokenizedGenerateReq, state: RequestState
    ) -> AsyncIterator[GenerateOutput]:
        async for out in self._aoutputs(msg):
            yield self.tokenizer_manager.apply_output(state, out)

    async def _aoutputs(self, msg: TokenizedGenerateReq) -> AsyncIterator[ReqOutput]:
        """Scheduler outputs for one request, ending with the finished one; aborts the request
        if the consumer stops early."""
        aloop = asyncio.get_running_loop()
        aqueue: asyncio.Queue[ReqOutput] = asyncio.Queue()
        self.runtime.submit(msg, lambda out: aloop.call_soon_threadsafe(aqueue.put_nowait, out))
        finished = False
        try:
            while not finished:
                out = await aqueue.get()
                finished = out.finished is not None
                yield out
        finally:
            if not finished:
                self.runtime.abort(msg.rid)


# -- the JSON edge: SGLang's Engine returns dicts ---------------------------------------------
def _json_of(
    results: GenerateOutput | list[GenerateOutput] | Iterator[GenerateOutput],
) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
    if isinstance(results, GenerateOutput):
        return results.to_json()
    if isinstance(results, list):
        return [r.to_json() for r in results]
    return _json_stream(results)


def _json_stream(chunks: Iterator[GenerateOutput]) -> Iterator[dict[str, Any]]:
    try:
        for chunk in chunks:
            yield chunk.to_json()
    finally:
        # Closing this iterator early must close the engine's, which aborts the request.
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


async def _ajson_stream(chunks: AsyncIterator[GenerateOutput]) -> AsyncIterator[dict[str, Any]]:
    try:
        async for chunk in chunks:
            yield chunk.to_json()
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
