"""A random-weight GGUF written straight in llama.cpp's Q4_K_M block types, without the F16 file
and llama-quantize run of make_gguf_models.py: for shapes whose F16 file would not fit the disk
(Qwen3-30B-A3B's: 61 GB of F16 for an 18.6 GB Q4_K_M).

The tensor types follow llama-quantize's Q4_K_M choice (llama.cpp's llama_tensor_get_type):
Q4_K for every 2-D weight except attn_v and ffn_down(_exps), which are Q6_K on the layers
`use_more_bits` picks (the first and last eighth, and every third layer between), the LM head
(output.weight, or a tied token_embd) Q6_K, the router, norms and other 1-D tensors F32. Block
bytes are random (every byte pattern is a valid block once its fp16 scales are finite); the
fp16 scales are set so that weights are small and centred (_SCALES). The arithmetic per token and
the bytes read are a real Q4_K_M model's; its text is noise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 26  # random bytes made at a time (64 MB)


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's rule for the layers whose attn_v and ffn_down get Q6_K in Q4_K_M."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def q4_k_m_type(name: str, tied: bool, layers: int) -> str:
    """The GGML type name llama-quantize's Q4_K_M gives tensor `name` (2-D and 3-D weights)."""
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q6_K"
    if name.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")):
        layer = int(name.split(".")[1])
        return "Q6_K" if use_more_bits(layer, layers) else "Q4_K"
    return "Q4_K"


# Per type: the fp16 fields of a block (byte offsets) and the value they are set to. Q4_K
# (d * scale * q - dmin * min, q in 0..15): dmin = 7.5 d centres the weights, std about 0.02.
# Q6_K's quants and scales are signed (mean 0); its d is kept a normal fp16 number (std about
# 0.09): with a subnormal d (below 6.1e-5) llama.cpp ran this file 50x slower (tg 1.4 vs 71
# tok/s on the moe-1b shape), while a llama-quantize'd file of the same shape ran at speed.
_SCALES = {"Q4_K": ((0, 8e-5), (2, 6e-4)), "Q6_K": ((208, 7e-5),)}


def random_block_bytes(
    qtype: str, rows: int, k: int, rng: np.random.Generator, progress: tqdm | None = None
) -> np.ndarray:
    """uint8 [rows, row bytes] of random `qtype` blocks with small finite fp16 scales."""
    import gguf

    block_weights, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    blocks = rows * (k // block_weights)
    out = np.empty((blocks, block_bytes), dtype=np.uint8)
    per_chunk = max(1, CHUNK_BYTES // block_bytes)
    for start in range(0, blocks, per_chunk):
        stop = min(start + per_chunk, blocks)
        out[start:stop] = rng.integers(0, 256, size=(stop - start, block_bytes), dtype=np.uint8)
        if progress is not None:
            progress.update((stop - start) * block_bytes)
    for offset, value in _SCALES[qtype]:
        out[:, offset : offset + 2] = np.array([value], dtype=np.float16).view(np.uint8)
    return out.reshape(rows, -1)


def write_random_q4_k_m(
    path: Path,
    arch: str,
    tied: bool,
    layers: int,
    specs: Sequence[Any],
    add_metadata: Callable[[Any], None],
    seed: int,
) -> Path:
    """Writes the tensors `specs` (make_gguf_models.TensorSpec: name, numpy shape, norm/f32) of
    a random `arch` model as a Q4_K_M GGUF at `path`, streaming tensor by tensor (about one
    tensor's worth of memory); `add_metadata` adds the hyperparameter and tokenizer keys."""
    import gguf

    tmp = path.with_name(path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_name(path.stem)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_metadata(writer)
    plan: list[tuple[Any, str | None]] = []
    total = 0
    for spec in specs:
        if spec.norm or spec.f32:
            plan.append((spec, None))
            writer.add_tensor_info(spec.name, spec.shape, np.dtype(np.float32), spec.nbytes)
            total += spec.nbytes
            continue
        qtype = q4_k_m_type(spec.name, tied, layers)
        block_weights, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
        *lead, k = spec.shape
        nbytes = int(np.prod(lead)) * (k // block_weights) * block_bytes
        writer.add_tensor_info(
            spec.name,
            (*lead, k // block_weights * block_bytes),
            np.dtype(np.uint8),
            nbytes,
            raw_dtype=gguf.GGMLQuantizationType[qtype],
        )
        plan.append((spec, qtype))
        total += nbytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    try:
        with tqdm(
            total=total, desc=f"Writing {path.name}", unit="B", unit_scale=True, unit_divisor=1024
        ) as progress:
            for spec, qtype in plan:
                if qtype is None:
                    values = np.ones(spec.shape, dtype=np.float32)
                    if spec.f32:  # the router: small random weights
                        values = rng.standard_normal(spec.shape, dtype=np.float32) * 0.02
                    writer.write_tensor_data(values)
                    progress.update(values.nbytes)
                    continue
                *lead, k = spec.shape
                rows = int(np.prod(lead))
                data = random_block_bytes(qtype, rows, k, rng, progress)
                writer.write_tensor_data(data.reshape(*lead, -1))
        writer.close()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
    return path
