"""The detokenizer's decode-only tokenizer (tokenizers library alone) must decode exactly as the
full tokenizer does, and must not be chosen when it would not."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from radixserve.managers.detokenizer import IncrementalDetokenizer
from radixserve.managers.light_detokenizer import LightDecoder, light_decoder_source
from tests.helpers.hf_reference import default_gguf_path
from tests.helpers.tiny_models import save_word_tokenizer


@pytest.fixture(scope="module")
def smollm_tokenizer() -> Any:
    from radixserve.models.tokenizer import get_tokenizer

    path = default_gguf_path()
    if path is None:
        pytest.skip("the default model is not installed")
    return get_tokenizer(path)


def test_default_model_tokenizer_gets_the_light_decoder(smollm_tokenizer: Any) -> None:
    source = light_decoder_source(smollm_tokenizer)
    assert source is not None
    light = LightDecoder(source)
    rng = random.Random(7)
    vocab = len(smollm_tokenizer)
    for _ in range(200):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        for skip in (True, False):
            assert light.decode(ids, skip_special_tokens=skip) == smollm_tokenizer.decode(
                ids, skip_special_tokens=skip
            )


def test_streamed_text_is_identical_with_either_decoder(smollm_tokenizer: Any) -> None:
    source = light_decoder_source(smollm_tokenizer)
    assert source is not None
    text = "Streaming: café 東京 🙂 and code `x = {'a': 1}`.\nDone."
    ids = smollm_tokenizer.encode(text, add_special_tokens=False)
    outputs = []
    for decoder in (smollm_tokenizer, LightDecoder(source)):
        detok = IncrementalDetokenizer(decoder, stop_strings=["Done"])
        deltas = [detok.add([i], finished=False, matched_stop=None) for i in ids[:-1]]
        deltas.append(detok.add(ids[-1:], finished=True, matched_stop="Done"))
        outputs.append(deltas)
    assert outputs[0] == outputs[1]
    assert "".join(outputs[0]).startswith("Streaming: café 東京 🙂")


def test_a_tokenizer_whose_decode_differs_keeps_the_full_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    save_word_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert light_decoder_source(tokenizer) is not None

    class Shouting(type(tokenizer)):  # type: ignore[misc]
        def decode(self, ids: Any, **kwargs: Any) -> str:
            return super().decode(ids, **kwargs).upper() + "!"

    tokenizer.__class__ = Shouting
    assert light_decoder_source(tokenizer) is None


def test_a_slow_tokenizer_keeps_the_full_tokenizer() -> None:
    class NotFast:
        is_fast = False

    assert light_decoder_source(NotFast()) is None


def test_the_detokenizer_process_module_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import radixserve.managers.detokenizer_process\n"
        "from radixserve.managers.light_detokenizer import LightDecoder\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
