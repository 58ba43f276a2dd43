"""A tiny random Gemma 3 vision checkpoint (SigLIP tower, Gemma 3 projector, Gemma 3 text
model) saved the way transformers saves one, with a Gemma3Processor (its image processor and a
word tokenizer: "w<i>" is token i, but for <pad> <bos> <eos> <unk> (0-3), Gemma's image tokens and "\\n\\n" special) and a chat
template that writes `<start_of_image>` for each image part, as Gemma 3's does; and the
reference: transformers' greedy generate on the processor's inputs."""

from __future__ import annotations

import io
from pathlib import Path

import torch

VOCAB = 512
BOI = 300  # <start_of_image>
EOI = 301  # <end_of_image>
SOFT = 302  # <image_soft_token>
NEWLINES = 303  # "\n\n", which the processor writes around each image
IMAGE_SIZE = 56
PATCH = 7
TOKENS_PER_IMAGE = 16  # 8 x 8 patches pooled 2 x 2
SLIDING_WINDOW = 12  # under an image's 16 tokens: the window and the image block both matter

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} : "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %} <start_of_image> {% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %} w4 {% endfor %}"
    "{% if add_generation_prompt %}w5 {% endif %}"
)

_SPECIAL = {BOI: "<start_of_image>", EOI: "<end_of_image>", SOFT: "<image_soft_token>"}
# Named apart from the words: an added token "w1" would split "w10" into "w1" and "0".
_CONTROL = {0: "<pad>", 1: "<bos>", 2: "<eos>", 3: "<unk>"}


def tiny_config():  # type: ignore[no-untyped-def]
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
        vision_use_head=False,
    )
    text = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return Gemma3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=BOI,
        eoi_token_index=EOI,
        image_token_index=SOFT,
        architectures=["Gemma3ForConditionalGeneration"],
    )


def make_tiny_gemma3_vision(folder: Path, seed: int = 0) -> torch.nn.Module:
    """Save the checkpoint and its processor into `folder`; return transformers' model
    (float32, eval)."""
    from transformers import Gemma3ForConditionalGeneration

    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(tiny_config()).to(torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "embed_tokens" in name:
                # Small beside the layers' outputs: with the tied head a large embedding makes
                # the model repeat its last input token.
                param.normal_(0.0, 0.02)
            elif "norm" in name and name.endswith("weight"):
                param.uniform_(-0.5, 0.5)  # Gemma's norms scale by (1 + weight)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.1)
            else:
                param.normal_(0.0, 0.2)  # big enough that each image changes the answer
    model.eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor(folder).save_pretrained(folder)
    return model


def processor(folder: Path):  # type: ignore[no-untyped-def]
    """A Gemma3Processor over the tiny tokenizer and a Gemma3ImageProcessor for 56x56 pixels."""
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    images = Gemma3ImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return Gemma3Processor(
        images,
        _tokenizer(),
        chat_template=CHAT_TEMPLATE,
        image_seq_length=TOKENS_PER_IMAGE,
    )


def _tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)}
    for token_id, text in {**_CONTROL, **_SPECIAL, NEWLINES: "\n\n"}.items():
        del vocab[f"w{token_id}"]
        vocab[text] = token_id
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    # Special, so the processor's "<start_of_image><image_soft_token>..." splits into tokens.
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in [*_SPECIAL.values(), "\n\n"]]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        extra_special_tokens={
            "boi_token": _SPECIAL[BOI],
            "eoi_token": _SPECIAL[EOI],
            "image_token": _SPECIAL[SOFT],
        },
    )


def prompt_text(words: list[int], image_slots: list[int]) -> str:
    """A prompt of `words` ("w<i>") with `<start_of_image>` before the words at `image_slots`."""
    parts = []
    for i, word in enumerate(words):
        if i in image_slots:
            parts.append("<start_of_image>")
        parts.append(f"w{word}")
    return " ".join(parts)


@torch.inference_mode()
def hf_greedy(
    model: torch.nn.Module, folder: Path, text: str, images: list[bytes], new_tokens: int
) -> tuple[list[int], list[int]]:
    """(the processor's input ids, transformers' greedy tokens) for `text` and its images."""
    from PIL import Image
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(folder)
    rgb = [Image.open(io.BytesIO(b)).convert("RGB") for b in images] or None
    inputs = proc(text=text, images=rgb, return_tensors="pt")
    out = model.generate(
        **inputs, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens
    )
    prompt = inputs["input_ids"][0].tolist()
    return prompt, out[0, len(prompt) :].tolist()
