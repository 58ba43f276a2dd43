"""Options: prefill/decode and encoder disaggregation."""

from __future__ import annotations

from radixserve.options.spec import IMPLEMENTED, OptionSpec, flag, value
from radixserve.options.value_types import INT, STR

AREA = "Disaggregation"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--disaggregation-mode",
        STR,
        "null",
        "Prefill/decode disaggregation role.",
        choices=("null", "prefill", "decode"),
        support=IMPLEMENTED,
    ),
    value(
        "--disaggregation-transfer-backend",
        STR,
        "mooncake",
        "KV transfer backend for disaggregation (mooncake: RDMA with --disaggregation-ib-device, "
        "else TCP; fake moves nothing, for warm-up only).",
        choices=("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"),
        supported_choices=("mooncake", "fake", "mooncake_tcp"),
        support=IMPLEMENTED,
    ),
    value(
        "--disaggregation-bootstrap-port",
        INT,
        8998,
        "Bootstrap port of the prefill server.",
        support=IMPLEMENTED,
    ),
    value(
        "--disaggregation-ib-device",
        STR,
        None,
        "InfiniBand devices for KV transfer.",
        support=IMPLEMENTED,
    ),
    flag("--disaggregation-decode-enable-radix-cache", "Radix cache on the decode server."),
    flag(
        "--disaggregation-decode-enable-offload-kvcache", "Offload KV cache on the decode server."
    ),
    value(
        "--disaggregation-decode-retraction-backup",
        STR,
        None,
        "Where retracted decode KV is backed up.",
        choices=("cpu_tensor", "host_pool"),
    ),
    value(
        "--num-reserved-decode-tokens",
        INT,
        512,
        "Decode tokens reserved per newly admitted request.",
    ),
    value(
        "--disaggregation-decode-extra-slots",
        INT,
        None,
        "Extra decode slots for in-transfer requests.",
    ),
    value(
        "--disaggregation-decode-polling-interval",
        INT,
        1,
        "Poll for requests every N decode iterations.",
    ),
    value("--optimistic-prefill-attempts", INT, 0, "Prefill passes that skip the bootstrap wait."),
    flag("--encoder-only", "Launch an encoder-only server."),
    flag("--language-only", "Load only the language model of a VLM."),
    flag("--language-model-only", "Serve only the language model of a multimodal checkpoint."),
    value(
        "--encoder-transfer-backend",
        STR,
        "auto",
        "Transfer backend for encoder disaggregation.",
        choices=("auto", "zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"),
    ),
    value("--encoder-urls", STR, (), "Encoder server URLs.", nargs="+"),
    value("--encoder-bootstrap-port", INT, 8997, "Port of the encoder bootstrap server."),
    value(
        "--encoder-register-urls",
        STR,
        (),
        "Bootstrap servers this encoder registers with.",
        nargs="+",
    ),
    flag("--enable-adaptive-dispatch-to-encoder", "Send only multi-image requests to the encoder."),
    flag("--enable-pdmux", "PD multiplexing."),
    value("--pdmux-config-path", STR, None, "PD multiplexing config file."),
    value("--sm-group-num", INT, 8, "Number of SM partition groups."),
)
