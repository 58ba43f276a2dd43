"""Options: tensor, pipeline, data and context parallelism."""

from __future__ import annotations

from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, bool_opt, flag, value
from radixserve.options.value_types import INT, STR

AREA = "Parallelism"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--nccl-port",
        INT,
        None,
        "Port for the distributed environment setup. Here: the port of torch.distributed's "
        "rendezvous on 127.0.0.1 with --tp-size or --pp-size > 1 when --dist-init-addr is not "
        "given (default: a free port).",
        support=IMPLEMENTED,
    ),
    value(
        "--dist-timeout",
        INT,
        None,
        "Timeout in seconds for torch.distributed initialisation. Here also every collective "
        "and point-to-point transfer between tensor-parallel ranks and pipeline stages: a rank "
        "that stops answering takes the server down after "
        "at most this long (default 600).",
        support=IMPLEMENTED,
    ),
    value(
        "--dist-init-addr",
        STR,
        None,
        "Host:port used to initialise the distributed backend across nodes. Here: the "
        "rendezvous of the tensor-parallel ranks (required with --nnodes > 1: node 0's "
        "address).",
        support=IMPLEMENTED,
        aliases=("--nccl-init-addr",),
    ),
    value("--gated-launch-port", INT, None, "Port of the gated-launch control server."),
    value(
        "--nnodes",
        INT,
        1,
        "Number of nodes. Here: the --tp-size ranks split evenly over the nodes (tp-size must "
        "be a multiple), one `radixserve serve --node-rank K` per node, all with the same "
        "--dist-init-addr.",
        support=IMPLEMENTED,
    ),
    value(
        "--node-rank",
        INT,
        0,
        "Rank of this node. Here: node K runs TP ranks K * tp/nnodes onwards; node 0 also "
        "runs the scheduler and the HTTP server, the others only their ranks (no HTTP "
        "server), exiting when the group breaks.",
        support=IMPLEMENTED,
    ),
    value(
        "--tp-size",
        INT,
        1,
        "Tensor parallelism size. Here: one scheduler/worker process per rank over "
        "torch.distributed (gloo on CPU, NCCL on CUDA), the CPU cores split between ranks; "
        "heads must split (a clear error names the valid sizes); a GGUF's blocks are cut per "
        "rank (each rank's input columns must fall on block boundaries: 32 weights, 256 for "
        "K-quants); not with --quantization w8a8_int8 or bitsandbytes.",
        support=IMPLEMENTED,
        aliases=("--tensor-parallel-size",),
    ),
    value(
        "--dcp-size",
        INT,
        1,
        "Decode context parallelism size.",
        aliases=("--decode-context-parallel-size",),
    ),
    value(
        "--pp-size",
        INT,
        1,
        "Pipeline parallelism size. Here: the decoder layers split into that many contiguous "
        "stages (stage 0 also the embedding, the last the final norm and LM head), each stage "
        "--tp-size ranks (tp x pp processes in all, over torch.distributed: gloo on CPU), "
        "hidden states passed by point-to-point send/recv; a stage loads and caches only its "
        "layers. Not with --dp-size, --nnodes, speculative decoding, LoRA, the hierarchical "
        "cache or --quantization gguf / w8a8_int8 / bitsandbytes.",
        support=IMPLEMENTED,
        aliases=("--pipeline-parallel-size",),
    ),
    value(
        "--pp-max-micro-batch-size",
        INT,
        None,
        "Maximum micro batch size under pipeline parallelism. Here: each scheduler step's "
        "batch is split into micro-batches of at most this many requests, which flow through "
        "the stages one after another (stage k runs micro-batch i while stage k + 1 runs "
        "i - 1); default: the batch in --pp-size near-equal parts. Only with --pp-size > 1.",
        support=IMPLEMENTED,
    ),
    value("--pp-async-batch-depth", INT, 0, "Async batch depth under pipeline parallelism."),
    value(
        "--dp-size",
        INT,
        1,
        "Data parallelism size. Here: that many independent replicas (each its own scheduler "
        "process, model copy, KV pool and radix cache, and --tp-size ranks) behind one API "
        "process and one detokenizer; the CPU cores are split between all replicas' ranks.",
        support=IMPLEMENTED,
        aliases=("--data-parallel-size",),
    ),
    value(
        "--load-balance-method",
        STR,
        "auto",
        "How requests are spread over data-parallel workers. Here: round_robin; "
        "total_requests (fewest requests in flight); total_tokens (fewest tokens held by the "
        "requests in flight); auto, which SGLang resolves to round_robin, is cache-aware here "
        "(a prompt whose prefix went to a replica before goes there again unless that replica "
        "is much busier, else the fewest requests in flight). follow_bootstrap_room needs "
        "prefill/decode disaggregation and is refused.",
        support=IMPLEMENTED,
        choices=("auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens"),
        supported_choices=("auto", "round_robin", "total_requests", "total_tokens"),
    ),
    value(
        "--attn-cp-size",
        INT,
        1,
        "Attention context parallelism size.",
        aliases=("--attention-context-parallel-size",),
    ),
    value(
        "--moe-dp-size", INT, 1, "MoE data parallelism size.", aliases=("--moe-data-parallel-size",)
    ),
    value("--dwdp-size", INT, 1, "Distributed weight data parallelism group size."),
    value(
        "--dcp-comm-backend",
        STR,
        "ag_rs",
        "Communication backend for decode context parallel attention.",
        support=NOT_APPLICABLE,
        choices=("ag_rs", "a2a", "fi_a2a"),
    ),
    bool_opt(
        "--dcp-replicate-q-proj", "Replicate the Q projection on each decode context parallel rank."
    ),
    flag("--enable-prefill-cp", "Enable context parallelism for prefill."),
    value(
        "--cp-strategy",
        STR,
        None,
        "Sharding strategy for prefill context parallelism.",
        choices=("zigzag", "interleave"),
    ),
    flag(
        "--enable-dsa-cache-layer-split",
        "Split DSA cache layers across context parallel ranks.",
        support=NOT_APPLICABLE,
    ),
    flag(
        "--enable-cp-decode-attn-tp",
        "Slice attention weights per context parallel rank during decode.",
    ),
    flag("--enable-dp-attention", "Data parallel attention with tensor parallel FFN."),
    flag(
        "--enable-dp-attention-local-control-broadcast",
        "Broadcast control messages within attention TP groups under DP attention.",
    ),
    flag("--enable-dp-lm-head", "Vocabulary-parallel LM head across the attention TP group."),
    bool_opt("--enable-tp-lm-head-all-to-all", "Use all-to-all for the tensor parallel LM head."),
    flag(
        "--enable-attn-tp-input-scattered",
        "Allow scattered attention input under tensor parallelism.",
        support=NOT_APPLICABLE,
    ),
    flag("--enable-shared-experts-attn-tp", "Run shared experts with attention TP layout."),
    flag("--enable-dense-mlp-attn-tp", "Run dense MLP layers with attention TP layout."),
    flag("--enable-layernorm-sp", "Sequence-parallel layer norm.", support=NOT_APPLICABLE),
    flag("--disable-attn-tp-gather", "Disable the scheduler-side attention TP gather."),
    flag("--enable-p2p-check", "Check GPU peer-to-peer access.", support=NOT_APPLICABLE),
)
