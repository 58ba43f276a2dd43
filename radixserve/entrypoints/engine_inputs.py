"""One Engine.generate call as a typed object (SGLang's GenerateReqInput, for the Python API),
and its expansion into one tokenized request per prompt and sample: the per-prompt lists are
checked against the prompt count, `n` is expanded here (the HTTP routes expand theirs into
GenItems first, entrypoints/generation.py), and each item is built and validated by the
TokenizerManager."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixserve.managers.tokenizer_manager import RequestError, RequestState, TokenizerManager
from radixserve.messages import BootstrapInfo, TokenizedGenerateReq
from radixserve.multimodal.request_images import ImageData, per_prompt_images

Prompt = str | Sequence[str] | None
InputIds = Sequence[int] | Sequence[Sequence[int]] | None
Params = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None
Built = tuple[TokenizedGenerateReq, RequestState]


@dataclass(frozen=True)
class GenerateCall:
    """Engine.generate's arguments: one value for every prompt, or a list with one per prompt
    (sampling_params, rid, priority, lora_path, session_params, custom_logit_processor,
    image_data, bootstrap)."""

    prompt: Prompt = None
    sampling_params: Params = None
    input_ids: InputIds = None
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    stream: bool = False
    rid: str | Sequence[str] | None = None
    priority: int | Sequence[int | None] | None = None
    lora_path: str | Sequence[str | None] | None = None
    session_params: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None
    custom_logit_processor: str | Sequence[str | None] | None = None
    token_ids_logprob: Sequence[int] | None = None
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    image_data: ImageData = None
    bootstrap: BootstrapInfo | Sequence[BootstrapInfo | None] | None = None


def expand_call(
    call: GenerateCall,
    tokenizer_manager: TokenizerManager,
    resolve_lora: Callable[[str | None], int],
    check_grammar: bool = True,
) -> tuple[list[Built], bool]:
    """One built request per prompt and sample (prompt-major), and whether the call named a
    single prompt with one sample (its result is then one dict, not a list)."""
    prompts, ids_list, single = normalise_inputs(call.prompt, call.input_ids)
    count = len(prompts) if prompts is not None else len(ids_list or [])
    params_list = per_item(call.sampling_params, count, "sampling_params")
    rids = per_item(call.rid, count, "rid")
    # lora_path: one adapter name for every prompt, or a list, one per prompt (None: base).
    lora_ids = [resolve_lora(name) for name in per_item(call.lora_path, count, "lora_path")]
    priorities = per_item(call.priority, count, "priority")
    processors = per_item(call.custom_logit_processor, count, "custom_logit_processor")
    images = per_prompt_images(call.image_data, count)
    # A session_params dict is one value (a Mapping), so only a list is per prompt.
    sessions = per_item(call.session_params, count, "session_params")
    rooms = per_item(call.bootstrap, count, "bootstrap")
    items: list[Built] = []
    for i in range(count):
        params = dict(params_list[i] or {})
        n = int(params.pop("n", 1) or 1)
        if n < 1:
            raise RequestError("n must be at least 1.", "n")
        for copy in range(n):
            msg, state = tokenizer_manager.build_request(
                prompt=prompts[i] if prompts is not None else None,
                input_ids=ids_list[i] if ids_list is not None else None,
                sampling_params=params,
                rid=rids[i] if rids[i] is None or n == 1 else f"{rids[i]}-{copy}",
                return_logprob=call.return_logprob,
                logprob_start_len=call.logprob_start_len,
                top_logprobs_num=call.top_logprobs_num,
                stream=call.stream,
                priority=priorities[i],
                check_grammar=check_grammar,
                session_params=sessions[i],
                custom_logit_processor=processors[i],
                token_ids_logprob=call.token_ids_logprob,
                return_routed_experts=call.return_routed_experts,
                routed_experts_start_len=call.routed_experts_start_len,
                image_data=images[i],
            )
            msg.lora_id = lora_ids[i]
            msg.bootstrap = rooms[i]
            items.append((msg, state))
        single = single and n == 1
    if call.stream and len(items) != 1:
        raise RequestError("stream=True takes a single prompt with n=1.", "stream")
    return items, single


def normalise_inputs(
    prompt: Prompt, input_ids: InputIds
) -> tuple[list[str] | None, list[list[int]] | None, bool]:
    """(prompts, or token id lists, and whether one prompt was given rather than a list)."""
    if (prompt is None) == (input_ids is None):
        raise RequestError("Exactly one of prompt and input_ids must be given.", "prompt")
    if prompt is not None:
        if isinstance(prompt, str):
            return [prompt], None, True
        return list(prompt), None, False
    assert input_ids is not None
    if len(input_ids) > 0 and all(isinstance(x, int) for x in input_ids):
        return None, [list(input_ids)], True  # type: ignore[arg-type]
    return None, [list(x) for x in input_ids], False  # type: ignore[union-attr]


def per_item(value: Any, count: int, name: str) -> list[Any]:
    """`value` for each of `count` prompts: a list or tuple must have one entry per prompt."""
    if isinstance(value, list | tuple):
        if len(value) != count:
            raise RequestError(f"{name} has {len(value)} entries for {count} prompts.", name)
        return list(value)
    return [value] * count
