"""Options: expert parallelism, MoE kernels and ktransformers."""

from __future__ import annotations

from radixserve.options.choices import MOE_A2A_BACKEND_CHOICES, MOE_RUNNER_BACKEND_CHOICES
from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, flag, value
from radixserve.options.value_types import FLOAT, INT, STR

AREA = "Expert parallelism and MoE"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--ep-size",
        INT,
        1,
        "Expert parallelism size: each of ep-size groups of the TP ranks holds 1/ep-size of the "
        "experts whole (must divide --tp-size and the expert count).",
        support=IMPLEMENTED,
        aliases=("--expert-parallel-size", "--ep"),
    ),
    value(
        "--moe-a2a-backend",
        STR,
        "none",
        "Backend for MoE all-to-all. Only none: every rank sees every token and the TP "
        "all-reduce sums the expert-parallel groups' outputs.",
        support=IMPLEMENTED,
        choices=MOE_A2A_BACKEND_CHOICES,
        supported_choices=("none",),
    ),
    flag("--enable-w4a4-mxfp4-megamoe", "W4A4 MXFP4 MegaMoE path."),
    value(
        "--deepep-v2-mode",
        STR,
        "direct",
        "DeepEP v2 communication topology.",
        support=NOT_APPLICABLE,
        choices=("direct", "hybrid"),
    ),
    value(
        "--moe-runner-backend",
        STR,
        "auto",
        "MoE kernels. Only auto: radixserve's own expert loop and C++ kernels.",
        support=IMPLEMENTED,
        choices=MOE_RUNNER_BACKEND_CHOICES,
        supported_choices=("auto",),
    ),
    value(
        "--flashinfer-mxfp4-moe-precision",
        STR,
        "default",
        "Compute precision of FlashInfer MXFP4 MoE.",
        support=NOT_APPLICABLE,
        choices=("default", "bf16", "fp8"),
    ),
    value(
        "--deepep-mode",
        STR,
        "auto",
        "DeepEP mode.",
        support=NOT_APPLICABLE,
        choices=("auto", "normal", "low_latency"),
    ),
    value("--fuseep-mode", INT, 2, "Ascend FuseEP mode.", support=NOT_APPLICABLE, choices=(1, 2)),
    value(
        "--deepep-dispatcher-output-dtype",
        STR,
        "auto",
        "DeepEP dispatcher output dtype.",
        support=NOT_APPLICABLE,
        choices=("auto", "bf16", "fp8", "int8", "nvfp4"),
    ),
    value(
        "--ep-num-redundant-experts",
        INT,
        0,
        "Extra physical expert slots per MoE layer (experts + N, an equal run per EP rank; the "
        "sum must divide by --ep-size): hot experts get extra copies and their tokens are "
        "spread over them. Needs --ep-size > 1.",
        support=IMPLEMENTED,
    ),
    value(
        "--ep-dispatch-algorithm",
        STR,
        None,
        "How ranks for redundant experts are chosen.",
        choices=("static", "dynamic", "fake", "lp"),
    ),
    value(
        "--init-expert-location",
        STR,
        "trivial",
        "Initial placement of experts: trivial, or a .pt / .json file (or inline JSON) with "
        "physical_to_logical_map [layers, physical experts] or logical_count [layers, experts] "
        "(e.g. a /dump_expert_distribution_record file). Needs --ep-size > 1.",
        support=IMPLEMENTED,
    ),
    flag(
        "--enable-eplb",
        "Expert-parallel load balancing: rebalance the experts' placement from their measured "
        "load every --eplb-rebalance-num-iterations forward passes, moving weights between "
        "ranks. Needs --ep-size > 1.",
        support=IMPLEMENTED,
    ),
    value(
        "--eplb-algorithm",
        STR,
        "auto",
        "EPLB algorithm: auto, deepseek or deepseek_hierarchical, all one balanced packing "
        "(replicate the heaviest experts, then greedy packing by load).",
        support=IMPLEMENTED,
    ),
    value(
        "--eplb-rebalance-num-iterations",
        INT,
        1000,
        "Forward passes between EPLB rebalances (the load window).",
        support=IMPLEMENTED,
    ),
    value(
        "--eplb-rebalance-layers-per-chunk",
        INT,
        None,
        "Layers whose experts move per forward pass during a rebalance (default: all at once).",
        support=IMPLEMENTED,
    ),
    value(
        "--eplb-min-rebalancing-utilization-threshold",
        FLOAT,
        1.0,
        "Skip a rebalance when the layers' average balancedness (mean over max EP rank load) "
        "is above this.",
        support=IMPLEMENTED,
    ),
    value(
        "--expert-distribution-recorder-mode",
        STR,
        None,
        "Mode of the expert distribution recorder. Only stat: per-layer, per-expert routing "
        "counts between /start_expert_distribution_record and /stop_…, saved by /dump_….",
        support=IMPLEMENTED,
        choices=("stat", "stat_approx", "per_pass", "per_token"),
        supported_choices=("stat",),
    ),
    value(
        "--expert-distribution-recorder-buffer-size",
        INT,
        None,
        "Buffer size of the expert distribution recorder.",
    ),
    value(
        "--expert-balancedness-report-mode",
        STR,
        "off",
        "Where expert balancedness is reported.",
        choices=("off", "server_log", "prometheus", "both"),
    ),
    value(
        "--deepep-config", STR, None, "Tuned DeepEP config (JSON or file).", support=NOT_APPLICABLE
    ),
    value("--moe-dense-tp-size", INT, None, "TP size of dense MLP layers in MoE models."),
    value(
        "--elastic-ep-backend",
        STR,
        None,
        "Communication backend of elastic EP.",
        choices=("none", "mooncake", "nixl"),
    ),
    flag("--enable-elastic-expert-backup", "Elastic expert backup."),
    value(
        "--mooncake-ib-device",
        STR,
        None,
        "InfiniBand devices for Mooncake transfers.",
        support=NOT_APPLICABLE,
    ),
    flag("--enable-waterfill", "Route the shared expert to the least-loaded EP rank."),
    value(
        "--elastic-ep-join-mode",
        STR,
        None,
        "Join mode of elastic EP.",
        dest="ep_join_mode",
        choices=("scale", "recover"),
    ),
    value(
        "--elastic-ep-join-rank-offset",
        INT,
        0,
        "Global rank offset of an elastic EP joining group.",
        dest="ep_join_rank_offset",
    ),
    value("--elastic-ep-initial-size", INT, None, "EP size defining the expert storage layout."),
    value("--max-ep-size", INT, None, "Largest EP size reachable at runtime."),
    value(
        "--elastic-ep-scale-timeout",
        FLOAT,
        600.0,
        "Timeout in seconds of an elastic EP scale operation.",
    ),
    flag("--elastic-ep-rejoin", "Deprecated spelling of --elastic-ep-join-mode recover."),
    flag(
        "--disable-flashinfer-cutlass-moe-fp4-allgather",
        "No quantise-before-all-gather for FlashInfer CUTLASS MoE.",
        support=NOT_APPLICABLE,
    ),
    flag("--disable-shared-experts-fusion", "Disable shared experts fusion."),
    flag("--enforce-shared-experts-fusion", "Force shared experts fusion."),
    value(
        "--kt-weight-path",
        STR,
        None,
        "[ktransformers] Quantised expert weights for the AMX kernel.",
    ),
    value("--kt-method", STR, "AMXINT4", "[ktransformers] Quantization format for CPU experts."),
    value("--kt-cpuinfer", INT, None, "[ktransformers] Number of CPUInfer threads."),
    value(
        "--kt-threadpool-count",
        INT,
        2,
        "[ktransformers] Number of thread pools (one per NUMA node).",
    ),
    value("--kt-num-gpu-experts", INT, None, "[ktransformers] Number of experts kept on GPU."),
    value(
        "--kt-max-deferred-experts-per-token",
        INT,
        None,
        "[ktransformers] Experts deferred to CPU per token.",
    ),
    value(
        "--flashinfer-a2a-dispatch-type",
        STR,
        None,
        "Dispatch dtype of FlashInfer all-to-all.",
        support=NOT_APPLICABLE,
        choices=("auto", "bf16", "nvfp4", "mxfp8"),
    ),
)
