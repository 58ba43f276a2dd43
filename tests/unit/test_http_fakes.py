"""A fake engine for the HTTP tests: the real TokenizerManager and SamplingParams validate and
shape results; a scripted "model" replies with a fixed text, one byte-token per step.

Imported by the other test_http_* modules; it holds no tests itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from fastapi.testclient import TestClient

from radixserve.entrypoints.engine_inputs import GenerateCall
from radixserve.entrypoints.http_server import create_app
from radixserve.errors import InvalidRequestError
from radixserve.managers.detokenizer import IncrementalDetokenizer
from radixserve.managers.outputs import GenerateOutput
from radixserve.managers.runtime_control import check_pause_mode
from radixserve.managers.tokenizer_manager import RequestError, TokenizerManager
from radixserve.messages import FinishReason, ReqOutput, TokenizedGenerateReq

VOCAB = 300
CONTEXT = 128
BOS, EOS = 1, 2
REPLY = "Hello world! The answer is 42."
MODEL = "fake-org/fake-model"


class FakeTokenizer:
    """Byte-level: token id = byte + 3; ids 0-2 are pad, BOS and EOS."""

    chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    eos_token_id = EOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [b + 3 for b in text.encode("utf-8")]
        return ([BOS] if add_special_tokens else []) + ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True, **_: Any) -> str:
        out = bytearray()
        for tid in ids:
            if 3 <= tid < 259:
                out.append(tid - 3)
            elif not skip_special_tokens:
                out.extend({BOS: b"<s>", EOS: b"</s>"}.get(tid, b"<unk>"))
        return out.decode("utf-8", errors="replace")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        import jinja2

        template = jinja2.Template(chat_template or self.chat_template)
        text = template.render(messages=messages, add_generation_prompt=add_generation_prompt)
        if add_generation_prompt:
            text += "<assistant>"
        return text


def reply_tokens(count: int, reply: str = REPLY) -> list[int]:
    ids = [b + 3 for b in reply.encode("utf-8")]
    return [ids[i % len(ids)] for i in range(count)]


class FakeEngine:
    def __init__(self, **engine_opts: Any) -> None:
        self.tokenizer = FakeTokenizer()
        self.model_info = SimpleNamespace(
            vocab_size=VOCAB,
            context_len=CONTEXT,
            architectures=("FakeForCausalLM",),
            max_running_requests=4,
            model_dir="/fake/dir",
        )
        self.tokenizer_manager = TokenizerManager(self.tokenizer, VOCAB, CONTEXT)
        self.token_delay = float(engine_opts.get("token_delay", 0.0))
        self.gate: asyncio.Event | None = engine_opts.get("gate")
        self.fail_after: int | None = engine_opts.get("fail_after")
        # What the scripted model raises at fail_after (an internal failure, not a client's).
        self.fail_exc: type[Exception] = engine_opts.get("fail_exc", RuntimeError)
        self.active: dict[str, int] = {}
        self.aborted: list[str] = []
        self.abort_flags: set[str] = set()
        self.seen_prompts: set[tuple[int, ...]] = set()
        self.radix_tree: dict[str, Any] | None = None
        self.calls: list[dict[str, Any]] = []
        self.alive = True
        # The scripted reply (tool-call and reasoning tests script the model's output).
        self.reply: str = engine_opts.get("reply", REPLY)
        self.controls: list[tuple[str, Any]] = []

    # -- the engine API used by the HTTP layer ----------------------------------------------
    async def async_generate_outputs(self, call: GenerateCall) -> Any:
        """The typed results, as the real Engine's (its GenerateCall's fields as arguments)."""
        fields = {f.name: getattr(call, f.name) for f in dataclasses.fields(call)}
        return await self._generate(**fields)

    async def _generate(
        self,
        prompt: Any = None,
        sampling_params: Any = None,
        input_ids: Any = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
        rid: Any = None,
        lora_path: Any = None,
        priority: Any = None,
        session_params: Any = None,
        custom_logit_processor: Any = None,
        token_ids_logprob: Any = None,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        image_data: Any = None,
        bootstrap: Any = None,
    ) -> Any:
        if image_data is not None or bootstrap is not None:
            raise AssertionError("the fake engine takes no images and no bootstrap rooms")
        if lora_path is not None and any(
            p is not None for p in (lora_path if isinstance(lora_path, list) else [lora_path])
        ):
            # As the real Engine started without --enable-lora.
            raise RequestError("This server serves no LoRA adapters.", "lora_path")
        self.calls.append(
            {
                "prompt": prompt,
                "input_ids": input_ids,
                "sampling_params": sampling_params,
                "rid": rid,
                "stream": stream,
            }
        )
        single = isinstance(prompt, str) or (
            input_ids is not None and all(isinstance(x, int) for x in input_ids)
        )
        prompts = [prompt] if isinstance(prompt, str) else prompt
        ids_list = [input_ids] if single and input_ids is not None else input_ids
        count = len(prompts if prompts is not None else ids_list)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * count
        rids = rid if isinstance(rid, list) else [rid] * count

        def per_item(value: Any) -> list[Any]:
            return value if isinstance(value, list) else [value] * count

        priorities, sessions = per_item(priority), per_item(session_params)
        processors = per_item(custom_logit_processor)
        items = []
        for i in range(count):
            items.append(
                self.tokenizer_manager.build_request(
                    prompt=prompts[i] if prompts is not None else None,
                    input_ids=ids_list[i] if ids_list is not None else None,
                    sampling_params=params[i],
                    rid=rids[i],
                    return_logprob=return_logprob,
                    logprob_start_len=logprob_start_len,
                    top_logprobs_num=top_logprobs_num,
                    stream=stream,
                    priority=priorities[i],
                    session_params=sessions[i],
                    custom_logit_processor=processors[i],
                    token_ids_logprob=token_ids_logprob,
                    # Refused (400) as by a real engine without --enable-return-routed-experts.
                    return_routed_experts=return_routed_experts,
                    routed_experts_start_len=routed_experts_start_len,
                )
            )
        if stream:
            if count != 1:
                raise RequestError("stream=True takes a single prompt with n=1.", "stream")
            return self._stream(*items[0])
        results = await asyncio.gather(*(self._collect(m, s) for m, s in items))
        return results[0] if single else list(results)

    # -- runtime controls: recorded, with the real engine's argument checks ----------------
    def pause_generation(self, mode: str = "abort") -> None:
        check_pause_mode(mode)
        self.controls.append(("pause_generation", mode))

    def continue_generation(self) -> None:
        self.controls.append(("continue_generation", None))

    def open_session(
        self, capacity_of_str_len: int | None = None, session_id: str | None = None
    ) -> str:
        sid = session_id or uuid.uuid4().hex
        self.controls.append(("open_session", sid))
        return sid

    def close_session(self, session_id: str) -> None:
        self.controls.append(("close_session", session_id))

    def update_weights_from_disk(
        self, model_path: str, load_format: str | None = None, abort_all_requests: bool = False
    ) -> dict[str, Any]:
        self.controls.append(("update_weights_from_disk", model_path))
        return {
            "success": False,
            "message": "The fake engine has no weights.",
            "num_paused_requests": 0,
        }

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list[Any]:
        raise RequestError(f"No parameter named {name!r}.", "name")

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.controls.append(("release_memory_occupation", tags))

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.controls.append(("resume_memory_occupation", tags))

    def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None:
        targets = list(self.active) if abort_all else [rid]
        self.abort_flags.update(t for t in targets if t is not None)

    def start_expert_distribution_record(self) -> None:
        self._no_expert_recorder()

    def stop_expert_distribution_record(self) -> None:
        self._no_expert_recorder()

    def dump_expert_distribution_record(self) -> None:
        self._no_expert_recorder()

    def _no_expert_recorder(self) -> None:
        """As the engine answers for a model served without the recorder."""
        raise InvalidRequestError(
            "The expert distribution recorder is off: start the server with "
            "--expert-distribution-recorder-mode stat"
        )

    def flush_cache(self) -> bool:
        if self.active:
            return False
        self.seen_prompts.clear()
        return True

    def get_server_info(self) -> dict[str, Any]:
        used = sum(self.active.values())
        return {
            "num_running_reqs": len(self.active),
            "num_waiting_reqs": 0,
            "max_total_num_tokens": 1000,
            "max_running_requests": 4,
            "available_kv_tokens": 1000 - used,
            "cached_tokens": 0,
        }

    def get_radix_tree(self, max_nodes: int = 120) -> dict[str, Any] | None:
        return self.radix_tree

    def is_alive(self) -> bool:
        return self.alive

    def shutdown(self) -> None:
        pass

    # -- the scripted model -----------------------------------------------------------------
    async def _collect(self, msg: TokenizedGenerateReq, state: Any) -> GenerateOutput:
        async for out in self._outputs(msg):
            self.tokenizer_manager.apply_output(state, out)
            if out.finished is not None:
                return self.tokenizer_manager.final_result(state, out)
        raise AssertionError("unreachable")

    async def _stream(self, msg: TokenizedGenerateReq, state: Any) -> AsyncIterator[GenerateOutput]:
        async for out in self._outputs(msg):
            yield self.tokenizer_manager.apply_output(state, out)

    async def _outputs(self, msg: TokenizedGenerateReq) -> AsyncIterator[ReqOutput]:
        if msg.rid in self.active:
            raise InvalidRequestError(f"Duplicate request id {msg.rid!r}.", "rid")
        key = tuple(msg.input_ids)
        cached = len(key) - 1 if key in self.seen_prompts else 0
        self.seen_prompts.add(key)
        self.active[msg.rid] = len(key)
        sp = msg.sampling_params
        detok = IncrementalDetokenizer(
            self.tokenizer,
            skip_special_tokens=sp.skip_special_tokens,
            stop_strings=sp.stop or (),
            no_stop_trim=sp.no_stop_trim,
        )
        finished = False
        try:
            async for out in self._steps(msg, cached):
                finished = out.finished is not None
                matched = out.finished.matched if out.finished is not None else None
                # The detokenizer process's share of the work in the real engine.
                out.text = detok.add(
                    out.new_token_ids, finished, matched if isinstance(matched, str | int) else None
                )
                yield out
        finally:
            self.active.pop(msg.rid, None)
            if not finished:
                self.aborted.append(msg.rid)

    async def _steps(self, msg: TokenizedGenerateReq, cached: int) -> AsyncIterator[ReqOutput]:
        sp = msg.sampling_params
        max_new = sp.max_new_tokens
        limit = max_new if max_new is not None else self.model_info.context_len - len(msg.input_ids)
        stops = sp.stop or []
        stop_ids = set(sp.stop_token_ids or [])
        size = len(self.reply.encode("utf-8"))
        tokens = (
            reply_tokens(limit, self.reply)
            if sp.ignore_eos
            else reply_tokens(min(limit, size), self.reply)
        )
        if not sp.ignore_eos and limit > size:
            tokens.append(EOS)
        out_ids: list[int] = []
        if self.gate is not None:
            await self.gate.wait()
        for step, tid in enumerate(tokens):
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
            else:
                await asyncio.sleep(0)
            if self.fail_after is not None and step >= self.fail_after:
                raise self.fail_exc("/secret/host/path exploded")
            out_ids.append(tid)
            finish = self._finish(msg, out_ids, limit, stops, stop_ids)
            yield self._output(msg, tid, finish, len(out_ids), cached, first=step == 0)
            if finish is not None:
                return

    def _finish(
        self,
        msg: TokenizedGenerateReq,
        out_ids: list[int],
        limit: int,
        stops: list[str],
        stop_ids: set[int],
    ) -> FinishReason | None:
        if msg.rid in self.abort_flags:
            return FinishReason("abort", message="Aborted by the client.")
        tid = out_ids[-1]
        if tid == EOS:
            return FinishReason("stop", matched=EOS)
        if tid in stop_ids:
            return FinishReason("stop", matched=tid)
        text = self.tokenizer.decode(out_ids)
        for stop in stops:
            if stop in text:
                return FinishReason("stop", matched=stop)
        if len(out_ids) >= limit:
            return FinishReason("length")
        return None

    def _output(
        self,
        msg: TokenizedGenerateReq,
        tid: int,
        finish: FinishReason | None,
        done: int,
        cached: int,
        first: bool,
    ) -> ReqOutput:
        out = ReqOutput(msg.rid, [tid], finish, len(msg.input_ids), done, cached)
        if msg.return_logprob:
            k = msg.top_logprobs_num
            out.output_token_logprobs = [(-0.5, tid)]
            out.output_top_logprobs = [[(-0.5, tid), (-1.5, 40)][:k]] if k else []
            if first and msg.logprob_start_len >= 0:
                ids = msg.input_ids[msg.logprob_start_len :]
                out.input_token_logprobs = [
                    (None if i == 0 else -1.0, t) for i, t in enumerate(ids)
                ]
                out.input_top_logprobs = [None] * len(ids)
        return out


def server_args(**overrides: Any) -> SimpleNamespace:
    args = {
        "model_path": MODEL,
        "tokenizer_path": MODEL,
        "served_model_name": MODEL,
        "skip_server_warmup": True,
        "api_key": None,
        "admin_api_key": None,
    }
    args.update(overrides)
    return SimpleNamespace(**args)


@contextmanager
def make_client(
    engine: FakeEngine | None = None, **overrides: Any
) -> Iterator[tuple[TestClient, FakeEngine]]:
    engine = engine or FakeEngine()
    app = create_app(engine, server_args(**overrides))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, engine


def rid() -> str:
    return uuid.uuid4().hex
