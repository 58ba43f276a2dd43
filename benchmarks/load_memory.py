"""Peak memory of loading a float checkpoint with and without quantize-on-load.

Makes (once) a bfloat16 safetensors folder with random weights in the shape of Llama-3.2-1B
(hidden 2048, intermediate 8192, 16 layers, 32 heads, 8 kv heads, vocabulary 128,256, tied
embeddings; 1.24B parameters, 2.5 GB), written shard by shard (four layers a file, as HF does,
with its index) so making it needs one shard's memory. Then loads it with
`radixserve.models.loader.load_model` in a fresh process per mode, float32 compute, and prints
the process's peak resident memory (ru_maxrss) next to the checkpoint's size:

- `float`: no --quantization (the bfloat16 weights stay 16-bit, widened as multiplied);
- `w8a8_int8`, `bitsandbytes`: quantized layer by layer while loading;
- `<scheme>-after-load`: the whole float model loaded first, then quantized (what
  --quantization w8a8_int8 did before), for comparison.

    .venv/bin/python benchmarks/load_memory.py [--dir ~/.cache/radixserve-bench/llama-1b-bf16]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's radixserve, run from anywhere

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 2048, 8192, 16, 32, 8, 128256
HEAD_DIM = HIDDEN // HEADS
LAYERS_PER_SHARD = 4
MODES = ("float", "w8a8_int8", "bitsandbytes", "w8a8_int8-after-load", "bitsandbytes-after-load")


def _config() -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def _layer_shapes(i: int) -> dict[str, tuple[int, ...]]:
    p = f"model.layers.{i}."
    kv = KV_HEADS * HEAD_DIM
    return {
        p + "input_layernorm.weight": (HIDDEN,),
        p + "post_attention_layernorm.weight": (HIDDEN,),
        p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        p + "self_attn.k_proj.weight": (kv, HIDDEN),
        p + "self_attn.v_proj.weight": (kv, HIDDEN),
        p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        p + "mlp.gate_proj.weight": (INTER, HIDDEN),
        p + "mlp.up_proj.weight": (INTER, HIDDEN),
        p + "mlp.down_proj.weight": (HIDDEN, INTER),
    }


def make_checkpoint(folder: Path, seed: int = 0) -> int:
    """Write the folder unless it is complete; returns the weights' bytes."""
    import torch
    from safetensors.torch import save_file

    index_path = folder / "model.safetensors.index.json"
    if not index_path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        gen = torch.Generator().manual_seed(seed)
        groups: list[dict[str, tuple[int, ...]]] = [
            {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
        ]
        for start in range(0, LAYERS, LAYERS_PER_SHARD):
            group: dict[str, tuple[int, ...]] = {}
            for i in range(start, min(start + LAYERS_PER_SHARD, LAYERS)):
                group.update(_layer_shapes(i))
            groups.append(group)
        weight_map: dict[str, str] = {}
        for n, group in enumerate(groups):
            name = f"model-{n + 1:05d}-of-{len(groups):05d}.safetensors"
            tensors = {}
            for key, shape in group.items():
                if key.endswith("norm.weight"):
                    value = 1.0 + 0.1 * torch.randn(shape, generator=gen)
                else:
                    value = 0.02 * torch.randn(shape, generator=gen)
                tensors[key] = value.to(torch.bfloat16)
                weight_map[key] = name
            save_file(tensors, str(folder / name), metadata={"format": "pt"})
            del tensors
        (folder / "config.json").write_text(json.dumps(_config(), indent=1))
        index_path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def measure(folder: Path, mode: str) -> dict[str, object]:
    """Runs in the child: import, load, report (JSON on stdout)."""
    import torch

    from radixserve.models.loader import load_model
    from radixserve.models.quantize_on_load import SCHEMES, OnLoadQuantization

    torch.set_num_threads(2)
    before = _rss_mb()
    start = time.perf_counter()
    if mode.endswith("-after-load"):
        loaded = load_model(str(folder), dtype="float32")
        scheme = SCHEMES[mode.removesuffix("-after-load")]
        OnLoadQuantization(loaded.model, scheme).quantize_loaded()
    else:
        loaded = load_model(
            str(folder), dtype="float32", quantization=None if mode == "float" else mode
        )
    seconds = time.perf_counter() - start
    held = sum(t.numel() * t.element_size() for t in loaded.model.parameters())
    held += sum(t.numel() * t.element_size() for t in loaded.model.buffers())
    return {
        "mode": mode,
        "rss_after_imports_mb": round(before),
        "peak_rss_mb": round(_rss_mb()),
        "model_tensors_mb": round(held / 2**20),
        "load_s": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dir", type=Path, default=Path.home() / ".cache/radixserve-bench/llama-1b-bf16"
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.dir, args.child)))
        return 0
    size = make_checkpoint(args.dir)
    print(f"checkpoint: {args.dir} ({size / 2**20:.0f} MiB of safetensors)")
    for mode in args.modes:
        out = subprocess.run(
            [sys.executable, __file__, "--dir", str(args.dir), "--child", mode],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["peak_over_file"] = round(row["peak_rss_mb"] * 2**20 / size, 2)
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
