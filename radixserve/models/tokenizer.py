"""get_tokenizer: the Hugging Face tokenizer for a model folder, hub id or GGUF file."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

TOKENIZER_MODES = ("auto", "slow")


def tokenizer_source(path: str | os.PathLike[str]) -> str | Path:
    """Where get_tokenizer(path) reads the tokenizer from: for a GGUF, the cached folder of its
    converted metadata (converting it first if no earlier start has); a local folder as is;
    anything else (a hub id) unchanged."""
    from radixserve.models import gguf

    source: str | Path = os.fspath(path)
    local = Path(source).expanduser()
    if local.exists():
        gguf_file = gguf.find_gguf_file(local)
        source = gguf.ensure_metadata(gguf_file) if gguf_file is not None else local
    return source


def get_tokenizer(
    path: str | os.PathLike[str],
    *,
    tokenizer_mode: str = "auto",
    trust_remote_code: bool = False,
    revision: str | None = None,
) -> PreTrainedTokenizerBase:
    """Load the tokenizer (with its chat template). A GGUF path uses the converted cache folder,
    converting the GGUF first if no earlier start has (see radixserve.models.gguf)."""
    from transformers import AutoTokenizer

    if tokenizer_mode not in TOKENIZER_MODES:
        raise ValueError(
            f"--tokenizer-mode {tokenizer_mode!r} is not supported; choose one of: "
            f"{', '.join(TOKENIZER_MODES)}"
        )
    source = tokenizer_source(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source,
            use_fast=tokenizer_mode != "slow",
            trust_remote_code=trust_remote_code,
            revision=revision,
        )
    except ValueError as e:
        if not trust_remote_code and "trust_remote_code" in str(e):
            raise ValueError(
                f"the tokenizer of {source} needs custom code; pass --trust-remote-code"
            ) from e
        raise ValueError(f"cannot load the tokenizer from {source}: {e}") from e
    except OSError as e:
        raise FileNotFoundError(f"cannot load the tokenizer from {source}: {e}") from e
    if tokenizer_mode == "auto" and not getattr(tokenizer, "is_fast", True):
        logger.warning("Using a slow tokenizer for %s; a fast one would be quicker", source)
    return tokenizer
