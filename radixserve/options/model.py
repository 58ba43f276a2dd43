"""Options: model and tokenizer loading."""

from __future__ import annotations

from radixserve.options.choices import LOAD_FORMAT_CHOICES
from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, flag, value
from radixserve.options.value_types import INT, STR, TOKENS

AREA = "Model and tokenizer"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--model-path",
        STR,
        None,
        "Model to serve: a local folder, a .gguf file or a Hugging Face repo id. Without it the built-in default model (SmolLM2-135M-Instruct, GGUF) is used.",
        support=IMPLEMENTED,
        aliases=("--model",),
    ),
    value(
        "--tokenizer-path",
        STR,
        None,
        "Tokenizer location (defaults to the model path).",
        support=IMPLEMENTED,
    ),
    value(
        "--tokenizer-mode",
        STR,
        "auto",
        "'auto' uses the fast tokenizer when available, 'slow' always uses the slow one.",
        support=IMPLEMENTED,
        choices=("auto", "slow"),
    ),
    value(
        "--tokenizer-backend",
        STR,
        "huggingface",
        "Tokenizer library: Hugging Face tokenizers or fastokens.",
        support=NOT_APPLICABLE,
        choices=("huggingface", "fastokens"),
    ),
    value("--tokenizer-worker-num", INT, 1, "Number of tokenizer manager workers."),
    value("--detokenizer-worker-num", INT, 1, "Number of detokenizer manager workers."),
    flag(
        "--skip-tokenizer-init",
        "Do not load a tokenizer; requests must carry input_ids and get token ids back.",
        support=IMPLEMENTED,
    ),
    value(
        "--load-format",
        STR,
        "auto",
        "Weight format to load: auto (detect), safetensors, pt, gguf, or dummy (random weights for profiling).",
        support=IMPLEMENTED,
        choices=LOAD_FORMAT_CHOICES,
        supported_choices=("auto", "safetensors", "pt", "gguf", "dummy"),
    ),
    value(
        "--model-loader-extra-config", STR, "{}", "Extra JSON config handed to the model loader."
    ),
    flag(
        "--trust-remote-code",
        "Allow model code shipped with a Hugging Face checkpoint to run.",
        support=IMPLEMENTED,
    ),
    value(
        "--context-length",
        TOKENS,
        None,
        "Maximum context length (defaults to the model config). Accepts suffixes like 32k or 1M.",
        support=IMPLEMENTED,
    ),
    flag(
        "--is-embedding",
        "Serve the model as an embedding model (last-token pooling, L2-normalised).",
        support=IMPLEMENTED,
    ),
    flag(
        "--enable-multimodal",
        "Enable multimodal inputs for a multimodal model. As in SGLang, a vision model (LLaVA, "
        "Idefics3, SmolVLM, Gemma 3, Qwen2-VL) takes "
        "images with or without it, and a text-only model is unchanged by it.",
        default=None,
        support=IMPLEMENTED,
    ),
    value(
        "--revision",
        STR,
        None,
        "Model revision (branch, tag or commit) to load.",
        support=IMPLEMENTED,
    ),
    value(
        "--model-impl",
        STR,
        "auto",
        "Which model implementation to use (auto, sglang, transformers, ...).",
    ),
    value(
        "--model-config-parser",
        STR,
        "auto",
        "Which model config parser to use (auto picks one by model name).",
    ),
    value(
        "--json-model-override-args",
        STR,
        "{}",
        "JSON object that overrides fields of the model config.",
        support=IMPLEMENTED,
    ),
)
