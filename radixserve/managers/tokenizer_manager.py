"""The API side of a request: tokenize and validate inputs, build scheduler messages, and turn
scheduler outputs back into typed results (managers/outputs.py; incremental text for streams).

It never imports model code: the scheduler may live in another thread or process.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixserve.errors import InvalidRequestError
from radixserve.managers.outputs import GenerateOutput, MetaInfo
from radixserve.managers.session_params import SessionError, SessionParams
from radixserve.messages import (
    ROUTED_EXPERTS_DISABLED,
    ImageInput,
    ReqOutput,
    TokenizedGenerateReq,
)
from radixserve.multimodal.request_images import RequestImages
from radixserve.sampling.constrained import GrammarError, GrammarSpec, spec_from_sampling_params
from radixserve.sampling.custom_logit_processor import DISABLED_MESSAGE as CUSTOM_LOGIT_DISABLED
from radixserve.sampling.custom_logit_processor import check_serialized
from radixserve.sampling.sampling_params import SamplingParams
from radixserve.speculative.meta import spec_meta_info

# Sampling parameters that make a request constrained (see spec_from_sampling_params).


class RequestError(InvalidRequestError):
    """A request the engine refuses; `param` names the offending field."""


@dataclass
class RequestState:
    rid: str
    prompt_tokens: int
    return_logprob: bool
    start_time: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    output_token_logprobs: list[list[Any]] = field(default_factory=list)
    output_top_logprobs: list[Any] = field(default_factory=list)
    input_token_logprobs: list[list[Any]] = field(default_factory=list)
    input_top_logprobs: list[Any] = field(default_factory=list)
    output_token_ids_logprobs: list[Any] = field(default_factory=list)
    input_token_ids_logprobs: list[Any] = field(default_factory=list)
    # Whether the request named token_ids_logprob (MetaInfo then carries their logprobs).
    has_token_ids_logprob: bool = False


class TokenizerManager:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        context_len: int,
        make_grammar_backend: Callable[[], Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.context_len = context_len
        self._make_grammar_backend = make_grammar_backend
        # --enable-custom-logit-processor (set by the Engine): else such requests answer 400.
        self.enable_custom_logit_processor = False
        # --enable-return-routed-experts (set by the Engine): likewise.
        self.enable_return_routed_experts = False
        # A vision model's placeholder and the per-request image limit (set by the Engine).
        self.images = RequestImages(None)
        self._grammar_backend: Any = None
        self._grammar_backend_lock = threading.Lock()

    def _check_grammar(self, params: SamplingParams) -> None:
        """Compile a constrained request's grammar here too (cached), so an invalid regex,
        schema or grammar is a 400 naming the field before anything is queued or streamed.
        Blocks up to the compile deadline: an event loop awaits `check_grammar_async`."""
        spec = _grammar_spec(params)
        if spec is None:
            return
        try:
            self._grammar_backend_for(spec).compile(spec)
        except GrammarError as exc:
            raise RequestError(str(exc), exc.param) from exc

    async def check_grammar_async(self, params: SamplingParams) -> None:
        """`_check_grammar` for a built request's sampling parameters, without blocking the
        event loop: the backend is built (first use) on a worker thread, and the compile, which
        runs on its own thread, is awaited."""
        spec = _grammar_spec(params)
        if spec is None:
            return
        backend = self._grammar_backend
        if backend is None:
            backend = await asyncio.to_thread(self._grammar_backend_for, spec)
        try:
            await asyncio.wrap_future(backend.compile_async(spec))
        except GrammarError as exc:
            raise RequestError(str(exc), exc.param) from exc

    def _grammar_backend_for(self, spec: GrammarSpec) -> Any:
        with self._grammar_backend_lock:
            if self._grammar_backend is None and self._make_grammar_backend is not None:
                try:
                    self._grammar_backend = self._make_grammar_backend()
                except ImportError as exc:
                    raise RequestError(
                        f"Structured outputs are unavailable: {exc}", spec.param
                    ) from exc
            if self._grammar_backend is None:
                raise RequestError(
                    "Structured outputs are disabled on this server (--grammar-backend none).",
                    spec.param,
                )
            return self._grammar_backend

    # -- requests ---------------------------------------------------------------------------
    def tokenize(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise RequestError("Text prompts need a tokenizer (--skip-tokenizer-init is set).")
        return list(self.tokenizer.encode(prompt, add_special_tokens=True))

    def build_request(
        self,
        *,
        prompt: str | None,
        input_ids: Sequence[int] | None,
        sampling_params: Mapping[str, Any] | None,
        rid: str | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
        priority: int | None = None,
        embedding: bool = False,
        check_grammar: bool = True,
        session_params: Mapping[str, Any] | None = None,
        custom_logit_processor: str | None = None,
        token_ids_logprob: Any = None,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        image_data: Sequence[str] | None = None,
    ) -> tuple[TokenizedGenerateReq, RequestState]:
        """Validate one request; raise RequestError (an InvalidRequestError) naming the bad field.
        check_grammar=False leaves the grammar to `check_grammar_async` (async callers)."""
        if (prompt is None) == (input_ids is None):
            raise RequestError("Exactly one of text (prompt) and input_ids must be given.", "text")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise RequestError("The prompt must be a string.", "text")
            ids = self.tokenize(prompt)
        else:
            ids = self._check_ids(input_ids)
        if not ids:
            raise RequestError(
                "The prompt is empty.", "text" if prompt is not None else "input_ids"
            )
        params = SamplingParams.from_dict(sampling_params)
        if custom_logit_processor is not None:
            if not self.enable_custom_logit_processor:
                raise RequestError(CUSTOM_LOGIT_DISABLED, "custom_logit_processor")
            check_serialized(custom_logit_processor)
        params.verify(self.vocab_size, with_custom_processor=custom_logit_processor is not None)
        if return_routed_experts and not self.enable_return_routed_experts:
            raise RequestError(ROUTED_EXPERTS_DISABLED, "return_routed_experts")
        if (
            isinstance(routed_experts_start_len, bool)
            or not isinstance(routed_experts_start_len, int)
            or routed_experts_start_len < 0
        ):
            raise RequestError(
                "routed_experts_start_len must be an integer >= 0.", "routed_experts_start_len"
            )
        images: list[ImageInput] = []
        if image_data:
            if embedding or session_params is not None:
                raise RequestError(
                    "Images are not supported in embedding or session requests.", "image_data"
                )
            ids, images = self.images.expand(ids, image_data)
        if check_grammar:
            self._check_grammar(params)
        self._check_length(len(ids), params)
        if session_params is not None:
            try:
                SessionParams.parse(session_params)
            except SessionError as exc:
                raise RequestError(str(exc), "session_params") from exc
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise RequestError("priority must be an integer.", "priority")
        logprob_ids = self._check_logprob_ids(token_ids_logprob)
        start = -1 if logprob_start_len is None else int(logprob_start_len)
        msg = TokenizedGenerateReq(
            rid=rid or uuid.uuid4().hex,
            input_ids=ids,
            sampling_params=params,
            return_logprob=bool(return_logprob),
            logprob_start_len=start if return_logprob else -1,
            top_logprobs_num=int(top_logprobs_num or 0),
            token_ids_logprob=logprob_ids if return_logprob else None,
            stream=stream,
            priority=priority,
            embedding=embedding,
            session_params=dict(session_params) if session_params is not None else None,
            custom_logit_processor=custom_logit_processor,
            return_routed_experts=bool(return_routed_experts),
            routed_experts_start_len=routed_experts_start_len,
            images=images,
        )
        state = RequestState(msg.rid, len(ids), msg.return_logprob)
        state.has_token_ids_logprob = msg.token_ids_logprob is not None
        return msg, state

    def _check_ids(self, input_ids: Sequence[int] | None) -> list[int]:
        ids = list(input_ids or [])
        for tok in ids:
            if isinstance(tok, bool) or not isinstance(tok, int):
                raise RequestError("input_ids must be a list of integers.", "input_ids")
            if not 0 <= tok < self.vocab_size:
                raise RequestError(
                    f"Token id {tok} is outside the vocabulary [0, {self.vocab_size}).",
                    "input_ids",
                )
        return ids

    def _check_logprob_ids(self, token_ids: Any) -> list[int] | None:
        """SGLang's token_ids_logprob: a list of token ids (each output position reports their
        logprobs). Anything else, or an id outside the vocabulary, is the client's error."""
        if token_ids is None:
            return None
        if not isinstance(token_ids, list | tuple) or any(
            isinstance(t, bool) or not isinstance(t, int) for t in token_ids
        ):
            raise RequestError("token_ids_logprob must be a list of integers.", "token_ids_logprob")
        for tok in token_ids:
            if not 0 <= tok < self.vocab_size:
                raise RequestError(
                    f"Token id {tok} in token_ids_logprob is outside the vocabulary "
                    f"[0, {self.vocab_size}).",
                    "token_ids_logprob",
                )
        return list(token_ids)

    def _check_length(self, n: int, params: SamplingParams) -> None:
        if n >= self.context_len:
            raise RequestError(
                f"The input ({n} tokens) is longer than the model's context length "
                f"({self.context_len} tokens).",
                "input_ids",
            )
        max_new = params.max_new_tokens or 0
        if n + max_new > self.context_len:
            # SGLang's wording, word for word: clients parse the figures out of it.
            raise RequestError(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.context_len} tokens. You requested a total of {n + max_new} tokens: "
                f"{n} tokens from the input messages and {max_new} tokens for the completion. "
                "Please reduce the number of tokens in the input messages or the completion "
                "to fit within the limit.",
                "max_new_tokens",
            )

    # -- outputs ----------------------------------------------------------------------------
    def apply_output(self, state: RequestState, out: ReqOutput) -> GenerateOutput:
        """Fold a scheduler output into the request state; return the chunk to hand out
        (its text is the new text only; the state keeps the full text)."""
        delta = out.text or ""  # the detokenizer's share
        state.text += delta
        state.output_ids.extend(out.new_token_ids)
        if state.return_logprob:
            state.output_token_logprobs.extend(
                [lp, tid, None] for lp, tid in out.output_token_logprobs
            )
            state.output_top_logprobs.extend(_top(t) for t in out.output_top_logprobs)
            state.output_token_ids_logprobs.extend(_top(t) for t in out.output_token_ids_logprobs)
            state.input_token_ids_logprobs.extend(_top(t) for t in out.input_token_ids_logprobs)
            state.input_token_logprobs.extend(
                [lp, tid, None] for lp, tid in out.input_token_logprobs
            )
            state.input_top_logprobs.extend(_top(t) for t in out.input_top_logprobs)
        return GenerateOutput(
            self._meta(state, out), text=delta, output_ids=list(out.new_token_ids)
        )

    def final_result(self, state: RequestState, last: ReqOutput) -> GenerateOutput:
        if last.embedding is not None:
            return GenerateOutput(self._meta(state, last), embedding=last.embedding)
        return GenerateOutput(
            self._meta(state, last), text=state.text, output_ids=list(state.output_ids)
        )

    def _meta(self, state: RequestState, out: ReqOutput) -> MetaInfo:
        spec = None
        if out.spec_verify_ct is not None:
            spec = spec_meta_info(
                out.spec_verify_ct,
                out.spec_accepted_tokens,
                out.spec_draft_tokens,
                out.completion_tokens,
            )
        logprobs = state.return_logprob
        # SGLang's meta_info names: per output position, [logprob, token id, text].
        ids_logprobs = logprobs and state.has_token_ids_logprob
        return MetaInfo(
            id=state.rid,
            finish_reason=out.finished,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_tokens,
            num_retractions=out.num_retractions,
            e2e_latency=time.monotonic() - state.start_time,
            cached_tokens_details=out.cached_tokens_details,
            routed_experts=out.routed_experts,  # the final output of a request that asked
            spec=spec,
            output_token_logprobs=state.output_token_logprobs if logprobs else None,
            output_top_logprobs=state.output_top_logprobs if logprobs else None,
            input_token_logprobs=state.input_token_logprobs if logprobs else None,
            input_top_logprobs=state.input_top_logprobs if logprobs else None,
            output_token_ids_logprobs=state.output_token_ids_logprobs if ids_logprobs else None,
            input_token_ids_logprobs=state.input_token_ids_logprobs if ids_logprobs else None,
        )


def _grammar_spec(params: SamplingParams) -> GrammarSpec | None:
    try:
        return spec_from_sampling_params(params)
    except GrammarError as exc:
        raise RequestError(str(exc), exc.param) from exc


def _top(entries: list[tuple[float, int]] | None) -> list[list[Any]] | None:
    if entries is None:
        return None
    return [[lp, tid, None] for lp, tid in entries]
