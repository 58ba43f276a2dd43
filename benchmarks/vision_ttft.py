"""Time to first token for one image + question, and images per second at a concurrency, on a
random LLaVA-1.5-shaped model (issue 32's proof), with and without the vision encoder's cache.

The model is made here with random weights: a CLIP vision tower (default ViT-B/16 at 224 px:
196 image tokens) and a Llama language model of SmolLM2-135M's shape, saved as transformers
saves LLaVA. Each figure is the median of `--repeats` runs through the offline Engine:
- cold: a new image each time (the image processor, the vision tower and the prefill run);
- cached: the same image after other text (no prefix to share, so only the vision tower's
  output is reused, from --mm-preprocess-cache-size-mb's cache);
- uncached: the same, with the cache off (0 MiB);
- images/s: `--concurrency` requests of distinct images in one batch, one new token each.

    python benchmarks/vision_ttft.py [--vision b16|l14] [--repeats 5] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

IMAGE_TOKEN = 32000
VISION_SHAPES = {
    # (hidden, intermediate, layers, heads, image size, patch)
    "b16": (768, 3072, 12, 12, 224, 16),
    "l14": (1024, 4096, 24, 16, 336, 14),  # LLaVA-1.5's own tower: 576 image tokens
}


def make_model(folder: Path, vision: str) -> int:
    """Save a random LLaVA into `folder`; returns its image token count."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    hidden, inter, layers, heads, size, patch = VISION_SHAPES[vision]
    vision_config = CLIPVisionConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        image_size=size,
        patch_size=patch,
        projection_dim=hidden,
    )
    text_config = LlamaConfig(  # SmolLM2-135M's shape
        vocab_size=IMAGE_TOKEN + 64,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    tokens = (size // patch) ** 2
    config = LlavaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=IMAGE_TOKEN,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_seq_length=tokens,
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    ).save_pretrained(folder)
    return tokens


def png(seed: int) -> str:
    """A random 640x480 RGB PNG as a data URL."""
    import base64

    from PIL import Image

    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (480, 640, 3), generator=gen, dtype=torch.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def first_token_s(engine: Any, prompts: list[list[int]], images: list[str]) -> float:
    tic = time.perf_counter()
    engine.generate(
        input_ids=prompts if len(prompts) > 1 else prompts[0],
        image_data=images if len(images) > 1 else images[0],
        sampling_params={"max_new_tokens": 1, "temperature": 0},
    )
    return time.perf_counter() - tic


def measure(folder: Path, cache_mb: int, repeats: int, concurrency: int, seed: int) -> dict:
    from radixserve import Engine

    question = [1, *range(100, 130)]  # 31 text tokens, then the image, then 8 more
    prompt = [*question, IMAGE_TOKEN, *range(200, 208)]
    with Engine(
        model_path=str(folder),
        runtime="thread",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        mm_preprocess_cache_size_mb=cache_mb,
    ) as engine:
        first_token_s(engine, [prompt], [png(seed)])  # warm-up: processor, kernels
        cold = [first_token_s(engine, [prompt], [png(seed + 1 + i)]) for i in range(repeats)]
        image = png(seed + 100)
        first_token_s(engine, [prompt], [image])
        again = []
        for i in range(repeats):
            other = [1, 300 + i, *prompt[1:]]  # differs at token 1: no prefix to share
            again.append(first_token_s(engine, [other], [image]))
        batch = [[1, 400 + i, *prompt[1:]] for i in range(concurrency)]
        rates = []
        for r in range(max(1, repeats // 2)):
            pics = [png(seed + 1000 + r * concurrency + i) for i in range(concurrency)]
            rates.append(concurrency / first_token_s(engine, batch, pics))
    return {
        "cold_ms": statistics.median(cold) * 1e3,
        "again_ms": statistics.median(again) * 1e3,
        "images_per_s": statistics.median(rates),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vision", choices=sorted(VISION_SHAPES), default="b16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokens = make_model(folder, args.vision)
        with_cache = measure(folder, 512, args.repeats, args.concurrency, seed=0)
        without = measure(folder, 0, args.repeats, args.concurrency, seed=5000)
    print(f"random LLaVA-1.5 shape: CLIP {args.vision} ({tokens} image tokens) + SmolLM2-135M LM")
    print(
        "| | TTFT, new image (ms) | TTFT, same image after other text (ms) | images/s at "
        f"{args.concurrency} |"
    )
    print("|---|---:|---:|---:|")
    for name, row in (("encoder cache on (512 MiB)", with_cache), ("encoder cache off", without)):
        print(
            f"| {name} | {row['cold_ms']:.0f} | {row['again_ms']:.0f} | {row['images_per_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
