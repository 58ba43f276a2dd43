"""Time to first token for one image + question, and images per second at a concurrency, on
random models of real shapes (issue 32's proof): radixserve with and without its vision encoder
cache, and llama.cpp's llama-server on the same LLaVA weights from a GGUF + mmproj pair.

Models, made here with random weights:
- `llava`: a CLIP vision tower (ViT-B/16 at 224 px: 196 image tokens; `--vision l14`: LLaVA-1.5's
  ViT-L/14 at 336 px, 576 tokens), LLaVA's projector and a Llama of SmolLM2-135M's shape, saved
  as transformers saves LLaVA; also written as llama.cpp's pair (benchmarks/mmproj_pair.py,
  F16), which radixserve serves too (the pair's folder) and llama-server runs with --mmproj.
- `smolvlm`: SmolVLM-256M's shape (SigLIP 768-wide, 12 layers, 512 px tiles, pixel shuffle 4:
  64 tokens a tile, SmolLM2-135M), radixserve only (its processor upscales a 640x480 image to
  2048x1536: 12 tiles + the global view, 832 image tokens).

Each figure is the median of `--repeats` runs:
- new image: a new image each time (decoding, the image processor, the vision tower, prefill);
- same image after other text: the prompt differs at its second token (no prefix to share), so
  only the vision tower's output can be reused (--mm-preprocess-cache-size-mb);
- images/s: `--concurrency` requests of distinct images at once, one new token each.
radixserve runs through the offline Engine (no HTTP); llama-server through its OpenAI chat
endpoint on localhost (its own chat template around the question: the prompt lengths are given).
The engines run one after another, interleaved, and the 1-minute load average is printed with
each row: on a shared machine compare rows taken under similar load only.

    python benchmarks/vision_ttft.py [--model llava|smolvlm|all] [--vision b16|l14]
        [--repeats 3] [--concurrency 4] [--llama-server PATH] [--tokenizer-gguf PATH]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

IMAGE_TOKEN = 49152  # after SmolLM2's 49,152-token vocabulary (its tokenizer, for llama-server)
VOCAB = IMAGE_TOKEN + 64
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
        vocab_size=VOCAB,
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


# SmolVLM-256M's shape: SigLIP tower, pixel shuffle, SmolLM2-135M; its special tokens after
# SmolLM2's vocabulary.
SMOLVLM_IMAGE = 49190
SMOLVLM_NEWLINE = 49191  # "\n" between tile rows: a token of its own
SMOLVLM_SPECIALS = {
    "<global-img>": 49152,
    **{
        f"<row_{r}_col_{c}>": 49153 + 6 * (r - 1) + (c - 1)
        for r in range(1, 7)
        for c in range(1, 7)
    },
    "<fake_token_around_image>": 49189,
    "<image>": SMOLVLM_IMAGE,
    "<end_of_utterance>": 49279,
}


def make_smolvlm(folder: Path) -> None:
    """Save a random SmolVLM-256M-shaped checkpoint, its image processor and a word-level
    tokenizer holding the processor's special tokens into `folder`."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import (
        LlamaConfig,
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessorPil,
        SmolVLMVisionConfig,
    )

    vision = SmolVLMVisionConfig(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        image_size=512,
        patch_size=16,
    )
    text = LlamaConfig(
        vocab_size=49280,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    config = SmolVLMConfig(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=SMOLVLM_IMAGE,
        scale_factor=4,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = SmolVLMForConditionalGeneration(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    SmolVLMImageProcessorPil(
        size={"longest_edge": 2048},
        max_image_size={"longest_edge": 512},
        do_image_splitting=True,
    ).save_pretrained(folder)
    taken = set(SMOLVLM_SPECIALS.values()) | {SMOLVLM_NEWLINE}
    vocab = {f"w{i}": i for i in range(49280) if i not in taken}
    vocab.update(SMOLVLM_SPECIALS)
    vocab["\n"] = SMOLVLM_NEWLINE
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SMOLVLM_SPECIALS]
    )
    tok.add_tokens([AddedToken("\n", normalized=False)])
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="w0", bos_token="w1", eos_token="w2", pad_token="w0"
    ).save_pretrained(folder)


def first_token_s(engine: Any, prompts: list[list[int]], images: list[str]) -> float:
    return timed_request(engine, prompts, images)[0]


def timed_request(engine: Any, prompts: list[list[int]], images: list[str]) -> tuple[float, int]:
    """(seconds to the first token, the first prompt's token count); an aborted request raises
    (a failed request is no measurement)."""
    tic = time.perf_counter()
    out = engine.generate(
        input_ids=prompts if len(prompts) > 1 else prompts[0],
        image_data=images if len(images) > 1 else images[0],
        sampling_params={"max_new_tokens": 1, "temperature": 0},
    )
    elapsed = time.perf_counter() - tic
    outs = out if isinstance(out, list) else [out]
    for one in outs:
        reason = one["meta_info"].get("finish_reason") or {}
        if reason.get("type") == "abort":
            raise RuntimeError(f"request aborted: {reason}")
    return elapsed, int(outs[0]["meta_info"]["prompt_tokens"])


def measure(
    model_path: Path, image_token: int, cache_mb: int, repeats: int, concurrency: int, seed: int
) -> dict:
    from radixserve import Engine

    question = [1, *range(100, 130)]  # 31 text tokens, then the image, then 8 more
    prompt = [*question, image_token, *range(200, 208)]
    load = os.getloadavg()[0]
    with Engine(
        model_path=str(model_path),
        runtime="thread",
        skip_tokenizer_init=True,
        skip_server_warmup=True,
        mm_preprocess_cache_size_mb=cache_mb,
    ) as engine:
        first_token_s(engine, [prompt], [png(seed)])  # warm-up: processor, kernels
        timed = [timed_request(engine, [prompt], [png(seed + 1 + i)]) for i in range(repeats)]
        cold = [t for t, _ in timed]
        prompt_tokens = str(timed[0][1])
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
        "load": (load + os.getloadavg()[0]) / 2,
        "prompt_tokens": prompt_tokens,
    }


def measure_llama_server(
    binary: Path,
    model: Path,
    mmproj: Path,
    repeats: int,
    concurrency: int,
    seed: int,
    threads: int,
) -> dict:
    """The same three figures from llama-server (-t `threads`, --parallel `concurrency`)."""
    import socket
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [str(binary), "-m", str(model), "--mmproj", str(mmproj), "--port", str(port)]
    command += ["-t", str(threads), "--parallel", str(concurrency), "-c", "8192"]
    command += ["--no-warmup", "--temp", "0"]
    log = open(model.with_suffix(".server.log"), "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"llama-server exited ({server.returncode}); see {log.name}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server did not become healthy in 120 s")
            time.sleep(0.5)
        words = " ".join(f"word{i}" for i in range(12))  # about the Engine's 31 + 8 tokens

        def ask(first: str, image: str) -> tuple[float, int]:
            body = {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": f"{first} {words}"},
                            {"type": "image_url", "image_url": {"url": image}},
                            {"type": "text", "text": "describe it"},
                        ],
                    }
                ],
                "max_tokens": 1,
                "temperature": 0,
            }
            tic = time.perf_counter()
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
            reply.raise_for_status()
            return time.perf_counter() - tic, int(reply.json()["usage"]["prompt_tokens"])

        load = os.getloadavg()[0]
        ask("warm", png(seed))
        cold = [ask("question", png(seed + 1 + i)) for i in range(repeats)]
        image = png(seed + 100)
        ask("question", image)
        again = [ask(f"other{i}", image)[0] for i in range(repeats)]
        rates = []
        with ThreadPoolExecutor(concurrency) as pool:
            for r in range(max(1, repeats // 2)):
                pics = [png(seed + 1000 + r * concurrency + i) for i in range(concurrency)]
                tic = time.perf_counter()
                names = [f"batch{i}" for i in range(concurrency)]
                list(pool.map(ask, names, pics))
                rates.append(concurrency / (time.perf_counter() - tic))
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    return {
        "cold_ms": statistics.median(t for t, _ in cold) * 1e3,
        "again_ms": statistics.median(again) * 1e3,
        "images_per_s": statistics.median(rates),
        "load": (load + os.getloadavg()[0]) / 2,
        "prompt_tokens": str(cold[0][1]),
    }


DEFAULT_LLAMA_SERVER = (
    Path.home() / ".cache/radixserve-bench/llama_cpp_python-0.3.36-noamx/bin/llama-server"
)
DEFAULT_TOKENIZER = Path.home() / ".cache/radixserve-bench/models/smollm2-q4_k_m.gguf"


def _print(title: str, rows: list[tuple[str, dict]], concurrency: int) -> None:
    print(title)
    print(
        "| engine | load | prompt tokens | TTFT, new image (ms) | TTFT, same image after other "
        f"text (ms) | images/s at {concurrency} |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, row in rows:
        print(
            f"| {name} | {row['load']:.1f} | {row['prompt_tokens']} | {row['cold_ms']:.0f} | "
            f"{row['again_ms']:.0f} | {row['images_per_s']:.2f} |"
        )


def run_llava(args: argparse.Namespace, root: Path) -> None:
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.mmproj_pair import write_language_model, write_mmproj

    folder = root / "llava"
    tokens = make_model(folder, args.vision)
    pair = root / "pair"
    pair.mkdir()
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(folder)
    processor = transformers.CLIPImageProcessor.from_pretrained(folder)
    lm = write_language_model(hf, pair / "llava-lm-f16.gguf", args.tokenizer_gguf)
    mmproj = write_mmproj(
        hf, pair / "mmproj-llava-f16.gguf", processor.image_mean, processor.image_std
    )
    del hf
    server = args.llama_server if args.llama_server and args.llama_server.is_file() else None
    c, r = args.concurrency, args.repeats
    rows = []
    pair_row = ("radixserve, GGUF + mmproj pair, cache on", lm)
    for threads in args.llama_threads if server is not None else []:
        # llama.cpp's threads spin at each barrier: on a loaded machine fewer may be faster.
        name = f"llama-server --mmproj (F16 pair), -t {threads}"
        rows.append((name, measure_llama_server(server, lm, mmproj, r, c, 0, threads)))
        if pair_row is not None:  # interleaved: radixserve between the llama-server runs
            rows.append((pair_row[0], measure(pair_row[1], IMAGE_TOKEN, 512, r, c, 0)))
            pair_row = None
    rows.append(
        ("radixserve, safetensors, encoder cache on", measure(folder, IMAGE_TOKEN, 512, r, c, 0))
    )
    rows.append(
        ("radixserve, safetensors, encoder cache off", measure(folder, IMAGE_TOKEN, 0, r, c, 5000))
    )
    if pair_row is not None:
        rows.append((pair_row[0], measure(pair_row[1], IMAGE_TOKEN, 512, r, c, 0)))
    _print(
        f"random LLaVA-1.5 shape: CLIP {args.vision} ({tokens} image tokens) + SmolLM2-135M LM",
        rows,
        c,
    )


def run_smolvlm(args: argparse.Namespace, root: Path) -> None:
    folder = root / "smolvlm"
    make_smolvlm(folder)
    c, r = args.concurrency, args.repeats
    rows = [
        ("radixserve, encoder cache on", measure(folder, SMOLVLM_IMAGE, 512, r, c, 0)),
        ("radixserve, encoder cache off", measure(folder, SMOLVLM_IMAGE, 0, r, c, 5000)),
    ]
    _print("random SmolVLM-256M shape (its processor: 640x480 -> 12 tiles + global)", rows, c)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("llava", "smolvlm", "all"), default="all")
    ap.add_argument("--vision", choices=sorted(VISION_SHAPES), default="b16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    ap.add_argument("--tokenizer-gguf", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--llama-threads", type=int, nargs="+", default=[os.cpu_count() or 2])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # The pair's conversion (radixserve's GGUF cache) goes with the temporary models.
        os.environ["RADIXSERVE_CACHE_DIR"] = str(Path(tmp) / "cache")
        if args.model in ("llava", "all"):
            run_llava(args, Path(tmp))
        if args.model in ("smolvlm", "all"):
            run_smolvlm(args, Path(tmp))


if __name__ == "__main__":
    main()
