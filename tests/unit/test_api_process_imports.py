"""The API process never imports torch (nor transformers' configuration modules, which do) in
the common case: a fresh interpreter imports the modules `radixserve serve` runs there,
resolves the options and loads the tokenizer as the Engine does, and torch is still absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixserve.models.tokenizer import get_tokenizer, tokenizer_source
from radixserve.utils.cache_dir import CACHE_DIR_ENV
from radixserve.utils.light_tokenizer import tokenizer_class_name
from tests.helpers.hf_reference import default_gguf_path
from tests.helpers.tiny_gguf import write_tiny_gguf
from tests.helpers.tiny_models import tiny_hf_config, tiny_hf_model

REPO = Path(__file__).resolve().parents[2]

# Run in the child: argv[1] is a JSON list of [model path, the scheduler's folder, the class
# the scheduler's AutoTokenizer loaded].
_CHILD = """
import json, sys

import radixserve.cli
import radixserve.entrypoints.engine
import radixserve.entrypoints.http_server
import radixserve.managers.detokenizer_process
import radixserve.managers.multiprocess_runtime
from radixserve.managers.scheduler_factory import EarlyTokenizer
from radixserve.managers.tokenizer_manager import TokenizerManager
from radixserve.server_args import ServerArgs

report = []
for model, folder, class_name in json.loads(sys.argv[1]):
    args = ServerArgs.from_cli(["--model-path", model])
    tokenizer = EarlyTokenizer(args).get(folder, class_name)
    manager = TokenizerManager(tokenizer, len(tokenizer), 2048)
    ids = manager.tokenize("Hello there")
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    report.append([type(tokenizer).__name__, len(ids) > 0, bool(chat), tokenizer.decode(ids, skip_special_tokens=True)])
heavy = ("torch", "transformers.configuration_utils", "transformers.models.auto")
print(json.dumps({"report": report, "imported": [m for m in heavy if m in sys.modules]}))
"""


@pytest.fixture
def tiny_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    model = tiny_hf_model(tiny_hf_config("llama", vocab_size=59))
    return write_tiny_gguf(tmp_path / "tiny.gguf", model)


def test_the_api_process_does_not_import_torch(tiny_gguf: Path) -> None:
    models = [tiny_gguf]
    default = default_gguf_path()
    if default is not None:
        models.append(default)
    cases = []
    for model in models:
        # Converted here (the first start's conversion uses transformers' GGUF readers, which
        # import torch); the scheduler's AutoTokenizer choice, as SchedulerReady reports it.
        folder = tokenizer_source(model)
        cases.append([str(model), str(folder), tokenizer_class_name(get_tokenizer(folder))])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["imported"] == []
    assert len(result["report"]) == len(cases)
    for _, tokenized, templated, text in result["report"]:
        assert tokenized and templated
        assert text.strip() == "Hello there"
