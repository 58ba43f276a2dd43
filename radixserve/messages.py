"""Every payload that crosses a process (or thread) boundary between the API side and the
scheduler. Plain dataclasses of Python values, so they pickle cheaply and carry no tensors
(an image its processor tiled on the API side carries numpy pixel arrays)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixserve.sampling.sampling_params import SamplingParams

# Why a request's return_routed_experts is refused (400), on the API side and the scheduler's.
ROUTED_EXPERTS_DISABLED = (
    "return_routed_experts needs a server started with --enable-return-routed-experts"
)


@dataclass
class ImageInput:
    """One image of a request: its encoded bytes (checked to decode by the API side), a content
    hash, and where its placeholder tokens sit in input_ids. For a model whose processor tiles
    images (multimodal/tiled_images.py) the API side has processed it already: pixel_values
    (numpy float32 [tiles, 3, S, S]) and pixel_mask (numpy bool [tiles, S, S] or None); its
    span then holds marker tokens among the image tokens. An image an "anyres" processor cropped
    (multimodal/anyres_images.py) carries its crops [crops, 3, S, S] and `anyres`: its
    (height, width, grid rows, grid cols), None when it is one base crop. For a model whose
    processor picks the resolution (multimodal/grid_images.py) pixel_values are the flattened
    patches (numpy float32 [patches, patch features]) and grid_thw their (t, h, w) patch grid."""

    data: bytes
    hash: int
    offset: int
    length: int
    pixel_values: Any = None
    pixel_mask: Any = None
    anyres: tuple[int, int, int, int] | None = None
    grid_thw: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class BootstrapInfo:
    """Where a PD request's KV lives (SGLang's bootstrap_host / bootstrap_port / bootstrap_room,
    which its router adds to both halves of a request): the prefill server's bootstrap server
    and the room that names this request's KV there."""

    host: str
    port: int
    room: int


@dataclass
class TokenizedGenerateReq:
    rid: str
    input_ids: list[int]
    # Verified by the sender (TokenizerManager.build_request); it travels as the object.
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    # SGLang's token_ids_logprob: token ids whose logprobs each output position reports.
    token_ids_logprob: list[int] | None = None
    stream: bool = False
    priority: int | None = None
    # An embedding request: prefill only, the answer is the pooled hidden state.
    embedding: bool = False
    lora_id: int = 0  # the LoRA adapter to run with (0: the base model)
    # SGLang's session_params ({id, rid, offset, replace, drop_previous_output}); the
    # scheduler's SessionController builds the full input from the session's saved tokens.
    session_params: dict[str, Any] | None = None
    custom_logit_processor: str | None = None  # SGLang's serialized form; see sampling/
    # SGLang's return_routed_experts (needs --enable-return-routed-experts) and the first
    # position whose ids it returns (routed_experts_start_len).
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    # A vision model's images, in prompt order (multimodal/); their placeholder tokens are
    # already expanded in input_ids.
    images: list[ImageInput] = field(default_factory=list)
    # Prefill/decode disaggregation: the request's room on its prefill server (None: a plain
    # request, run whole here).
    bootstrap: BootstrapInfo | None = None


@dataclass
class AbortReq:
    rid: str | None = None  # None with abort_all=True aborts everything
    abort_all: bool = False
    message: str = "Aborted by the client."


@dataclass
class FlushCacheReq:
    pass


@dataclass
class ExpertDistributionReq:
    """Start, stop or dump the MoE routing counts (layers/moe/expert_record.py)."""

    action: str  # "start" | "stop" | "dump"


@dataclass
class GetInfoReq:
    """Ask the scheduler for its live state (queue lengths, KV usage, counters)."""


@dataclass
class RadixTreeReq:
    """Ask the scheduler for a bounded picture of its radix tree (the dashboard's)."""

    max_nodes: int = 120


@dataclass
class LoadLoRAReq:
    """Load the PEFT adapter at `path` under id `lora_id` (the API side checked the path)."""

    lora_id: int
    name: str
    path: str
    pinned: bool = False


@dataclass
class UnloadLoRAReq:
    """Drop adapter `lora_id`; refused (LoRAInUse) while a live request uses it."""

    lora_id: int


@dataclass
class PauseGenerationReq:
    """SGLang's /pause_generation: "abort" ends every request, "retract" gives every running
    request's KV back (they resume from the queue), "in_place" keeps everything as it is."""

    mode: str = "abort"


@dataclass
class ContinueGenerationReq:
    pass


@dataclass
class OpenSessionReq:
    session_id: str | None = None
    capacity_of_str_len: int | None = None


@dataclass
class CloseSessionReq:
    session_id: str


@dataclass
class UpdateWeightsFromDiskReq:
    """SGLang's /update_weights_from_disk: answered once the running requests finished (or were
    aborted, with abort_all_requests) and the new weights are in."""

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False


@dataclass
class GetWeightsByNameReq:
    name: str
    truncate_size: int = 100


@dataclass
class ReleaseMemoryReq:
    tags: list[str] | None = None  # "kv_cache", "weights"; None: both


@dataclass
class ResumeMemoryReq:
    tags: list[str] | None = None


@dataclass
class ControlCall:
    """A control message that wants an answer, matched by call_id."""

    call_id: int
    request: Any


@dataclass
class ControlReply:
    call_id: int
    result: Any


@dataclass
class DetokParams:
    """What the detokenizer needs to turn a request's token ids into text."""

    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stop_strings: tuple[str, ...] = ()
    no_stop_trim: bool = False


@dataclass
class SchedulerReady:
    """Sent once by the scheduler process after the model is loaded and warmed up."""

    model_dir: str
    vocab_size: int
    context_len: int
    max_total_tokens: int
    max_running_requests: int
    architectures: tuple[str, ...]
    # The Rust tokenizer serialized, when decoding with it alone equals the full tokenizer's
    # decode (managers/light_detokenizer.py): the detokenizer then runs without transformers.
    light_decoder: str | None = None
    # The class AutoTokenizer loaded ("module:qualname", utils/light_tokenizer.py): the API
    # and detokenizer processes load their tokenizer with it, without AutoTokenizer (and torch).
    tokenizer_class: str | None = None
    # What the attention/linear kernels run on (kernels/describe.py's kernel_summary).
    kernels: str = ""
    # A vision model's image placeholder (multimodal/image_prompt.py's ImagePrompt); None for
    # a text-only model, whose requests may not carry images.
    image_prompt: Any = None


@dataclass
class SchedulerFailed:
    message: str


@dataclass
class FinishReason:
    """SGLang's shape: {"type": "stop"|"length"|"abort", "matched": ..., "message": ...}."""

    type: str
    matched: int | str | None = None
    message: str | None = None
    status_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type == "abort":
            out["message"] = self.message
            if self.status_code is not None:
                out["status_code"] = self.status_code
        else:
            out["matched"] = self.matched
        return out


@dataclass
class ReqOutput:
    """New tokens for one request since its last output (or everything, when it finished)."""

    rid: str
    new_token_ids: list[int]
    finished: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    num_retractions: int = 0
    # --enable-hierarchical-cache: cached_tokens per tier {"device", "host", "storage"}.
    cached_tokens_details: dict[str, int] | None = None
    # Speculative decoding counters (None when it is off): verify rounds, drafts accepted and
    # drafts proposed so far.
    spec_verify_ct: int | None = None
    spec_accepted_tokens: int = 0
    spec_draft_tokens: int = 0
    # Each entry (logprob, token_id); top entries are lists of the same per position.
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    output_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_ids_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    # Set on a request's first output, for the detokenizer.
    detok: DetokParams | None = None
    # The new text, filled in by the detokenizer.
    text: str | None = None
    embedding: list[float] | None = None
    # return_routed_experts, on the final output only: base64 of int32 [tokens, layers, top_k]
    # (managers/routed_experts.py).
    routed_experts: str | None = None


@dataclass
class BatchOutput:
    outputs: list[ReqOutput]
