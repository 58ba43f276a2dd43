"""Attention backend names (SGLang's --attention-backend values) -> implementations."""

from __future__ import annotations

from radixserve.layers.attention.base import AttentionBackend
from radixserve.layers.attention.torch_native import TorchNativeAttnBackend

_BACKENDS: dict[str, type[AttentionBackend]] = {
    "torch_native": TorchNativeAttnBackend,
}


def create_attention_backend(name: str) -> AttentionBackend:
    try:
        return _BACKENDS[name]()
    except KeyError:
        supported = ", ".join(sorted(_BACKENDS))
        raise ValueError(
            f"--attention-backend {name!r} is not available; supported: {supported}"
        ) from None
