"""HF transformers' greedy continuations of the vs-HF prompts, stored as test data.

Generating them takes HF about a minute of the default test run on 2 cores, and they only change
when the prompts, the model file or transformers' arithmetic change. tests/data/vs_hf_reference.json
holds them with what they were made from; the fixture uses the file only when the prompts, the
token budget and the GGUF's checksum all match, and regenerates otherwise. A slow test
(tests/model/test_stored_reference.py) regenerates them and checks the file is current;
`RADIXSERVE_WRITE_HF_REFERENCE=1` makes that test rewrite it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

STORED_REFERENCE = Path(__file__).resolve().parents[1] / "data" / "vs_hf_reference.json"
WRITE_ENV = "RADIXSERVE_WRITE_HF_REFERENCE"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_stored_reference(
    gguf: Path, prompts: list[list[int]], max_new: int
) -> list[list[int]] | None:
    """The stored continuations if they were made from exactly these inputs, else None."""
    if not STORED_REFERENCE.is_file():
        return None
    data: dict[str, Any] = json.loads(STORED_REFERENCE.read_text())
    if (
        data.get("prompts") != prompts
        or data.get("max_new_tokens") != max_new
        or data.get("gguf_sha256") != file_sha256(gguf)
    ):
        return None
    return [list(map(int, r)) for r in data["reference"]]


def write_stored_reference(
    gguf: Path, prompts: list[list[int]], max_new: int, reference: list[list[int]]
) -> None:
    import transformers

    header = {
        "about": "HF transformers float32 greedy continuations of tests/helpers/vs_hf_prompts.py "
        "(see tests/helpers/stored_reference.py)",
        "transformers": transformers.__version__,
        "gguf_file": gguf.name,
        "gguf_sha256": file_sha256(gguf),
        "max_new_tokens": max_new,
    }
    # One line per sequence, so a change shows as a readable diff.
    fields = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in header.items()]
    for key, rows in (("prompts", prompts), ("reference", reference)):
        lines = ",\n  ".join(json.dumps(row) for row in rows)
        fields.append(f" {json.dumps(key)}: [\n  {lines}\n ]")
    STORED_REFERENCE.write_text("{\n" + ",\n".join(fields) + "\n}\n")
