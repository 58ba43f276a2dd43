"""A tiny random Qwen2-VL / Qwen2.5-VL checkpoint (vision transformer with its patch merger,
Qwen2 language model with M-RoPE) saved the way transformers saves one, with the folder's image
processor (dynamic resolution: 4-pixel patches merged 2 x 2, so an image's grid and token count
follow its size) and a word tokenizer ("w<i>" is token i; `<|image_pad|>`, `<|vision_start|>`,
`<|vision_end|>`, `<|video_pad|>` are tokens of their own at the top of the vocabulary)."""

from __future__ import annotations

import io
from pathlib import Path

import torch

VOCAB = 512
PATCH = 4
MERGE = 2
TEMPORAL = 2
IMAGE_PAD = 500
VISION_START = 501
VISION_END = 502
VIDEO_PAD = 503
SPECIALS = {
    "<|image_pad|>": IMAGE_PAD,
    "<|vision_start|>": VISION_START,
    "<|vision_end|>": VISION_END,
    "<|video_pad|>": VIDEO_PAD,
}
# An image is resized to a multiple of PATCH * MERGE pixels, between these pixel counts.
MIN_PIXELS = 8 * 8 * 4
MAX_PIXELS = 64 * 64

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} : "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %} <|vision_start|><|image_pad|><|vision_end|> "
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %} w3 {% endfor %}"
    "{% if add_generation_prompt %}w4 {% endif %}"
)

FLAVOURS = ("qwen2_vl", "qwen2_5_vl")
HEAD_DIM = 16
MROPE_SECTION = [2, 3, 3]  # sums to HEAD_DIM / 2


def make_tiny_qwen2vl(
    folder: Path, flavour: str = "qwen2_vl", seed: int = 0, tied: bool = False
) -> torch.nn.Module:
    """Save the checkpoint, tokenizer and image processor into `folder` and return
    transformers' model (float32, eval); `tied`: lm_head is the embedding table (the top-level
    tie_word_embeddings, as Qwen2.5-VL-3B has it)."""
    import transformers

    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {FLAVOURS}")
    text = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": MROPE_SECTION,
        },
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    vision: dict = dict(
        depth=2,
        num_heads=4,
        in_channels=3,
        patch_size=PATCH,
        spatial_merge_size=MERGE,
        temporal_patch_size=TEMPORAL,
    )
    if flavour == "qwen2_vl":
        vision.update(embed_dim=32, hidden_size=64, mlp_ratio=2)
        config_cls, model_cls = (
            transformers.Qwen2VLConfig,
            transformers.Qwen2VLForConditionalGeneration,
        )
    else:
        # Window attention over 2 x 2 merged patches (8 pixels); block 1 attends fully.
        vision.update(
            hidden_size=32,
            out_hidden_size=64,
            intermediate_size=48,
            window_size=16,
            fullatt_block_indexes=[1],
        )
        config_cls = transformers.Qwen2_5_VLConfig
        model_cls = transformers.Qwen2_5_VLForConditionalGeneration
    config = config_cls(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_PAD,
        video_token_id=VIDEO_PAD,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.1)
            else:
                param.normal_(0.0, 0.2)
    model.eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    _tokenizer().save_pretrained(folder)
    image_processor().save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return model


def image_processor() -> object:
    import transformers

    return transformers.Qwen2VLImageProcessor(
        patch_size=PATCH,
        merge_size=MERGE,
        temporal_patch_size=TEMPORAL,
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    )


def _tokenizer() -> object:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(IMAGE_PAD)}
    vocab.update(SPECIALS)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="w0", bos_token="w1", eos_token="w2", pad_token="w0"
    )


def png_bytes(seed: int, size: tuple[int, int]) -> bytes:
    """A random RGB PNG of (width, height)."""
    from PIL import Image

    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=gen, dtype=torch.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(out, format="PNG")
    return out.getvalue()


def processor_inputs(folder: Path, text: str, images: list[bytes]) -> dict:
    """transformers' model inputs for `text` (one `<|image_pad|>` per image), as
    Qwen2VLProcessor writes them: each image's pad token repeated grid t*h*w / merge^2 times
    (the processor itself needs a torchvision video processor, so its steps are taken here
    with the folder's own image processor and tokenizer)."""
    import transformers
    from PIL import Image

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    out: dict = {}
    if images:
        processor = transformers.AutoImageProcessor.from_pretrained(folder)
        rgb = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
        pixels = processor(images=rgb, return_tensors="pt")
        out["pixel_values"] = pixels["pixel_values"]
        out["image_grid_thw"] = pixels["image_grid_thw"]
        parts = text.split("<|image_pad|>")
        if len(parts) != len(images) + 1:
            raise ValueError("one <|image_pad|> per image")
        counts = [int(g.prod()) // MERGE**2 for g in pixels["image_grid_thw"]]
        text = parts[0] + "".join(
            "<|image_pad|>" * n + rest for n, rest in zip(counts, parts[1:], strict=True)
        )
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    out["input_ids"] = ids
    out["attention_mask"] = torch.ones_like(ids)
    out["mm_token_type_ids"] = (ids == IMAGE_PAD).to(torch.int32)
    return out


@torch.inference_mode()
def hf_greedy(
    model: torch.nn.Module, folder: Path, text: str, images: list[bytes], new_tokens: int
) -> tuple[list[int], list[int]]:
    """transformers' (expanded prompt ids, greedy tokens) for `text` and its images."""
    inputs = processor_inputs(folder, text, images)
    out = model.generate(
        **inputs, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens
    )
    prompt = inputs["input_ids"][0].tolist()
    return prompt, out[0, len(prompt) :].tolist()
