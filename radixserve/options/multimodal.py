"""Options: multimodal inputs."""

from __future__ import annotations

from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, flag, value
from radixserve.options.value_types import INT, JSON, JSON_OBJECT, STR

AREA = "Multimodal"

OPTIONS: tuple[OptionSpec, ...] = (
    flag(
        "--enable-broadcast-mm-inputs-process",
        "Broadcast multimodal input processing in the scheduler.",
    ),
    flag("--enable-prefix-mm-cache", "Prefix cache for multimodal inputs."),
    flag("--mm-enable-dp-encoder", "Data parallel multimodal encoder."),
    value(
        "--mm-process-config",
        JSON_OBJECT,
        None,
        "JSON multimodal preprocessing config (image, video, audio).",
    ),
    value(
        "--mm-processor-worker-num",
        INT,
        0,
        "Threads for multimodal processor calls (0: model default).",
    ),
    value("--mm-io-worker-num", INT, 0, "Threads for multimodal data loading (0: model default)."),
    value(
        "--allowed-media-domains", STR, (), "Hostnames allowed for remote media URLs.", nargs="+"
    ),
    value(
        "--media-url-max-file-size-mb", INT, 64, "Maximum size in MiB of one remote media download."
    ),
    value(
        "--mm-preprocess-cache-size-mb",
        INT,
        None,
        "Memory budget of the multimodal preprocessing cache.",
    ),
    flag("--trust-mm-content-hashes", "Trust client-supplied media content hashes."),
    value(
        "--limit-mm-data-per-request",
        JSON,
        None,
        'JSON limits on multimodal inputs per request; the "image" count is enforced (a 400 '
        "above it), the only modality served.",
        support=IMPLEMENTED,
    ),
    flag("--enable-mm-global-cache", "Global multimodal embedding cache."),
    value(
        "--image-processor-backend",
        STR,
        "auto",
        "Image processor backend.",
        choices=("auto", "torchvision", "pil"),
    ),
    value(
        "--mm-global-cache-backend",
        STR,
        "mooncake",
        "Storage backend of the global multimodal cache.",
        choices=("mooncake",),
    ),
    flag("--disable-fast-image-processor", "Use the base image processor instead of the fast one."),
    value(
        "--mm-feature-transport",
        STR,
        None,
        "How multimodal features travel between processes.",
        support=NOT_APPLICABLE,
        choices=("cpu", "cuda_ipc", "cuda_vmm"),
    ),
    flag(
        "--keep-mm-feature-on-device",
        "Deprecated: keep multimodal features on the GPU.",
        support=NOT_APPLICABLE,
    ),
)
