"""Tiny random LLaVA-OneVision (SigLIP, projector, Qwen2) and LLaVA-NeXT (CLIP, projector,
Llama) checkpoints saved the way transformers saves them, with their image processor (28-pixel
crops on a small pinpoint grid), the word tokenizer of tests/helpers/tiny_llava.py ("w<i>" is
token i, 500 is "<image>", 501 "<video>") and its chat template; and transformers' reference
processor and greedy tokens.

OneVision's vision_aspect_ratio is "anyres_max_2" so that the tiny grids exercise both sides of
its shrinking rule: a 1 x 2 grid stays (32 features, 2 crops' worth), a 2 x 2 grid shrinks."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from tests.helpers.tiny_llava import CHAT_TEMPLATE, png_bytes

IMAGE_TOKEN = 500
VIDEO_TOKEN = 501
VOCAB = 512
IMAGE_SIZE = 28
PATCH = 7
SIDE = IMAGE_SIZE // PATCH
PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56], [28, 84], [84, 28]]
FLAVOURS = ("onevision", "next")
ANYRES_MAX = "anyres_max_2"

__all__ = ["FLAVOURS", "IMAGE_TOKEN", "hf_greedy", "make_tiny", "png_bytes", "processor_inputs"]


def make_tiny(
    folder: Path, flavour: str, seed: int = 0, text_type: str = "llama"
) -> torch.nn.Module:
    """Save the checkpoint, image processor, tokenizer and chat template into `folder` and
    return transformers' model (float32, eval); NeXT's language model is `text_type`
    (llama or mistral, the latter with a sliding window shorter than the tests' prompts)."""
    import transformers

    if flavour == "onevision":
        vision = transformers.SiglipVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            image_size=IMAGE_SIZE,
            patch_size=PATCH,
            vision_use_head=False,
        )
        text = transformers.Qwen2Config(**_text_kwargs())
        config = transformers.LlavaOnevisionConfig(
            vision_config=vision,
            text_config=text,
            image_token_index=IMAGE_TOKEN,
            video_token_index=VIDEO_TOKEN,
            vision_feature_layer=-1,
            vision_feature_select_strategy="full",
            image_grid_pinpoints=PINPOINTS,
            vision_aspect_ratio=ANYRES_MAX,
        )
        cls = transformers.LlavaOnevisionForConditionalGeneration
    else:
        vision = transformers.CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            image_size=IMAGE_SIZE,
            patch_size=PATCH,
            projection_dim=32,
        )
        if text_type == "mistral":
            text = transformers.MistralConfig(**_text_kwargs(), sliding_window=48)
        else:
            text = transformers.LlamaConfig(**_text_kwargs())
        config = transformers.LlavaNextConfig(
            vision_config=vision,
            text_config=text,
            image_token_index=IMAGE_TOKEN,
            vision_feature_layer=-2,
            vision_feature_select_strategy="default",
            image_grid_pinpoints=PINPOINTS,
        )
        cls = transformers.LlavaNextForConditionalGeneration
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32)
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
    _image_processor(flavour).save_pretrained(folder)
    _tokenizer().save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return model


def _text_kwargs() -> dict:
    return {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
    }


def _image_processor(flavour: str) -> object:
    import transformers

    prefix = "LlavaOnevision" if flavour == "onevision" else "LlavaNext"
    kwargs: dict = {"image_grid_pinpoints": PINPOINTS}
    if flavour == "onevision":
        kwargs["size"] = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    else:
        kwargs["size"] = {"shortest_edge": IMAGE_SIZE}
        kwargs["crop_size"] = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    return getattr(transformers, f"{prefix}ImageProcessorPil")(**kwargs)


def _tokenizer() -> object:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)}
    for name, tok_id in (("<image>", IMAGE_TOKEN), ("<video>", VIDEO_TOKEN)):
        del vocab[f"w{tok_id}"]
        vocab[name] = tok_id
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<image>", "<video>")]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="w0", bos_token="w1", eos_token="w2", pad_token="w0"
    )


def reference_processor(folder: Path, flavour: str) -> object:
    """transformers' processor over the folder's image processor and tokenizer."""
    import transformers

    images = transformers.AutoImageProcessor.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    if flavour == "onevision":
        # Without torchvision there is no video processor class to check video_processor=None
        # against; the check is skipped (images only here).
        check = transformers.ProcessorMixin.check_argument_for_proper_class
        transformers.ProcessorMixin.check_argument_for_proper_class = lambda *args: None  # type: ignore[method-assign]
        try:
            return _onevision_processor(images, tokenizer)
        finally:
            transformers.ProcessorMixin.check_argument_for_proper_class = check  # type: ignore[method-assign]
    return transformers.LlavaNextProcessor(
        images,
        tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )


def _onevision_processor(images: object, tokenizer: object) -> object:
    import transformers

    return transformers.LlavaOnevisionProcessor(
        images,
        tokenizer,
        video_processor=None,
        num_image_tokens=SIDE * SIDE,
        vision_feature_select_strategy="full",
        vision_aspect_ratio=ANYRES_MAX,
    )


def processor_inputs(folder: Path, flavour: str, text: str, images: list[bytes]) -> dict:
    """The processor's model inputs for `text` (one "<image>" per image), its images one
    sample (OneVision then gives several images one crop each)."""
    from PIL import Image

    processor = reference_processor(folder, flavour)
    rgb = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    kwargs = {"images": [rgb]} if rgb else {}
    return dict(processor(text=[text], return_tensors="pt", add_special_tokens=False, **kwargs))


@torch.inference_mode()
def hf_greedy(
    model: torch.nn.Module,
    folder: Path,
    flavour: str,
    text: str,
    images: list[bytes],
    new_tokens: int,
) -> tuple[list[int], list[int]]:
    """transformers' (expanded prompt ids, greedy tokens) for `text` and its images."""
    from transformers import GenerationConfig

    inputs = processor_inputs(folder, flavour, text, images)
    # No eos: min_new_tokens would mask it (the server, told ignore_eos, may pick it), so
    # the model's generation config loses it for the call and runs the full length.
    saved = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=None, pad_token_id=0)
    try:
        out = model.generate(**inputs, do_sample=False, max_new_tokens=new_tokens)
    finally:
        model.generation_config = saved
    prompt = inputs["input_ids"][0].tolist()
    return prompt, out[0, len(prompt) :].tolist()
