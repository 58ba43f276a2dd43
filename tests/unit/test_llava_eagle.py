"""EAGLE speculation on a vision model: the draft head reads the target's features of the
image tokens' positions (and their placeholder ids), and whatever it proposes, greedy output
with images equals plain decoding's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from radixserve import Engine
from tests.helpers.tiny_llava import data_url, make_tiny_llava, png_bytes
from tests.unit.eagle_heads import write_eagle_head

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


def _generate(folder: Path, images: list[bytes], **spec: Any) -> list[dict[str, Any]]:
    with Engine(
        model_path=str(folder),
        dtype="float32",
        skip_server_warmup=True,
        max_total_tokens=2048,
        runtime="thread",
        **spec,
    ) as engine:
        outs = engine.generate(
            prompt=["w5 <image> w6", "w5 <image> w7 <image> w6"],
            image_data=[data_url(images[0]), [data_url(b) for b in images]],
            sampling_params=GREEDY,
        )
    return outs


def test_eagle_with_images_equals_plain_decoding(tmp_path: Path) -> None:
    llava = tmp_path / "llava"
    llava.mkdir()
    make_tiny_llava(llava)
    # The head is the language model's: written from the LLaVA's text config.
    text = tmp_path / "text"
    text.mkdir()
    config = json.loads((llava / "config.json").read_text())["text_config"]
    (text / "config.json").write_text(json.dumps(config))
    head = write_eagle_head(tmp_path / "head", text)
    images = [png_bytes(50), png_bytes(51)]
    plain = _generate(llava, images)
    spec = _generate(
        llava,
        images,
        speculative_algorithm="EAGLE",
        speculative_draft_model_path=str(head),
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
    )
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    # The drafts were verified: rounds ran for both image requests.
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in spec)
