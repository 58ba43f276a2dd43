"""One vision encoder forward (tower + projector, one image) in float32 and in bfloat16, on
random towers of real shapes: LLaVA's CLIP ViT-B/16 and ViT-L/14 (models/vision_tower.py) and
SmolVLM-256M's SigLIP tower with its connector (models/idefics3.py, one 512 px tile). Prints the
median time of `--repeats` forwards after a warm-up and the largest difference of the bf16
features from the float32 ones (relative to the float32 features' largest magnitude).

    python benchmarks/vision_encoder_dtype.py [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def clip_encoder(shape: str) -> tuple[torch.nn.Module, int]:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    from radixserve.models.vision_tower import VisionEncoder

    hidden, inter, layers, heads, size, patch = {
        "b16": (768, 3072, 12, 12, 224, 16),
        "l14": (1024, 4096, 24, 16, 336, 14),
    }[shape]
    vision = CLIPVisionConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        image_size=size,
        patch_size=patch,
    )
    config = LlavaConfig(vision_config=vision, text_config=LlamaConfig(hidden_size=576))
    return VisionEncoder(config, 576), size


def siglip_encoder() -> tuple[torch.nn.Module, int]:
    from transformers import SmolVLMConfig, SmolVLMVisionConfig

    from radixserve.models.idefics3 import TiledVisionEncoder

    vision = SmolVLMVisionConfig(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        image_size=512,
        patch_size=16,
    )
    config = SmolVLMConfig(vision_config=vision.to_dict(), scale_factor=4)
    config.text_config.hidden_size = 576
    encoder = TiledVisionEncoder(config)
    return _NoMask(encoder), 512


class _NoMask(torch.nn.Module):
    """A tiled encoder called on whole tiles (no padding: no pixel mask)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.inner(pixels, None)


def run(encoder: torch.nn.Module, pixels: torch.Tensor, repeats: int) -> tuple[float, torch.Tensor]:
    with torch.inference_mode():
        out = encoder(pixels)  # warm-up (oneDNN primitive creation)
        times = []
        for _ in range(repeats):
            tic = time.perf_counter()
            out = encoder(pixels)
            times.append(time.perf_counter() - tic)
    return statistics.median(times) * 1e3, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| encoder (one image) | float32 (ms) | bfloat16 (ms) | bf16 max abs diff / max |")
    print("|---|---:|---:|---:|")
    builders = {
        "CLIP ViT-B/16 224 px + projector": lambda: clip_encoder("b16"),
        "CLIP ViT-L/14 336 px + projector": lambda: clip_encoder("l14"),
        "SigLIP (SmolVLM-256M) 512 px + connector": siglip_encoder,
    }
    for name, build in builders.items():
        torch.manual_seed(0)
        encoder, size = build()
        with torch.no_grad():
            for param in encoder.parameters():
                param.normal_(0.0, 0.02)
        encoder.eval()
        pixels = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
        fp32_ms, fp32 = run(encoder, pixels, args.repeats)
        bf16_ms, bf16 = run(encoder.to(torch.bfloat16), pixels, args.repeats)
        diff = (bf16.float() - fp32).abs().max() / fp32.abs().max()
        print(f"| {name} | {fp32_ms:.0f} | {bf16_ms:.0f} | {float(diff):.3f} |")


if __name__ == "__main__":
    main()
