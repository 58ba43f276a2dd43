"""A tiny random LLaVA-1.5 checkpoint (CLIP vision tower, projector, Llama) saved the way
transformers saves one, with its CLIPImageProcessor, a word tokenizer ("w<i>" is token i, but
token 500 is the special token "<image>") and a chat template that writes "<image>" for each
image part; and images."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import torch

IMAGE_TOKEN = 500
IMAGE_SIZE = 28
PATCH = 7
TOKENS_PER_IMAGE = (IMAGE_SIZE // PATCH) ** 2  # "default" strategy: the CLS token is dropped
VOCAB = 512

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} : "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %} <image> {% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %} w3 {% endfor %}"
    "{% if add_generation_prompt %}w4 {% endif %}"
)


def make_tiny_llava(folder: Path, seed: int = 0) -> torch.nn.Module:
    """Save the checkpoint into `folder` and return transformers' model (float32, eval)."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
        projection_dim=32,
    )
    text = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=IMAGE_TOKEN,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_seq_length=TOKENS_PER_IMAGE,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).to(torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.1)
            else:
                param.normal_(0.0, 0.2)  # big enough that each image changes the answer
    model.eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor.save_pretrained(folder)
    _save_tokenizer(folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return model


def _save_tokenizer(folder: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)}
    del vocab[f"w{IMAGE_TOKEN}"]
    vocab["<image>"] = IMAGE_TOKEN
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    # Special, so "<image><image>" (LlavaProcessor's expansion) splits into tokens.
    tok.add_special_tokens([AddedToken("<image>", special=True, normalized=False)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="w0", bos_token="w1", eos_token="w2"
    )
    fast.save_pretrained(folder)


def png_bytes(seed: int, size: tuple[int, int] = (40, 32)) -> bytes:
    """A random RGB PNG."""
    from PIL import Image

    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=gen, dtype=torch.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def expanded(ids: list[int]) -> list[int]:
    """`ids` with each image token repeated TOKENS_PER_IMAGE times (what the processor does)."""
    out: list[int] = []
    for tok in ids:
        out.extend([tok] * (TOKENS_PER_IMAGE if tok == IMAGE_TOKEN else 1))
    return out


@torch.inference_mode()
def hf_llava_greedy(
    model: torch.nn.Module, folder: Path, ids: list[int], images: list[bytes], new_tokens: int
) -> list[int]:
    """transformers' greedy tokens for the prompt `ids` (one image token per image) and its
    images, preprocessed by the folder's image processor."""
    from PIL import Image
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(folder)
    input_ids = torch.tensor([expanded(ids)], dtype=torch.int64)
    kwargs = {}
    if images:
        rgb = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
        kwargs["pixel_values"] = processor(images=rgb, return_tensors="pt")["pixel_values"]
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        **kwargs,
    )
    return out[0, input_ids.shape[1] :].tolist()
