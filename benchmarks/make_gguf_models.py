"""GGUF files with llama.cpp's own K-quant blocks, made by llama-quantize, for tests and benchmarks.

Two kinds of file, all written into one folder (default ~/.cache/radixserve-bench/models):

* ``smollm2-<type>.gguf``: the default model (SmolLM2-135M-Instruct, Q4_1, from
  ``radixserve.default_model.ensure_default_model``) requantized with
  ``llama-quantize --allow-requantize <in> <out> <TYPE>``. Its hidden size (576) is not a multiple
  of 256, so for K-quant types llama-quantize falls back to Q5_0/Q5_1/Q8_0 for the tensors whose
  rows are 576 wide: such a file mixes K-quant and legacy blocks, which is useful for tests. The
  text it writes is real (the quality is a requantized Q4_1's), so it serves as a greedy-text
  reference against llama.cpp.
* ``random-llama-<shape>-<type>.gguf``: random weights in the shape of Llama-3.2-1B (``1b``:
  hidden 2048, intermediate 8192, 16 layers, 32 heads, 8 kv heads, head_dim 64, tied
  embeddings), Llama-3.2-3B (``3b``: 3072, 8192, 28 layers, 24 heads, 8 kv heads, tied) or
  Llama-3.1-8B (``8b``: 4096, 14336, 32 layers, 32 heads, 8 kv heads, untied), rope_theta 500000.
  The vocabulary, tokenizer and chat template are the default model's (49,152 tokens; every
  ``tokenizer.*`` key is copied from its GGUF with GGUFReader), so the file is a valid
  llama-architecture GGUF that llama.cpp and radixserve load. Weights are written as F16
  (normal, std 0.02; RMS-norm weights F32 about 1.0), tensor by tensor with GGUFWriter's
  streaming calls (tensor infos first, then each tensor's data as it is made), so an 8B model
  needs about one tensor's worth of memory. llama-quantize then turns the F16 file into each
  requested type; the F16 intermediate is deleted unless ``--keep-f16``. The text such a model
  writes is noise; the arithmetic per token and the block-type layout are the real model's.

  llama.cpp's HF converter (convert_hf_to_gguf.py) permutes the rows of attn_q and attn_k for
  llama (rotary pairs from HF's half-split order into GGUF's interleaved order). Random weights
  have no source order, so nothing is permuted: the file stands for an already converted model.
  Llama 3's rope-frequency scaling (the ``rope_freqs`` tensor) is left out and the context length
  is 8192; neither changes the per-token arithmetic measured here.
* ``random-qwen3moe-<shape>-<type>.gguf``: the same for llama.cpp's qwen3moe architecture
  (per-head q/k norms, a float32 router, experts stacked in ``ffn_{gate,up,down}_exps``):
  ``moe-1b`` (hidden 1024, 24 layers, 16 heads of 64, 4 kv heads, 32 experts of width 512, 4
  used: 1.32B parameters, 0.26B active, issue 28's benchmark shape) and ``moe-30b``
  (Qwen3-30B-A3B's dimensions with the default model's vocabulary: 30.1B, 2.9B active).

Files that exist are kept (delete them to remake). Every file is written under a temporary name
and renamed when complete. For each file the script logs its tensor-type counts and prints one
line ``<path>\\t<bytes>`` on stdout.

    .venv/bin/python benchmarks/make_gguf_models.py                         # smollm2-q4_k_m
    .venv/bin/python benchmarks/make_gguf_models.py --shape 1b              # and the 1B Q4_K_M
    .venv/bin/python benchmarks/make_gguf_models.py --no-smollm2 --shape 8b --types Q4_K_M Q6_K
    .venv/bin/python benchmarks/make_gguf_models.py --types Q4_K_M Q5_K_M Q6_K Q8_0 Q4_0 Q5_0

llama-quantize is taken from ``--llama-quantize``, else from $LLAMA_QUANTIZE, else from the
``LLAMA_QUANTIZE=`` line of benchmarks/build_llama_cpp.sh (which builds it on first use).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

logger = logging.getLogger("make_gguf_models")

DEFAULT_OUT = Path.home() / ".cache" / "radixserve-bench" / "models"
BUILD_SCRIPT = REPO / "benchmarks" / "build_llama_cpp.sh"
VOCAB = 49152
# llama-quantize's type names (the ones worth testing; it knows more).
QUANT_TYPES = (
    "Q4_K_M",
    "Q4_K_S",
    "Q5_K_M",
    "Q5_K_S",
    "Q6_K",
    "Q3_K_M",
    "Q2_K",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
)
WEIGHT_STD = 0.02
NORM_STD = 0.02
CHUNK_ELEMENTS = 1 << 24  # random numbers made at a time (64 MB of float32)
PROGRESS_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]")


@dataclass(frozen=True)
class Shape:
    """The dimensions of a Llama-architecture model, or of a Qwen3-MoE one (`experts` > 0:
    every layer's MLP is `experts` experts of width `intermediate`, `experts_used` per token,
    with per-head q/k norms, as llama.cpp's qwen3moe)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool
    rope_theta: float = 500000.0
    experts: int = 0
    experts_used: int = 0
    head_size: int = 0  # 0: hidden // heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def arch(self) -> str:
        return "qwen3moe" if self.experts else "llama"

    def parameters(self, vocab: int = VOCAB) -> tuple[int, int]:
        """(total, active per token) weight parameters: the active count reads
        `experts_used` of the experts."""
        attn = 2 * self.hidden * self.heads * self.head_dim
        attn += 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate
        embed = vocab * self.hidden * (1 if self.tied else 2)
        experts, used = max(self.experts, 1), max(self.experts_used, 1)
        router = self.hidden * self.experts
        total = self.layers * (attn + experts * mlp + router) + embed
        active = self.layers * (attn + used * mlp + router) + embed
        return total, active


SHAPES: dict[str, Shape] = {
    "1b": Shape(2048, 8192, 16, 32, 8, tied=True),  # Llama-3.2-1B
    "3b": Shape(3072, 8192, 28, 24, 8, tied=True),  # Llama-3.2-3B
    "8b": Shape(4096, 14336, 32, 32, 8, tied=False),  # Llama-3.1-8B
    # Qwen3-MoE-shaped, small: 1.32B parameters, 0.26B active (issue 28's benchmark shape)
    "moe-1b": Shape(
        1024, 512, 24, 16, 4, tied=True, rope_theta=1e6, experts=32, experts_used=4, head_size=64
    ),
    # Qwen3-30B-A3B's shape (30.5B, 3.3B active): for paper figures and big machines
    "moe-30b": Shape(
        2048, 768, 48, 32, 4, tied=False, rope_theta=1e6, experts=128, experts_used=8, head_size=128
    ),
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the F16 file: GGUF name, numpy shape (rows, columns) and kind."""

    name: str
    shape: tuple[int, ...]
    norm: bool = False
    f32: bool = False  # a weight kept in float32 (the MoE router, as converters write it)

    @property
    def dtype(self) -> type[np.floating]:
        return np.float32 if self.norm or self.f32 else np.float16

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


def human(nbytes: int) -> str:
    """Bytes as MB or GB."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def tensor_specs(shape: Shape, vocab: int = VOCAB) -> list[TensorSpec]:
    """The tensors of a llama GGUF in llama.cpp's order (layer by layer, as llama-quantize's
    layer counters for attn_v/ffn_down expect)."""
    kv = shape.kv_heads * shape.head_dim
    specs = [TensorSpec("token_embd.weight", (vocab, shape.hidden))]
    for layer in range(shape.layers):
        prefix = f"blk.{layer}"
        specs += [
            TensorSpec(f"{prefix}.attn_norm.weight", (shape.hidden,), norm=True),
            TensorSpec(f"{prefix}.attn_q.weight", (shape.heads * shape.head_dim, shape.hidden)),
            TensorSpec(f"{prefix}.attn_k.weight", (kv, shape.hidden)),
            TensorSpec(f"{prefix}.attn_v.weight", (kv, shape.hidden)),
            TensorSpec(
                f"{prefix}.attn_output.weight", (shape.hidden, shape.heads * shape.head_dim)
            ),
            TensorSpec(f"{prefix}.ffn_norm.weight", (shape.hidden,), norm=True),
        ]
        specs += _moe_specs(shape, prefix) if shape.experts else _mlp_specs(shape, prefix)
    specs.append(TensorSpec("output_norm.weight", (shape.hidden,), norm=True))
    if not shape.tied:
        specs.append(TensorSpec("output.weight", (vocab, shape.hidden)))
    return specs


def _mlp_specs(shape: Shape, prefix: str) -> list[TensorSpec]:
    return [
        TensorSpec(f"{prefix}.ffn_gate.weight", (shape.intermediate, shape.hidden)),
        TensorSpec(f"{prefix}.ffn_up.weight", (shape.intermediate, shape.hidden)),
        TensorSpec(f"{prefix}.ffn_down.weight", (shape.hidden, shape.intermediate)),
    ]


def _moe_specs(shape: Shape, prefix: str) -> list[TensorSpec]:
    """llama.cpp's qwen3moe layer: per-head q/k norms, the router (kept unquantized by
    llama-quantize) and the experts stacked into 3-D tensors [experts, rows, columns]."""
    e, ff, h = shape.experts, shape.intermediate, shape.hidden
    return [
        TensorSpec(f"{prefix}.attn_q_norm.weight", (shape.head_dim,), norm=True),
        TensorSpec(f"{prefix}.attn_k_norm.weight", (shape.head_dim,), norm=True),
        TensorSpec(f"{prefix}.ffn_gate_inp.weight", (e, h), f32=True),
        TensorSpec(f"{prefix}.ffn_gate_exps.weight", (e, ff, h)),
        TensorSpec(f"{prefix}.ffn_up_exps.weight", (e, ff, h)),
        TensorSpec(f"{prefix}.ffn_down_exps.weight", (e, h, ff)),
    ]


def random_tensor(
    spec: TensorSpec, rng: np.random.Generator, progress: tqdm | None = None
) -> np.ndarray:
    """Normal weights (std 0.02), or norms about 1.0, made in chunks of rows so that only the
    result is held whole."""
    out = np.empty(spec.shape, dtype=spec.dtype)
    flat = out.reshape(-1)
    for start in range(0, flat.size, CHUNK_ELEMENTS):
        stop = min(start + CHUNK_ELEMENTS, flat.size)
        chunk = rng.standard_normal(stop - start, dtype=np.float32)
        if spec.norm:
            chunk = 1.0 + NORM_STD * chunk
        else:
            chunk *= WEIGHT_STD
        flat[start:stop] = chunk
        if progress is not None:
            progress.update((stop - start) * out.itemsize)
    return out


def copy_tokenizer(writer: object, source: Path) -> int:
    """Copies every ``tokenizer.*`` key (vocabulary, merges, token types, special ids, chat
    template) of `source` with its GGUF value type; returns the vocabulary size."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(source)
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") or not field.types:
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = field.contents()
        writer.add_key_value(key, value, vtype, sub_type)  # type: ignore[attr-defined]
        if key == "tokenizer.ggml.tokens":
            vocab = len(value)
    if not vocab:
        raise ValueError(f"{source} has no tokenizer.ggml.tokens")
    return vocab


def add_llama_metadata(writer: object, shape: Shape) -> None:
    """The <arch>.* hyperparameters of `shape` (context 8192, RMS norm epsilon 1e-5; the
    writer's architecture is shape.arch, which prefixes the keys)."""
    writer.add_block_count(shape.layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    if shape.experts:
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.intermediate)


def write_random_f16(path: Path, shape: Shape, tokenizer_source: Path, seed: int) -> Path:
    """Writes a random-weight F16 llama GGUF at `path`, streaming tensor by tensor."""
    import gguf

    tmp = path.with_name(path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), shape.arch)
    writer.add_name(path.stem)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_llama_metadata(writer, shape)
    vocab = copy_tokenizer(writer, tokenizer_source)
    writer.add_vocab_size(vocab)
    specs = tensor_specs(shape, vocab)
    for spec in specs:
        writer.add_tensor_info(spec.name, spec.shape, np.dtype(spec.dtype), spec.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    total = sum(spec.nbytes for spec in specs)
    try:
        with tqdm(
            total=total, desc=f"Writing {path.name}", unit="B", unit_scale=True, unit_divisor=1024
        ) as progress:
            for spec in specs:
                writer.write_tensor_data(random_tensor(spec, rng, progress))
        writer.close()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
    return path


def write_direct(path: Path, shape: Shape, tokenizer_source: Path, seed: int) -> Path:
    """`shape` as a random Q4_K_M file written block by block (random_block_gguf.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gguf
    from random_block_gguf import write_random_q4_k_m

    vocab = len(gguf.GGUFReader(tokenizer_source).fields["tokenizer.ggml.tokens"].data)

    def add_metadata(writer: object) -> None:
        add_llama_metadata(writer, shape)
        copy_tokenizer(writer, tokenizer_source)
        writer.add_vocab_size(vocab)  # type: ignore[attr-defined]

    specs = tensor_specs(shape, vocab)
    return write_random_q4_k_m(
        path, shape.arch, shape.tied, shape.layers, specs, add_metadata, seed
    )


def find_llama_quantize(explicit: Path | None) -> Path:
    """--llama-quantize, $LLAMA_QUANTIZE, or the cached (or freshly built) llama.cpp build."""
    if explicit is not None:
        return explicit
    if os.environ.get("LLAMA_QUANTIZE"):
        return Path(os.environ["LLAMA_QUANTIZE"])
    logger.info("llama-quantize: building or reusing the cached build (%s) ...", BUILD_SCRIPT)
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key == "LLAMA_QUANTIZE":
            return Path(value.strip())
    raise RuntimeError(f"{BUILD_SCRIPT} printed no LLAMA_QUANTIZE= line")


def quantize(
    binary: Path, source: Path, target: Path, qtype: str, threads: int, requantize: bool
) -> Path:
    """Runs llama-quantize (output to a temporary name, renamed when done), with a progress bar
    fed by its ``[  i/ n]`` lines; its full output goes to ``<target>.log``."""
    tmp = target.with_name(target.name + ".tmp")
    log_path = target.with_name(target.name + ".log")
    command = [str(binary)]
    if requantize:
        command.append("--allow-requantize")
    command += [str(source), str(tmp), qtype, str(threads)]
    logger.info("%s", " ".join(command))
    with (
        log_path.open("w") as log,
        tqdm(desc=f"Quantizing {target.name}", unit="tensor") as progress,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        ) as process,
    ):
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            match = PROGRESS_LINE.match(line)
            if match:
                done, total = int(match.group(1)), int(match.group(2))
                progress.total = total
                progress.update(done - progress.n)
        returncode = process.wait()
    if returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama-quantize failed ({returncode}); see {log_path}")
    tmp.replace(target)
    return target


def tensor_type_counts(path: Path) -> Counter[str]:
    """How many tensors of each GGML type the file holds."""
    from gguf import GGUFReader

    return Counter(tensor.tensor_type.name for tensor in GGUFReader(path).tensors)


def report(path: Path, made: bool) -> None:
    """Logs the file's size and tensor types; prints ``<path>\\t<bytes>`` on stdout."""
    size = path.stat().st_size
    counts = ", ".join(f"{name} {n}" for name, n in sorted(tensor_type_counts(path).items()))
    logger.info("%s %s (%s): %s", "made" if made else "exists", path, human(size), counts)
    print(f"{path}\t{size}", flush=True)


def jobs(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(model, type) pairs to make, in order."""
    models = (["smollm2"] if args.smollm2 else []) + list(dict.fromkeys(args.shape or []))
    for model in models:
        for qtype in dict.fromkeys(args.types):
            yield model, qtype


def output_path(out_dir: Path, model: str, qtype: str) -> Path:
    stem = "smollm2" if model == "smollm2" else f"random-{SHAPES[model].arch}-{model}"
    return out_dir / f"{stem}-{qtype.lower()}.gguf"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[1:]),
    )
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="default: %(default)s")
    parser.add_argument(
        "--types",
        nargs="+",
        choices=QUANT_TYPES,
        default=["Q4_K_M"],
        metavar="TYPE",
        help=f"llama-quantize types, each for every model (default Q4_K_M; {', '.join(QUANT_TYPES)})",
    )
    parser.add_argument(
        "--shape",
        action="append",
        choices=sorted(SHAPES),
        help="random-weight shape to make (repeatable): 1b, 3b or 8b (Llama), moe-1b or "
        "moe-30b (Qwen3-MoE)",
    )
    parser.add_argument(
        "--smollm2",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="requantize the default model (default: yes)",
    )
    parser.add_argument("--keep-f16", action="store_true", help="keep the random F16 files")
    parser.add_argument(
        "--direct-blocks",
        action="store_true",
        help="random shapes in Q4_K_M: write the blocks directly (random_block_gguf.py), with "
        "no F16 file and no llama-quantize (for shapes whose F16 file does not fit the disk)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random weights' seed")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="llama-quantize threads"
    )
    parser.add_argument("--llama-quantize", type=Path, help="path of llama-quantize")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    todo = [(m, t, output_path(args.out_dir, m, t)) for m, t in jobs(args)]
    if not todo:
        logger.warning("nothing to make (--no-smollm2 and no --shape)")
        return 0
    binary: Path | None = None
    from radixserve.default_model import ensure_default_model

    default_gguf = Path(ensure_default_model())
    f16_made: set[Path] = set()
    for model, qtype, target in todo:
        if target.is_file():
            report(target, made=False)
            continue
        if args.direct_blocks and model != "smollm2" and qtype == "Q4_K_M":
            write_direct(target, SHAPES[model], default_gguf, args.seed)
            report(target, made=True)
            continue
        if binary is None:
            binary = find_llama_quantize(args.llama_quantize)
            logger.info("llama-quantize: %s", binary)
        if model == "smollm2":
            quantize(binary, default_gguf, target, qtype, args.threads, requantize=True)
        else:
            f16 = output_path(args.out_dir, model, "f16")
            if not f16.is_file():
                write_random_f16(f16, SHAPES[model], default_gguf, args.seed)
                f16_made.add(f16)
                logger.info("made %s (%s)", f16, human(f16.stat().st_size))
            quantize(binary, f16, target, qtype, args.threads, requantize=False)
        report(target, made=True)
    if not args.keep_f16:
        # Only the ones made by this run: one kept by an earlier --keep-f16 run stays.
        for f16 in sorted(f16_made):
            logger.info("deleting %s (--keep-f16 keeps it)", f16)
            f16.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
