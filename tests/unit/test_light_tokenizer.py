"""The API process's tokenizer, loaded without AutoTokenizer (utils/light_tokenizer.py), must be
the tokenizer AutoTokenizer loads: same class, encodings, special tokens and chat template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from radixserve.managers.scheduler_factory import load_tokenizer
from radixserve.models.tokenizer import tokenizer_source
from radixserve.server_args import ServerArgs
from radixserve.utils.light_tokenizer import (
    load_named_class,
    predicted_class,
    remembered_class,
    tokenizer_class_name,
)
from tests.helpers.hf_reference import default_gguf_path
from tests.helpers.tiny_models import save_word_tokenizer

TEXTS = ["Hello world", "  café 東京 🙂\n\tcode `x = {'a': 1}`", "<|im_start|>user"]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3 + 3?"},
]


@pytest.fixture(scope="module")
def default_folder() -> Path:
    path = default_gguf_path()
    if path is None:
        pytest.skip("the default model is not installed")
    return Path(tokenizer_source(path))


def _declaring(tmp_path: Path, source: Path, tokenizer_class: str) -> Path:
    """A copy of `source` whose tokenizer_config.json names `tokenizer_class`."""
    folder = tmp_path / tokenizer_class
    shutil.copytree(source, folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = tokenizer_class
    config_file.write_text(json.dumps(config))
    return folder


def _word_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "word"
    save_word_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def _light(folder: Path, class_name: str | None) -> Any:
    args = ServerArgs.from_kwargs(model_path=str(folder))
    return load_tokenizer(args, str(folder), light=True, class_name=class_name)


def _assert_same(light: Any, auto: Any) -> None:
    assert type(light) is type(auto)
    for text in TEXTS:
        assert light.encode(text) == auto.encode(text)
        assert light.encode(text, add_special_tokens=False) == auto.encode(
            text, add_special_tokens=False
        )
    assert light.all_special_tokens == auto.all_special_tokens
    assert (light.bos_token_id, light.eos_token_id) == (auto.bos_token_id, auto.eos_token_id)
    assert len(light) == len(auto)
    if auto.chat_template is not None:
        for generation_prompt in (True, False):
            assert light.apply_chat_template(
                MESSAGES, tokenize=False, add_generation_prompt=generation_prompt
            ) == auto.apply_chat_template(
                MESSAGES, tokenize=False, add_generation_prompt=generation_prompt
            )


@pytest.mark.parametrize(
    "declared",
    [None, "GPT2Tokenizer", "Qwen2TokenizerFast", "PreTrainedTokenizerFast", "TokenizersBackend"],
)
def test_the_predicted_class_is_autotokenizers(
    default_folder: Path, tmp_path: Path, declared: str | None
) -> None:
    from transformers import AutoTokenizer

    folder = default_folder if declared is None else _declaring(tmp_path, default_folder, declared)
    auto = AutoTokenizer.from_pretrained(folder)
    assert predicted_class(folder) is type(auto)
    _assert_same(_light(folder, None), auto)  # the early load, before the scheduler reports
    _assert_same(_light(folder, tokenizer_class_name(auto)), auto)


def test_a_saved_fast_tokenizer_folder(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = _word_folder(tmp_path)
    auto = AutoTokenizer.from_pretrained(folder)
    assert predicted_class(folder) is type(auto)
    _assert_same(_light(folder, None), auto)


def test_a_llama_class_over_a_byte_level_tokenizer_is_left_to_autotokenizer(
    default_folder: Path, tmp_path: Path
) -> None:
    """AutoTokenizer swaps such a declared LlamaTokenizer for its own choice; the prediction
    stands aside, and the class the scheduler reports is loaded instead."""
    from transformers import AutoTokenizer

    folder = _declaring(tmp_path, default_folder, "LlamaTokenizerFast")
    assert predicted_class(folder) is None
    auto = AutoTokenizer.from_pretrained(folder)
    _assert_same(_light(folder, tokenizer_class_name(auto)), auto)


def test_the_reported_class_wins_over_the_prediction(default_folder: Path) -> None:
    """When the scheduler's AutoTokenizer chose another class than the declared one, that is
    the class loaded."""
    from transformers import GPT2Tokenizer

    loaded = _light(default_folder, f"{GPT2Tokenizer.__module__}:{GPT2Tokenizer.__qualname__}")
    assert type(loaded) is GPT2Tokenizer


@pytest.mark.parametrize("change", ["auto_map", "no_class", "tekken"])
def test_folders_outside_the_plain_case_get_no_prediction(
    default_folder: Path, tmp_path: Path, change: str
) -> None:
    folder = _declaring(tmp_path, default_folder, "TokenizersBackend")
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    if change == "auto_map":
        config["auto_map"] = {"AutoTokenizer": [None, "custom.CustomTokenizer"]}
    elif change == "no_class":
        del config["tokenizer_class"]
    else:
        (folder / "tekken.json").write_text("{}")
    config_file.write_text(json.dumps(config))
    assert predicted_class(folder) is None


def test_only_transformers_classes_are_loaded_by_name(default_folder: Path) -> None:
    assert load_named_class("transformers_modules.custom:CustomTokenizer", default_folder) is None
    assert load_named_class("os:path", default_folder) is None


def test_autotokenizers_choice_is_remembered(
    default_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's first start asks AutoTokenizer; later starts load the class it chose
    directly, until the folder's tokenizer files change."""
    from radixserve.models import tokenizer as tokenizer_module
    from radixserve.utils.cache_dir import CACHE_DIR_ENV

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    folder = _declaring(tmp_path, default_folder, "GPT2Tokenizer")
    calls: list[str] = []
    auto_load = tokenizer_module.get_tokenizer

    def counting(path: Any, **kwargs: Any) -> Any:
        calls.append(str(path))
        return auto_load(path, **kwargs)

    monkeypatch.setattr(tokenizer_module, "get_tokenizer", counting)
    args = ServerArgs.from_kwargs(model_path=str(folder))
    first = load_tokenizer(args, str(folder))
    assert len(calls) == 1 and remembered_class(folder) == tokenizer_class_name(first)
    _assert_same(load_tokenizer(args, str(folder)), first)
    assert len(calls) == 1
    config_file = folder / "tokenizer_config.json"
    config_file.write_text(config_file.read_text().replace("GPT2Tokenizer", "TokenizersBackend"))
    assert remembered_class(folder) is None
    assert type(load_tokenizer(args, str(folder))).__name__ == "TokenizersBackend"
    assert len(calls) == 2
