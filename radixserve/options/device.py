"""Options: device selection and process runtime."""

from __future__ import annotations

from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, flag, value
from radixserve.options.value_types import FLOAT, INT, STR

AREA = "Device and runtime"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--device",
        STR,
        None,
        "Device to run on: cpu or cuda. Detected when unset (cuda if available, else cpu).",
        support=IMPLEMENTED,
    ),
    value("--base-gpu-id", INT, 0, "First GPU id to use."),
    value("--gpu-id-step", INT, 1, "Step between consecutive GPU ids."),
    value(
        "--random-seed", INT, None, "Random seed (a random one when unset).", support=IMPLEMENTED
    ),
    flag("--mlx-enable-sampling", "Sample with MLX on Apple silicon.", support=NOT_APPLICABLE),
    value(
        "--watchdog-timeout",
        FLOAT,
        300.0,
        "Seconds a forward step may take before the server treats it as hung.",
    ),
    value(
        "--soft-watchdog-timeout",
        FLOAT,
        None,
        "Seconds after which a slow forward step dumps debug information.",
    ),
    flag("--sleep-on-idle", "Reduce CPU usage while idle.", support=NOT_APPLICABLE),
    flag(
        "--use-ray",
        "Manage scheduler processes with Ray actors.",
        support=IMPLEMENTED,
    ),
    value(
        "--numa-node",
        INT,
        None,
        "NUMA node for each subprocess.",
        support=NOT_APPLICABLE,
        nargs="+",
    ),
    value(
        "--gc-threshold",
        INT,
        None,
        "Python garbage collector thresholds (1 to 3 integers).",
        support=IMPLEMENTED,
        nargs="+",
    ),
)
