"""Options: everything else (overlap, offloading, debugging, runtime features, --config)."""

from __future__ import annotations

from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, bool_opt, flag, value
from radixserve.options.value_types import FLOAT, INT, JSON_LIST, STR

AREA = "Miscellaneous"

OPTIONS: tuple[OptionSpec, ...] = (
    flag("--enable-two-batch-overlap", "Overlap two micro batches."),
    flag("--enable-single-batch-overlap", "Overlap compute and communication in one micro batch."),
    value(
        "--tbo-token-distribution-threshold",
        FLOAT,
        0.48,
        "Token split threshold for two-batch overlap.",
    ),
    value("--cpu-offload-gb", INT, 0, "GB of weights offloaded to CPU memory."),
    value("--offload-group-size", INT, -1, "Layers per offloading group."),
    value("--offload-num-in-group", INT, 1, "Layers offloaded per group."),
    value("--offload-prefetch-step", INT, 1, "Layers prefetched ahead when offloading."),
    value("--offload-mode", STR, "cpu", "Offloading mode."),
    value("--dllm-algorithm", STR, None, "Diffusion LLM algorithm."),
    value("--dllm-algorithm-config", STR, None, "Diffusion LLM algorithm config (YAML)."),
    bool_opt("--dllm-fdfo", "First-done-first-out scheduling for diffusion LLMs.", default=True),
    flag(
        "--enable-deterministic-inference",
        "Deterministic inference: a request's tokens and logprobs do not depend on the batch it "
        "runs in, on chunked-prefill boundaries or on a prefix-cache hit (temperature > 0 with "
        "sampling_seed too). CPU with the intel_amx kernels; attention runs each query row "
        "alone (see docs/performance.md for its cost).",
        support=IMPLEMENTED,
    ),
    value(
        "--rl-on-policy-target",
        STR,
        None,
        "Training system to match for on-policy RL.",
        choices=("fsdp",),
    ),
    value("--kv-canary", STR, "none", "KV cache canary mode.", choices=("none", "log", "raise")),
    value("--kv-canary-sweep-interval", INT, 0, "Run a full KV canary sweep every N steps."),
    flag("--enable-dynamic-batch-tokenizer", "Batch concurrent tokenisation requests dynamically."),
    value(
        "--dynamic-batch-tokenizer-batch-size",
        INT,
        32,
        "Maximum batch of the dynamic batch tokenizer.",
    ),
    value(
        "--dynamic-batch-tokenizer-batch-timeout",
        FLOAT,
        0.002,
        "Batching timeout in seconds of the dynamic batch tokenizer.",
    ),
    flag("--enable-tokenizer-batch-encode", "Tokenise multiple text inputs in one batch."),
    flag("--disable-tokenizer-batch-decode", "Decode multiple completions one by one."),
    value("--debug-tensor-dump-output-folder", STR, None, "Folder for tensor dumps."),
    value(
        "--debug-tensor-dump-layers", INT, None, "Layer ids whose tensors are dumped.", nargs="+"
    ),
    value("--debug-tensor-dump-input-file", STR, None, "Input file for tensor dumping."),
    flag(
        "--enable-memory-saver",
        "Allow releasing and resuming memory occupation.",
        support=NOT_APPLICABLE,
    ),
    flag(
        "--enable-weights-cpu-backup",
        "Back weights up to CPU memory when releasing them.",
        support=NOT_APPLICABLE,
    ),
    flag(
        "--enable-draft-weights-cpu-backup",
        "Back draft weights up to CPU memory when releasing them.",
        support=NOT_APPLICABLE,
    ),
    flag(
        "--enable-custom-logit-processor",
        "Allow requests to pass custom logit processors (SGLang's serialized form; runs "
        "client code in the scheduler).",
        support=IMPLEMENTED,
    ),
    flag("--enable-return-hidden-states", "Allow returning hidden states."),
    value(
        "--return-hidden-states-mode",
        STR,
        None,
        "Largest hidden-state return mode allowed.",
        choices=("last", "full"),
    ),
    flag(
        "--enable-return-routed-experts",
        "Allow requests to ask for their routed experts (return_routed_experts on /generate "
        "and the OpenAI completion routes): base64 of int32 [tokens, layers, top_k], -1 for "
        "dense layers. MoE models only; a step that captures them runs its MoE layers without "
        "the one-call C++ layer.",
        support=IMPLEMENTED,
    ),
    flag("--enable-return-indexer-topk", "Return indexer top-k indices."),
    value("--sampling-mask-max-tokens", INT, None, "Largest vocabulary mask used in sampling."),
    flag("--disable-outlines-disk-cache", "Disable the outlines disk cache."),
    flag("--enable-mis", "Multi-item scoring."),
    value(
        "--weight-cache-mode",
        STR,
        "off",
        "Weight cache daemon mode.",
        choices=("off", "daemon", "client"),
    ),
    value("--weight-cache-socket", STR, None, "Unix socket of the weight cache daemon."),
    value("--weight-cache-timeout", INT, 1800, "Seconds to wait for the weight cache daemon."),
    value("--forward-hooks", JSON_LIST, None, "JSON forward hook specifications."),
    value("--msprobe-dump-config", STR, None, "msProbe dump config file."),
    bool_opt("--ple-offload-embedding", "Offload per-layer embeddings."),
    value(
        "--ple-offload-backend",
        STR,
        None,
        "Backend of per-layer embedding offload.",
        choices=("pinned", "file"),
    ),
    value("--ple-offload-dir", STR, None, "Folder for per-layer embedding offload."),
    value(
        "--kv-canary-real-data",
        STR,
        "none",
        "Check real KV data in the canary.",
        choices=("none", "partial", "all"),
    ),
    value(
        "--config",
        STR,
        None,
        "YAML file of options (keys with dashes or underscores); command-line options override it.",
        support=IMPLEMENTED,
    ),
)
