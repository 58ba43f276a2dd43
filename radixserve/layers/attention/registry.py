"""Attention backend names (SGLang's --attention-backend values) -> implementations."""

from __future__ import annotations

from radixserve.layers.attention.base import AttentionBackend
from radixserve.layers.attention.cpu_paged import CpuPagedAttnBackend
from radixserve.layers.attention.torch_native import TorchNativeAttnBackend

# torch_native is the exact reference (plain PyTorch ops, bit-for-bit HF transformers in
# float32); intel_amx, SGLang's name for its CPU backend, is radixserve's fast CPU path.
_BACKENDS: dict[str, type[AttentionBackend]] = {
    "torch_native": TorchNativeAttnBackend,
    "intel_amx": CpuPagedAttnBackend,
}

# The backends that also switch the model's norms and activations to the fused kernels.
FAST_KERNEL_BACKENDS = frozenset({"intel_amx"})


def create_attention_backend(name: str) -> AttentionBackend:
    try:
        return _BACKENDS[name]()
    except KeyError:
        supported = ", ".join(sorted(_BACKENDS))
        raise ValueError(
            f"--attention-backend {name!r} is not available; supported: {supported}"
        ) from None
