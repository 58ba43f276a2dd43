"""Random-weight GGUF files of real model shapes with llama.cpp's K-quant type layout.

For speed and memory measurements of radixserve and llama.cpp on the same file without a model
download or a quantizer: each weight is random but valid blocks of the type llama.cpp's
`llama-quantize` would give that tensor (Q4_K_M: Q4_K, with Q6_K for the output/tied embedding
and for attn_v and ffn_down in the layers where llama.cpp spends more bits), the tokenizer and
chat template are the default model's (SmolLM2, 49,152 tokens), and norms are ones. The text
such a model writes is noise; the arithmetic per token is the real model's.

    .venv/bin/python benchmarks/synthetic_gguf.py --shape 1b --ftype Q4_K_M
    .venv/bin/python benchmarks/synthetic_gguf.py --shape 8b --ftype Q4_K_M --out-dir /data

Weights are written tensor by tensor (the writer streams them), so an 8B file needs about one
layer's worth of memory beyond the file.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.make_gguf_models import (  # the same shapes and metadata
    SHAPES,
    Shape,
    add_llama_metadata,
    copy_tokenizer,
)
from radixserve.kernels import gguf_types as gt

logger = logging.getLogger("synthetic_gguf")
DEFAULT_OUT = Path.home() / ".cache" / "radixserve-bench" / "models"


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third one
    between them get the larger type for attn_v and ffn_down."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(ftype: str, role: str, layer: int, layers: int) -> int:
    """The GGML type llama-quantize gives a tensor of `role` under `ftype`."""
    if ftype in ("Q8_0", "Q4_0", "Q6_K"):
        base = getattr(gt, ftype)
        return gt.Q6_K if role == "output" and ftype != "Q8_0" else base
    base, more = {"Q4_K_M": (gt.Q4_K, gt.Q6_K), "Q5_K_M": (gt.Q5_K, gt.Q6_K)}[ftype]
    if role == "output":
        return gt.Q6_K
    if role in ("attn_v", "ffn_down") and more_bits(layer, layers):
        return more
    return base


def random_blocks(qtype: int, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Valid random blocks (finite fp16 scales of about 0.01 / 2**bits, so activations stay
    bounded through the layers)."""
    fmt = gt.FORMATS[qtype]
    raw = rng.integers(0, 256, size=(rows, k // fmt.weights, fmt.bytes), dtype=np.uint8)
    for offset in gt.FP16_FIELDS[qtype]:
        scale = rng.uniform(2e-4, 6e-4, size=raw.shape[:2]).astype(np.float16)
        raw[..., offset : offset + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def write_model(path: Path, shape: Shape, ftype: str, seed: int = 0) -> Path:
    import gguf

    from radixserve.default_model import ensure_default_model

    head_dim = shape.hidden // shape.heads
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"synthetic-{path.stem}")
    add_llama_metadata(writer, shape)
    vocab = copy_tokenizer(writer, ensure_default_model())
    writer.add_vocab_size(vocab)
    kv = shape.kv_heads * head_dim
    per_layer = {
        "attn_q": (shape.hidden, shape.hidden),
        "attn_k": (kv, shape.hidden),
        "attn_v": (kv, shape.hidden),
        "attn_output": (shape.hidden, shape.hidden),
        "ffn_gate": (shape.intermediate, shape.hidden),
        "ffn_up": (shape.intermediate, shape.hidden),
        "ffn_down": (shape.hidden, shape.intermediate),
    }
    embed_type = tensor_type(ftype, "output" if shape.tied else "token_embd", 0, 1)
    tensors: list[tuple[str, int, tuple[int, int]]] = [
        ("token_embd", embed_type, (vocab, shape.hidden))
    ]
    for layer in range(shape.layers):
        for role, dims in per_layer.items():
            tensors.append(
                (f"blk.{layer}.{role}", tensor_type(ftype, role, layer, shape.layers), dims)
            )
    if not shape.tied:
        tensors.append(("output", tensor_type(ftype, "output", 0, 1), (vocab, shape.hidden)))
    ones = np.ones(shape.hidden, dtype=np.float32)
    for name, qtype, (rows, k) in tqdm(tensors, desc=f"Writing {path.name}", unit="tensor"):
        blocks = random_blocks(qtype, rows, k, rng)
        writer.add_tensor(f"{name}.weight", blocks, raw_dtype=gguf.GGMLQuantizationType(qtype))
    writer.add_tensor("output_norm.weight", ones)
    for layer in range(shape.layers):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", ones)
        writer.add_tensor(f"blk.{layer}.ffn_norm.weight", ones)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=True)
    writer.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument(
        "--ftype", choices=["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0"], default="Q4_K_M"
    )
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"synthetic-llama-{args.shape}-{args.ftype}.gguf"
    if path.exists():
        logger.info("%s exists (%.2f GB)", path, path.stat().st_size / 1e9)
    else:
        write_model(path, SHAPES[args.shape], args.ftype, args.seed)
        logger.info("wrote %s (%.2f GB)", path, path.stat().st_size / 1e9)
    print(path)


if __name__ == "__main__":
    main()
