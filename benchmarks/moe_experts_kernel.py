"""Time the MoE experts kernel (moe_rows_gguf) alone on a GGUF file's expert blocks.

Every layer's ffn_{gate,up,down}_exps run for `--tokens` rows with random top-k routing, as
one decode step's MoE layers would; prints the best of `--repeats` passes over all layers and
the bytes of the chosen experts read per second. To compare two builds of the kernels, pass
`--library PATH` (a built radixserve_cpu_*.so) and run the builds alternately.

    python benchmarks/moe_experts_kernel.py --model-path moe.gguf --tokens 1 8 32
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch


def _extension(library: str | None) -> ModuleType:
    if library is None:
        from radixserve.kernels.build import load_extension

        ext = load_extension()
        if ext is None:
            raise SystemExit("the C++ kernels are not built: python -m radixserve.kernels.build")
        return ext
    spec = importlib.util.spec_from_file_location(Path(library).name.split(".")[0], library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expert_layers(
    path: Path,
) -> list[tuple[torch.Tensor, int, torch.Tensor, int, torch.Tensor, int]]:
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    layers = []
    for layer in range(10_000):
        names = [f"blk.{layer}.ffn_{p}_exps.weight" for p in ("gate", "up", "down")]
        if not all(n in tensors for n in names):
            if layer and f"blk.{layer}.attn_norm.weight" not in tensors:
                break
            continue
        parts = []
        for name in names:
            t = tensors[name]
            parts += [torch.from_numpy(np.array(t.data)).contiguous(), int(t.tensor_type)]
        layers.append(tuple(parts))
    if not layers:
        raise SystemExit(f"{path} has no stacked expert tensors (ffn_*_exps)")
    return layers  # type: ignore[return-value]


def _experts_used(path: Path) -> int:
    """The file's `<arch>.expert_used_count` (top-k)."""
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    for name, field in fields.items():
        if name.endswith(".expert_used_count"):
            return int(field.parts[field.data[0]][0])
    raise SystemExit(f"{path} has no expert_used_count: pass --top-k")


def _run(
    ext: ModuleType, layers: list, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor
) -> None:
    for g, gq, u, uq, d, dq in layers:
        ext.moe_rows_gguf(x, chosen, weights, [g, u], [gq, uq], d, dq)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-path", type=Path, required=True)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--top-k", type=int, default=None, help="default: the file's expert_used_count")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--library", default=None, help="a built kernels .so to load instead")
    ap.add_argument(
        "--int16",
        action="store_true",
        help="int16 activations per 32 for the K-quant experts (default: Q8_K int8 per 256)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ext = _extension(args.library)
    ext.set_kquant_int8(not args.int16)
    layers = _expert_layers(args.model_path)
    gate, _, _, _, down, _ = layers[0]
    experts, hidden = gate.shape[0], down.shape[1]
    top_k = args.top_k or _experts_used(args.model_path)
    per_expert = sum(layers[0][i][0].numel() for i in (0, 2, 4))  # bytes of one expert
    torch.manual_seed(0)
    for tokens in args.tokens:
        x = torch.randn(tokens, hidden)
        chosen = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)]).long()
        weights = torch.rand(tokens, top_k)
        used = len(set(chosen.flatten().tolist()))

        _run(ext, layers, x, chosen, weights)
        best = float("inf")
        for _ in range(args.repeats):
            tic = time.perf_counter()
            _run(ext, layers, x, chosen, weights)
            best = min(best, time.perf_counter() - tic)
        read = per_expert * used * len(layers)
        print(
            f"tokens {tokens:3d}: {used:3d} of {experts} experts a layer, {best * 1e3:7.2f} ms for "
            f"{len(layers)} layers, {read / best / 1e9:5.1f} GB/s of expert blocks"
        )


if __name__ == "__main__":
    main()
