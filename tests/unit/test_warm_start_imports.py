"""A later start of the scheduler reads the model config and its decode-only tokenizer from what
the first start remembered (utils/startup_cache.py): a fresh process then never imports
transformers (~1.5-2.5 s of start-up on 2 cores), and another process's tokenizer loads by the
remembered class, without transformers' configuration or auto modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixserve.managers.scheduler_factory import _scheduler_tokenizer, load_tokenizer
from radixserve.models.config import ModelConfig
from radixserve.server_args import ServerArgs
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from tests.helpers.tiny_models import save_word_tokenizer, tiny_hf_config

REPO = Path(__file__).resolve().parents[2]

_CHILD = """
import json, sys
from radixserve.managers.scheduler_factory import _scheduler_tokenizer, load_tokenizer
from radixserve.models.config import ModelConfig
from radixserve.server_args import ServerArgs

folder = sys.argv[1]
args = ServerArgs.from_kwargs(model_path=folder)
config = ModelConfig.from_pretrained(folder, dtype="float32")
scheduler_side, _, _ = _scheduler_tokenizer(args, folder, True)
heavy = ("transformers",)  # the scheduler's warm start: neither config nor tokenizer code
decoded = scheduler_side.decode([5, 7])
imported = [m for m in heavy if m in sys.modules]
tokenizer = load_tokenizer(args, folder)  # another process's load by the remembered class
heavy = ("transformers.configuration_utils", "transformers.models.auto")
print(json.dumps({
    "layers": config.num_hidden_layers,
    "ids": tokenizer.encode("w5 w7"),
    "imported": imported + [m for m in heavy if m in sys.modules],
    "decoded": decoded,
}))
"""


def test_a_warm_start_skips_transformers_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(cache))
    folder = tmp_path / "model"
    tiny_hf_config("llama").save_pretrained(folder)
    save_word_tokenizer(folder)
    config = ModelConfig.from_pretrained(folder, dtype="float32")  # the first start
    args = ServerArgs.from_kwargs(model_path=str(folder))
    tokenizer = load_tokenizer(args, str(folder))
    _scheduler_tokenizer(args, str(folder), True)
    env = {**os.environ, "PYTHONPATH": str(REPO), CACHE_DIR_ENV: str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["imported"] == []
    assert result["layers"] == config.num_hidden_layers
    assert result["ids"] == tokenizer.encode("w5 w7")
    assert result["decoded"] == tokenizer.decode([5, 7])
