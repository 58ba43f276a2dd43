"""A tiny random Idefics3 / SmolVLM checkpoint (Idefics3 vision transformer, pixel-shuffle
connector, Llama) saved the way transformers saves one, with its processor (image processor
with tiling, tokenizer, image_seq_len): a word tokenizer ("w<i>" is token i; the image markers
`<image>`, `<fake_token_around_image>`, `<global-img>`, `<row_i_col_j>` and "\\n" are tokens of
their own at the top of the vocabulary) and a chat template that writes "<image>" per image."""

from __future__ import annotations

import io
from pathlib import Path

import torch

VOCAB = 512
IMAGE_SIZE = 32  # one tile's side (the vision transformer's image_size)
PATCH = 4
SCALE = 2
# (32 / 4)^2 patches, pixel-shuffled by 2 x 2: the <image> tokens of one tile.
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH) ** 2 // SCALE**2
LONGEST_EDGE = 2 * IMAGE_SIZE  # an image is resized to at most 2 x 2 tiles (plus the global one)

IMAGE_TOKEN = 500
FAKE_TOKEN = 501
GLOBAL_TOKEN = 502
END_OF_UTTERANCE = 503
NEWLINE = 504
ROW_COL_FIRST = 505  # <row_1_col_1>, <row_1_col_2>, <row_2_col_1>, <row_2_col_2>
SPECIALS = {
    "<image>": IMAGE_TOKEN,
    "<fake_token_around_image>": FAKE_TOKEN,
    "<global-img>": GLOBAL_TOKEN,
    "<end_of_utterance>": END_OF_UTTERANCE,
    **{f"<row_{r}_col_{c}>": ROW_COL_FIRST + 2 * (r - 1) + (c - 1) for r in (1, 2) for c in (1, 2)},
}

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} : "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %} <image> {% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %} w3 {% endfor %}"
    "{% if add_generation_prompt %}w4 {% endif %}"
)

FLAVOURS = ("idefics3", "smolvlm")


def make_tiny_idefics3(
    folder: Path, flavour: str = "idefics3", seed: int = 0, tied: bool = False
) -> torch.nn.Module:
    """Save the checkpoint and processor into `folder` and return transformers' model
    (Idefics3ForConditionalGeneration or SmolVLMForConditionalGeneration, float32, eval);
    `tied`: lm_head is the embedding table (the top-level tie_word_embeddings)."""
    import transformers
    from transformers import LlamaConfig

    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {FLAVOURS}")
    prefix = "Idefics3" if flavour == "idefics3" else "SmolVLM"
    vision = getattr(transformers, f"{prefix}VisionConfig")(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
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
        pad_token_id=0,
    )
    config = getattr(transformers, f"{prefix}Config")(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=IMAGE_TOKEN,
        scale_factor=SCALE,
        pad_token_id=0,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, f"{prefix}ForConditionalGeneration")(config).to(torch.float32)
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
    make_processor(flavour, folder)
    return model


def make_processor(flavour: str, folder: Path) -> None:
    """Save the tokenizer, the image processor (preprocessor_config.json, as published
    checkpoints have it) and, for Idefics3, the processor; SmolVLMProcessor needs num2words
    and a torchvision video processor, so a SmolVLM folder has no processor_config.json
    (the server only reads the image processor and the tokenizer)."""
    import transformers

    tokenizer = _tokenizer()
    tokenizer.save_pretrained(folder)
    image_kwargs = {
        "size": {"longest_edge": LONGEST_EDGE},
        "max_image_size": {"longest_edge": IMAGE_SIZE},
        "do_image_splitting": True,
    }
    prefix = "Idefics3" if flavour == "idefics3" else "SmolVLM"
    images = getattr(transformers, f"{prefix}ImageProcessorPil")(**image_kwargs)
    images.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    if flavour == "idefics3":
        transformers.Idefics3Processor(
            images, tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE
        ).save_pretrained(folder)


def reference_processor(folder: Path) -> object:
    """transformers' processor for the folder: its saved Idefics3Processor, or for SmolVLM an
    Idefics3Processor over its image processor and tokenizer (SmolVLMProcessor writes images
    the same way, transformers' get_image_prompt_string, but needs num2words)."""
    import transformers

    if (folder / "processor_config.json").exists():
        return transformers.AutoProcessor.from_pretrained(folder)
    return transformers.Idefics3Processor(
        transformers.AutoImageProcessor.from_pretrained(folder),
        transformers.AutoTokenizer.from_pretrained(folder),
        image_seq_len=IMAGE_SEQ_LEN,
    )


def _tokenizer() -> object:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(IMAGE_TOKEN)}
    vocab.update(SPECIALS)
    vocab["\n"] = NEWLINE
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    # Special, so the processor's "<fake_token_around_image><row_1_col_1><image><image>..."
    # splits into tokens; "\n" (between tile rows) is a token of its own too.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.add_tokens([AddedToken("\n", normalized=False)])
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
    """The folder's processor's model inputs for `text` (one "<image>" per image)."""
    from PIL import Image

    processor = reference_processor(folder)
    rgb = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    return dict(
        processor(text=text, images=rgb or None, return_tensors="pt", add_special_tokens=False)
    )


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
