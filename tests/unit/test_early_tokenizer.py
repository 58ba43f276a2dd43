"""The API process loads its tokenizer while the scheduler process loads the model
(scheduler_factory.EarlyTokenizer), and uses it only when it comes from the folder the scheduler
reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixserve.managers import scheduler_factory
from radixserve.server_args import ServerArgs


def _args(model: Path, **kwargs: Any) -> ServerArgs:
    return ServerArgs.from_kwargs(model_path=str(model), **kwargs)


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def fake_load(server_args: ServerArgs, model_dir: str, **_: Any) -> object:
        seen.append(model_dir)
        return ("tokenizer of", model_dir)

    monkeypatch.setattr(scheduler_factory, "load_tokenizer", fake_load)
    return seen


def test_the_early_load_is_used_for_the_same_folder(tmp_path: Path, loads: list[str]) -> None:
    early = scheduler_factory.EarlyTokenizer(_args(tmp_path))
    assert early.get(str(tmp_path)) == ("tokenizer of", str(tmp_path))
    assert loads == [str(tmp_path)]  # loaded once, on the thread


def test_another_folder_is_loaded_after(tmp_path: Path, loads: list[str]) -> None:
    """A scheduler that reports another folder (the model path was resolved differently) gets
    its own load: the early tokenizer is dropped."""
    other = tmp_path / "converted"
    other.mkdir()
    early = scheduler_factory.EarlyTokenizer(_args(tmp_path))
    assert early.get(str(other)) == ("tokenizer of", str(other))
    assert loads == [str(tmp_path), str(other)]


def test_a_failed_early_load_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def flaky(server_args: ServerArgs, model_dir: str, **_: Any) -> object:
        calls.append(model_dir)
        if len(calls) == 1:
            raise OSError("not there yet")
        return "tokenizer"

    monkeypatch.setattr(scheduler_factory, "load_tokenizer", flaky)
    early = scheduler_factory.EarlyTokenizer(_args(tmp_path))
    assert early.get(str(tmp_path)) == "tokenizer"
    assert len(calls) == 2


def test_skip_tokenizer_init_loads_nothing_early(tmp_path: Path, loads: list[str]) -> None:
    early = scheduler_factory.EarlyTokenizer(_args(tmp_path, skip_tokenizer_init=True))
    assert early.get(str(tmp_path)) == ("tokenizer of", str(tmp_path))
    assert loads == [str(tmp_path)]  # only the regular load (which returns None for real)


def test_another_class_than_autotokenizers_is_reloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early load predicted a class; the scheduler's AutoTokenizer chose another: the API
    loads the scheduler's class (light, still without AutoTokenizer)."""
    calls: list[dict[str, Any]] = []

    class Predicted:
        pass

    def fake_load(server_args: ServerArgs, model_dir: str, **kwargs: Any) -> object:
        calls.append(kwargs)
        return Predicted() if len(calls) == 1 else "the scheduler's class"

    monkeypatch.setattr(scheduler_factory, "load_tokenizer", fake_load)
    early = scheduler_factory.EarlyTokenizer(_args(tmp_path))
    predicted = f"{Predicted.__module__}:{Predicted.__qualname__}"
    assert isinstance(early.get(str(tmp_path), predicted), Predicted)  # the same class: kept
    assert early.get(str(tmp_path), "transformers.x:Other") == "the scheduler's class"
    assert calls == [{"light": True}, {"light": True, "class_name": "transformers.x:Other"}]
