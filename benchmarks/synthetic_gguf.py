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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixserve.kernels import gguf_types as gt

logger = logging.getLogger("synthetic_gguf")
DEFAULT_OUT = Path.home() / ".cache" / "radixserve-bench" / "models"


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool
    rope_theta: float = 500000.0


SHAPES = {
    "1b": Shape(2048, 8192, 16, 32, 8, tied=True),  # Llama-3.2-1B
    "3b": Shape(3072, 8192, 28, 24, 8, tied=True),  # Llama-3.2-3B
    "8b": Shape(4096, 14336, 32, 32, 8, tied=False),  # Llama-3.1-8B
}


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


def copy_tokenizer(writer: object, source: Path) -> None:
    """The default model's tokenizer and chat template."""
    from gguf import GGUFReader

    reader = GGUFReader(source)
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        writer.add_string(key, str(reader.fields[key].contents()))  # type: ignore[attr-defined]
    writer.add_token_list(reader.fields["tokenizer.ggml.tokens"].contents())  # type: ignore[attr-defined]
    writer.add_token_types(reader.fields["tokenizer.ggml.token_type"].contents())  # type: ignore[attr-defined]
    writer.add_token_merges(reader.fields["tokenizer.ggml.merges"].contents())  # type: ignore[attr-defined]
    writer.add_bos_token_id(1)  # type: ignore[attr-defined]
    writer.add_eos_token_id(2)  # type: ignore[attr-defined]
    writer.add_add_bos_token(False)  # type: ignore[attr-defined]


def write_model(path: Path, shape: Shape, ftype: str, seed: int = 0) -> Path:
    import gguf

    from radixserve.default_model import ensure_default_model

    vocab = 49152
    head_dim = shape.hidden // shape.heads
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"synthetic-{path.stem}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(head_dim)
    copy_tokenizer(writer, ensure_default_model())
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
