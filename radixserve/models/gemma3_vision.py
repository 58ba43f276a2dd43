"""Gemma 3 with its vision tower (Gemma3ForConditionalGeneration: gemma-3-4b-it and larger).

A SigLIP encoder and Gemma 3's projector (models/gemma3_vision_tower.py) turn each image into
mm_tokens_per_image features that replace the embeddings of its `<image_soft_token>`s, after
the Gemma embedding scale (as transformers does: the scale is part of its embedding module, the
features are scattered into its output). The prompt holds an image as Gemma3Processor writes it:
"\\n\\n", `<start_of_image>`, the soft tokens, `<end_of_image>`, "\\n\\n" (the API side expands
each `<start_of_image>` the chat template writes: multimodal/image_prompt.py). The language
model is the project's Gemma 3 (sliding-window and global layers, scaled embeddings).

As in transformers, the soft tokens of one image attend to each other both ways during prefill
(token_type_ids there; ForwardBatch.bidirectional_blocks here, honoured by the attention
backends on a PyTorch masked path: layers/attention/bidirectional.py); text, and later decode
steps, stay causal. So an image's tokens must run in one step: the scheduler never ends a
prefill chunk inside an image of this model (keep_images_whole).

Checkpoints are read as transformers writes them and as the published ones lay them out:
`language_model.model.*` or `model.language_model.*` for the language model, `vision_tower.*`
(with or without SigLIP's `vision_model.` level) and `multi_modal_projector.*`, each with or
without a leading `model.`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from radixserve.models.gemma3 import Gemma3ForCausalLM
from radixserve.models.gemma3_vision_tower import Gemma3VisionEncoder, tokens_per_image
from radixserve.models.image_features import (
    ImageFeatureSteps,
    ImagePiece,
    language_and_vision_names,
)
from radixserve.models.vision_feature_cache import VisionFeatureCache, budget_bytes

if TYPE_CHECKING:
    from radixserve.model_executor.forward_batch import ForwardBatch
    from radixserve.models.config import ModelConfig

VISION = "vision."  # the encoder's attribute name, prefixing its parameters
# What Gemma3Processor writes around an image's soft tokens (its full_image_sequence), as text
# to be tokenized by the model's tokenizer (managers/image_intake.image_prompt).
NEWLINES = "\n\n"


def language_config(config: ModelConfig) -> ModelConfig:
    """The language model's view of the config: its text_config as the HF config."""
    text = config.hf_config.text_config
    model_type = str(getattr(text, "model_type", "gemma3_text"))
    if model_type != "gemma3_text":
        raise ValueError(f"Gemma 3 with a {model_type!r} language model is not supported")
    return dataclasses.replace(
        config, hf_config=text, architectures=("Gemma3ForCausalLM",), model_type=model_type
    )


def _token_id(hf: object, name: str) -> int:
    value = getattr(hf, f"{name}_index", None)
    if value is None:
        value = getattr(hf, f"{name}_id")
    return int(value)


class Gemma3ForConditionalGeneration(ImageFeatureSteps, Gemma3ForCausalLM):
    # Read by the scheduler: an image's tokens attend to each other both ways, so a prefill
    # chunk must never end inside one.
    keep_images_whole = True

    def __init__(self, config: ModelConfig) -> None:
        from radixserve.distributed import parallel_state

        if parallel_state.get_pp_size() != 1:
            # The pipeline runs the stages' bodies directly, past forward's image features.
            raise ValueError("Gemma 3 with images runs with --pp-size 1 only")
        super().__init__(language_config(config))
        hf = config.hf_config
        self.vision = Gemma3VisionEncoder(hf, config.hidden_size)
        # Read by the scheduler (image intake), whose ImagePrompt reaches the API side: the
        # soft token the features replace, the token the chat template writes per image
        # (<start_of_image>), and the text the processor puts around the soft tokens.
        self.image_token_id = _token_id(hf, "image_token")
        self.image_placeholder_id = _token_id(hf, "boi_token")
        self.image_frame = (
            (NEWLINES, self.image_placeholder_id),
            (_token_id(hf, "eoi_token"), NEWLINES),
        )
        self.tokens_per_image = tokens_per_image(hf)
        self.image_size = int(hf.vision_config.image_size)
        self.vocab_size = config.vocab_size
        # Encoder outputs by image hash (--mm-preprocess-cache-size-mb; the runner sets it).
        self.feature_cache = VisionFeatureCache(budget_bytes(None))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if forward_batch.image_chunks:
            chunks = forward_batch.image_chunks
            self.set_image_rows(forward_batch, input_ids.device)
            forward_batch.bidirectional_blocks = image_blocks(chunks)
            if self.image_token_id >= self.vocab_size:
                # A soft token outside the vocabulary (as transformers does): any row embeds,
                # the features replace it.
                input_ids = input_ids.masked_fill(input_ids == self.image_token_id, 0)
        return self.model(input_ids, positions, forward_batch)

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors under this model's names: the language model's as
        Gemma3ForCausalLM names them, the vision side's under `vision.`."""
        return language_and_vision_names(weights, self.vision.param_name, VISION)

    def param_shard(self, name: str) -> tuple[str, object] | None:
        # The vision side's tensors load whole (SigLIP's q/k/v projections are not stacked).
        return (name, None) if name.startswith(VISION) else None


def image_blocks(chunks: Iterable[ImagePiece]) -> tuple[tuple[int, int], ...]:
    """The flattened rows (first, count) of each image piece in the step, which attend to each
    other both ways. Each piece must end its image: its earlier tokens (a cached prefix) were
    run whole before, and a later piece would have needed to be seen by this one."""
    blocks = []
    for c in chunks:
        if c.start + c.length != c.image.length:
            raise RuntimeError(
                "a prefill step ends inside an image of a model whose image tokens attend both "
                "ways (the scheduler keeps such images whole)"
            )
        blocks.append((c.row, c.length))
    return tuple(blocks)
