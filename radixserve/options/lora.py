"""Options: LoRA adapters."""

from __future__ import annotations

from radixserve.lora.config import SUPPORTED_TARGET_MODULES
from radixserve.options.choices import LORA_TARGET_MODULES_CHOICES
from radixserve.options.spec import IMPLEMENTED, OptionSpec, bool_opt, flag, value
from radixserve.options.value_types import FLOAT, INT, STR

AREA = "LoRA"

# The Llama-family projections radixserve applies adapters to (lora/config.py's list), plus
# SGLang's fused names and "all".
LORA_SUPPORTED_TARGET_MODULES = (*SUPPORTED_TARGET_MODULES, "qkv_proj", "gate_up_proj", "all")

OPTIONS: tuple[OptionSpec, ...] = (
    flag("--enable-lora", "Enable LoRA adapters.", default=None, support=IMPLEMENTED),
    flag("--enable-lora-overlap-loading", "Load LoRA weights asynchronously.", default=None),
    value("--max-lora-rank", INT, None, "Maximum LoRA rank.", support=IMPLEMENTED),
    value(
        "--lora-target-modules",
        STR,
        None,
        "Modules LoRA applies to ('all' for every supported module).",
        choices=LORA_TARGET_MODULES_CHOICES,
        nargs="*",
        support=IMPLEMENTED,
        supported_choices=LORA_SUPPORTED_TARGET_MODULES,
    ),
    value(
        "--lora-paths",
        STR,
        None,
        "LoRA adapters to load: PATH, NAME=PATH or JSON.",
        nargs="*",
        support=IMPLEMENTED,
    ),
    value(
        "--max-loaded-loras",
        INT,
        None,
        "Maximum adapters kept in CPU memory.",
        support=IMPLEMENTED,
    ),
    value(
        "--max-loras-per-batch",
        INT,
        8,
        "Maximum adapters in one running batch.",
        support=IMPLEMENTED,
    ),
    value(
        "--lora-eviction-policy",
        STR,
        "lru",
        "Adapter eviction policy.",
        choices=("lru", "fifo"),
        support=IMPLEMENTED,
    ),
    value(
        "--lora-backend",
        STR,
        "csgmv",
        "LoRA kernels.",
        choices=("triton", "csgmv", "ascend", "torch_native"),
    ),
    value(
        "--max-lora-chunk-size",
        INT,
        16,
        "Chunk size of the csgmv LoRA kernels.",
        choices=(16, 32, 64, 128),
    ),
    bool_opt("--experts-shared-outer-loras", "Share outer LoRA weights across MoE experts."),
    flag("--lora-use-virtual-experts", "Virtual expert computation for MoE LoRA."),
    bool_opt(
        "--lora-strict-loading", "Fail on mismatched or missing adapter weights.", default=False
    ),
    value(
        "--lora-drain-wait-threshold",
        FLOAT,
        0.0,
        "Seconds an adapter may wait before another is drained; 0 disables.",
    ),
)
