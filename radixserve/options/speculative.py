"""Options: speculative decoding."""

from __future__ import annotations

from radixserve.options.choices import (
    DSA_TOPK_BACKEND_CHOICES,
    LOAD_FORMAT_CHOICES,
    MOE_RUNNER_BACKEND_CHOICES,
    QUANTIZATION_CHOICES,
    SPECULATIVE_MOE_A2A_BACKEND_CHOICES,
)
from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, flag, value
from radixserve.options.value_types import FLOAT, INT, JSON_LIST, STR

AREA = "Speculative decoding"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--speculative-algorithm",
        STR,
        None,
        "Speculative decoding algorithm: NGRAM, STANDALONE (a draft model), EAGLE or EAGLE3 "
        "(a trained head); NEXTN/MTP need layers no supported model has.",
        support=IMPLEMENTED,
    ),
    value("--uno-lora-path", STR, None, "LoRA adapter path for UNO speculative decoding."),
    value(
        "--speculative-draft-model-path",
        STR,
        None,
        "Draft model (STANDALONE) or trained EAGLE/EAGLE3 head folder for speculative decoding.",
        aliases=("--speculative-draft-model",),
        support=IMPLEMENTED,
    ),
    value("--speculative-draft-model-revision", STR, None, "Revision of the draft model."),
    value(
        "--speculative-draft-load-format",
        STR,
        None,
        "Weight format of the draft model.",
        choices=LOAD_FORMAT_CHOICES,
    ),
    value(
        "--speculative-num-steps",
        INT,
        None,
        "Draft steps per speculative round.",
        support=IMPLEMENTED,
    ),
    value(
        "--speculative-eagle-topk",
        INT,
        None,
        "Tokens taken from the draft model per draft step (1: a chain; more: a tree).",
        support=IMPLEMENTED,
    ),
    value(
        "--speculative-num-draft-tokens",
        INT,
        None,
        "Draft tokens verified per speculative round.",
        support=IMPLEMENTED,
    ),
    value("--speculative-dflash-block-size", INT, None, "DFLASH verify window length."),
    value("--speculative-dspark-block-size", INT, None, "DSPARK draft block size."),
    value("--speculative-dspark-sps-table-path", STR, None, "DSPARK SPS cost table (JSON)."),
    value(
        "--speculative-dspark-confidence-sts-path",
        STR,
        None,
        "DSPARK confidence calibration (JSON).",
    ),
    flag(
        "--speculative-dspark-align-verify-tokens-to-graph-tier",
        "DSPARK: fill verify tokens up to the CUDA graph tier.",
    ),
    value(
        "--speculative-accept-threshold-single",
        FLOAT,
        1.0,
        "Accept a draft token whose target probability exceeds this.",
    ),
    value(
        "--speculative-accept-threshold-acc",
        FLOAT,
        1.0,
        "Accumulated acceptance threshold for draft tokens.",
    ),
    flag("--speculative-use-rejection-sampling", "Use rejection sampling to verify draft tokens."),
    value(
        "--speculative-token-map",
        STR,
        None,
        "EAGLE: a .pt file listing the token ids the head may draft (its LM head keeps only "
        "those rows of the target's).",
        support=IMPLEMENTED,
    ),
    value(
        "--speculative-attention-mode",
        STR,
        "prefill",
        "Attention mode used for speculative verify and draft extend.",
        choices=("prefill", "decode"),
    ),
    value(
        "--speculative-draft-attention-backend",
        STR,
        None,
        "Attention kernels of the draft model.",
        support=NOT_APPLICABLE,
    ),
    value(
        "--speculative-dsa-topk-backend",
        STR,
        None,
        "DSA top-k kernels of the draft model.",
        support=NOT_APPLICABLE,
        choices=DSA_TOPK_BACKEND_CHOICES,
    ),
    value(
        "--speculative-draft-kv-cache-dtype",
        STR,
        None,
        "KV cache dtype of the draft model.",
        choices=("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"),
    ),
    value("--speculative-draft-window-size", INT, None, "Sliding window of the draft model."),
    value(
        "--speculative-moe-runner-backend",
        STR,
        None,
        "MoE kernels of the draft model.",
        support=NOT_APPLICABLE,
        choices=MOE_RUNNER_BACKEND_CHOICES,
    ),
    value(
        "--speculative-moe-a2a-backend",
        STR,
        None,
        "MoE all-to-all backend of the draft model.",
        support=NOT_APPLICABLE,
        choices=SPECULATIVE_MOE_A2A_BACKEND_CHOICES,
    ),
    value(
        "--speculative-draft-model-quantization",
        STR,
        None,
        "Quantization of the draft model.",
        choices=QUANTIZATION_CHOICES,
    ),
    flag(
        "--speculative-skip-dp-mlp-sync",
        "Skip the extra MLP sync with speculative decoding and DP attention.",
    ),
    flag("--enable-multi-layer-eagle", "Multi-layer EAGLE speculative decoding."),
    flag(
        "--speculative-adaptive",
        "Adapt the number of draft steps to the acceptance rate (per request in radixserve).",
        support=IMPLEMENTED,
    ),
    value(
        "--speculative-adaptive-config",
        STR,
        None,
        "JSON file with adaptive speculative decoding settings.",
    ),
    value(
        "--decoupled-spec-bind-endpoint",
        STR,
        None,
        "ZMQ endpoint this engine binds for decoupled speculative decoding.",
    ),
    value(
        "--decoupled-spec-connect-endpoints",
        JSON_LIST,
        None,
        "Peer endpoints (JSON list) for decoupled speculative decoding.",
    ),
    value(
        "--decoupled-spec-rank", INT, None, "Rank of this engine in decoupled speculative decoding."
    ),
    value(
        "--decoupled-spec-role",
        STR,
        "null",
        "Role in decoupled speculative decoding.",
        choices=("null", "verifier", "drafter"),
    ),
    value("--spec-trace-dir", STR, None, "Folder for decoupled speculative decoding traces."),
    value(
        "--speculative-ngram-min-bfs-breadth",
        INT,
        1,
        "Minimum BFS breadth of n-gram speculation.",
        support=IMPLEMENTED,
    ),
    value(
        "--speculative-ngram-max-bfs-breadth",
        INT,
        10,
        "Maximum BFS breadth of n-gram speculation.",
        support=IMPLEMENTED,
    ),
    value(
        "--speculative-ngram-match-type",
        STR,
        "BFS",
        "Match type of the n-gram cache tree.",
        choices=("BFS", "PROB"),
        support=IMPLEMENTED,
        supported_choices=("BFS",),
    ),
    value(
        "--speculative-ngram-max-trie-depth",
        INT,
        18,
        "Maximum trie depth of n-gram speculation.",
        support=IMPLEMENTED,
    ),
    value(
        "--speculative-ngram-capacity",
        INT,
        10000000,
        "Cache capacity of n-gram speculation.",
        support=IMPLEMENTED,
    ),
    value(
        "--speculative-ngram-external-corpus-path",
        STR,
        None,
        "JSONL corpus preloaded for n-gram speculation.",
    ),
    value(
        "--speculative-ngram-external-sam-budget",
        INT,
        0,
        "Draft nodes reserved for the external corpus.",
    ),
    value(
        "--speculative-ngram-external-corpus-max-tokens",
        INT,
        10000000,
        "Token limit of the external n-gram corpus.",
    ),
    value(
        "--speculative-domino-candidate-pool-size",
        INT,
        None,
        "Candidate pool size of DOMINO speculation.",
    ),
)
