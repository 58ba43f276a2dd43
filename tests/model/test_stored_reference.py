"""The stored HF reference (tests/data/vs_hf_reference.json) is what HF transformers generates
now from the same prompts and model file; RADIXSERVE_WRITE_HF_REFERENCE=1 rewrites it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.stored_reference import WRITE_ENV, load_stored_reference, write_stored_reference
from tests.helpers.vs_hf_prompts import VS_HF_MAX_NEW
from tests.model.conftest import generate_hf_reference


@pytest.mark.slow  # about a minute of HF generation on 2 cores
def test_stored_hf_reference_is_current(
    default_gguf: Path,
    hf_default_model: Any,
    vs_hf_prompts: list[list[int]],
    default_tokenizer: Any,
) -> None:
    fresh = generate_hf_reference(hf_default_model, vs_hf_prompts, default_tokenizer)
    if os.environ.get(WRITE_ENV):
        write_stored_reference(default_gguf, vs_hf_prompts, VS_HF_MAX_NEW, fresh)
    stored = load_stored_reference(default_gguf, vs_hf_prompts, VS_HF_MAX_NEW)
    assert stored is not None, f"the stored reference is stale: rerun with {WRITE_ENV}=1"
    assert stored == fresh
