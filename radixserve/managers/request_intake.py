"""A tokenized request becomes a scheduler Req, or the reason it is refused (a 400).

The checks that need the scheduler's state live here: the prompt against the context length
and the whole KV pool, the LoRA adapter still loaded, images on a model that reads them, the
custom logit processor and routed experts only when enabled, priorities when priority
scheduling is off, and a session continuation's saved tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixserve.errors import InvalidRequestError
from radixserve.managers.runtime_control import PRIORITY_DISABLED_MESSAGE
from radixserve.managers.schedule_batch import Req
from radixserve.managers.sessions import SessionController, SessionError
from radixserve.messages import ROUTED_EXPERTS_DISABLED, TokenizedGenerateReq
from radixserve.sampling.custom_logit_processor import DISABLED_MESSAGE as CUSTOM_LOGIT_DISABLED
from radixserve.sampling.custom_logit_processor import load_processor

if TYPE_CHECKING:
    from radixserve.server_args import ServerArgs


@dataclass(frozen=True)
class IntakeLimits:
    context_len: int
    kv_pool_tokens: int
    default_priority: int
    enable_priority_scheduling: bool
    abort_on_priority_when_disabled: bool
    enable_custom_logit_processor: bool
    enable_return_routed_experts: bool

    @classmethod
    def from_args(cls, args: ServerArgs, context_len: int, kv_pool_tokens: int) -> IntakeLimits:
        return cls(
            context_len=context_len,
            kv_pool_tokens=kv_pool_tokens,
            default_priority=args.default_priority_value or 0,
            enable_priority_scheduling=bool(args.enable_priority_scheduling),
            abort_on_priority_when_disabled=bool(args.abort_on_priority_when_disabled),
            enable_custom_logit_processor=bool(args.enable_custom_logit_processor),
            enable_return_routed_experts=bool(args.enable_return_routed_experts),
        )


@dataclass
class Intake:
    """The request built from a message; `error` set when it must be refused; `replaced`:
    rids its session turn cut off (the scheduler aborts them)."""

    req: Req
    error: str | None
    replaced: list[str]


class RequestIntake:
    def __init__(
        self,
        limits: IntakeLimits,
        sessions: SessionController,
        has_adapter: Callable[[int], bool],
        image_refusal: Callable[[Req, TokenizedGenerateReq], str | None],
    ) -> None:
        self.limits = limits
        self.sessions = sessions
        self.has_adapter = has_adapter
        self.image_refusal = image_refusal

    def build(self, msg: TokenizedGenerateReq) -> Intake:
        limits = self.limits
        # A copy: the scheduler fills in max_new_tokens, and an in-process runtime shares the
        # message with the API side.
        params = dataclasses.replace(msg.sampling_params)
        if msg.embedding:
            params.max_new_tokens = 0
        input_ids, problem, replaced = self._session_input(msg)
        if not msg.embedding and params.max_new_tokens is None:  # up to the context length
            params.max_new_tokens = max(limits.context_len - len(input_ids), 0)
        req = Req(
            rid=msg.rid,
            origin_input_ids=input_ids,
            sampling_params=params,
            return_logprob=msg.return_logprob,
            logprob_start_len=msg.logprob_start_len,
            top_logprobs_num=msg.top_logprobs_num,
            token_ids_logprob=msg.token_ids_logprob,
            priority=msg.priority if msg.priority is not None else limits.default_priority,
            is_embedding=msg.embedding,
            lora_id=msg.lora_id,
            custom_logit_processor=msg.custom_logit_processor,
            return_routed_experts=msg.return_routed_experts,
            routed_experts_start_len=msg.routed_experts_start_len,
            session_id=(msg.session_params or {}).get("id") if problem is None else None,
            bootstrap=msg.bootstrap,
        )
        error = (
            problem
            or self._admission_error(req)
            or self.image_refusal(req, msg)
            or self._processor_error(req)
            or self._routed_experts_error(req)
        )
        if error is None and msg.priority is not None and not limits.enable_priority_scheduling:
            # SGLang ignores the value unless told to refuse it.
            error = PRIORITY_DISABLED_MESSAGE if limits.abort_on_priority_when_disabled else None
        return Intake(req, error, replaced)

    def _session_input(self, msg: TokenizedGenerateReq) -> tuple[list[int], str | None, list[str]]:
        """The request's input ids (a session continuation prepends its saved tokens), or the
        reason its session_params cannot be honoured; and the requests its turn replaces."""
        if msg.session_params is None:
            return list(msg.input_ids), None, []
        try:
            ids, cut_off = self.sessions.build_input(msg.rid, msg.session_params, msg.input_ids)
        except SessionError as exc:
            return list(msg.input_ids), str(exc), []
        return ids, None, list(cut_off)

    def _routed_experts_error(self, req: Req) -> str | None:
        # TokenizerManager.build_request refuses it first; a message built another way is
        # refused here, so a scheduler without the flag never captures.
        if req.return_routed_experts and not self.limits.enable_return_routed_experts:
            return ROUTED_EXPERTS_DISABLED
        return None

    def _processor_error(self, req: Req) -> str | None:
        if req.custom_logit_processor is None:
            return None
        if not self.limits.enable_custom_logit_processor:
            return CUSTOM_LOGIT_DISABLED
        try:
            load_processor(req.custom_logit_processor)
        except InvalidRequestError as exc:
            return str(exc)
        return None

    def _admission_error(self, req: Req) -> str | None:
        n = len(req.origin_input_ids)
        context_len = self.limits.context_len
        pool = self.limits.kv_pool_tokens
        if n == 0:
            return "The prompt is empty."
        if req.lora_id and not self.has_adapter(req.lora_id):
            return "The request's LoRA adapter is not loaded (it was unloaded meanwhile)."
        if n >= context_len:
            return (
                f"The prompt has {n} tokens, which does not fit the model's context length "
                f"of {context_len} tokens."
            )
        if n + req.max_new_tokens > context_len:
            return (
                f"Requested token count exceeds the model's maximum context length of "
                f"{context_len} tokens: {n} prompt tokens + {req.max_new_tokens} new tokens."
            )
        if n + req.max_new_tokens > pool:
            return (
                f"The request needs {n + req.max_new_tokens} KV tokens but the whole KV cache "
                f"holds {pool}; raise --max-total-tokens or lower max_new_tokens."
            )
        return None
