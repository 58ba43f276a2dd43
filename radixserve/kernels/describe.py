"""One line saying which kernels run on this machine and why (for the startup log)."""

from __future__ import annotations

from radixserve.kernels.build import DISABLE_ENV, load_extension
from radixserve.kernels.cpu_features import cpu_features


def describe_kernels(fast: bool) -> str:
    cpu = cpu_features().summary
    if not fast:
        return f"reference PyTorch ops, exact float32; CPU {cpu}"
    if load_extension() is not None:
        return f"C++ kernels built for this CPU and self-tested; CPU {cpu}"
    return (
        f"PyTorch fallbacks of the fused kernels (C++ build unavailable or {DISABLE_ENV}=1); "
        f"CPU {cpu}"
    )
