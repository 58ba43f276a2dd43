"""Options: weight loading and online weight updates."""

from __future__ import annotations

from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, flag, value
from radixserve.options.value_types import INT, JSON_LIST, STR

AREA = "Weight loading and updates"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--startup-weight-load-mode",
        STR,
        None,
        "Load weights serially or overlapped with startup.",
        choices=("serial", "overlap"),
    ),
    value("--custom-weight-loader", STR, None, "Import paths of custom weight loaders.", nargs="*"),
    flag(
        "--weight-loader-disable-mmap",
        "Do not mmap safetensors files while loading.",
        support=NOT_APPLICABLE,
    ),
    flag(
        "--weight-loader-prefetch-checkpoints",
        "Prefetch checkpoint files into the page cache.",
        support=NOT_APPLICABLE,
    ),
    value(
        "--weight-loader-prefetch-num-threads",
        INT,
        4,
        "Threads per rank for checkpoint prefetching.",
        support=NOT_APPLICABLE,
    ),
    flag(
        "--weight-loader-drop-cache-after-load",
        "Drop each shard from the page cache after loading it.",
        support=NOT_APPLICABLE,
    ),
    value(
        "--remote-instance-weight-loader-seed-instance-ip",
        STR,
        None,
        "IP of the seed instance for remote weight loading.",
    ),
    value(
        "--remote-instance-weight-loader-seed-instance-service-port",
        INT,
        None,
        "Service port of the seed instance.",
    ),
    value(
        "--remote-instance-weight-loader-send-weights-group-ports",
        JSON_LIST,
        None,
        "Group ports (JSON list) for remote weight loading.",
    ),
    value(
        "--remote-instance-weight-loader-backend",
        STR,
        "nccl",
        "Backend for remote weight loading.",
        choices=("transfer_engine", "nccl", "modelexpress"),
    ),
    flag(
        "--remote-instance-weight-loader-start-seed-via-transfer-engine",
        "Start the seed server via the transfer engine.",
    ),
    value("--engine-info-bootstrap-port", INT, 6789, "Port of the engine info bootstrap server."),
    value("--modelexpress-config", STR, None, "JSON config for ModelExpress weight loading."),
    value(
        "--download-dir", STR, None, "Download folder for Hugging Face models.", support=IMPLEMENTED
    ),
    value(
        "--model-checksum",
        STR,
        None,
        "Verify model files against checksums (a file or repo id; bare flag uses the model path).",
        nargs="?",
        const="",
    ),
    flag("--delete-ckpt-after-loading", "Delete the checkpoint after loading it."),
    value("--decrypted-config-file", STR, None, "Decrypted config file."),
    value("--decrypted-draft-config-file", STR, None, "Decrypted draft config file."),
    flag(
        "--checkpoint-engine-wait-weights-before-ready",
        "Wait for weights from the checkpoint engine before serving.",
    ),
)
