"""`--device` auto-detection: a CPU-only torch build is recognised from its version file, so
option parsing in the API process does not import torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixserve.options import hardware

REPO = Path(__file__).resolve().parents[2]

CPU_BUILD = """
from typing import Optional
__version__ = '2.13.0+cpu'
cuda: Optional[str] = None
hip: Optional[str] = None
"""


@pytest.mark.parametrize(
    ("text", "gpu"),
    [
        (CPU_BUILD, False),
        (CPU_BUILD.replace("cuda: Optional[str] = None", "cuda = '12.4'"), True),
        (CPU_BUILD.replace("hip: Optional[str] = None", "hip: Optional[str] = '6.2'"), True),
        (CPU_BUILD.replace("cuda: Optional[str] = None", "cuda = get_cuda()"), True),
        (CPU_BUILD.replace("hip: Optional[str] = None\n", ""), True),  # unknown layout
        ("cuda = (", True),  # unreadable
    ],
)
def test_version_file(text: str, gpu: bool) -> None:
    assert hardware.version_file_names_gpu(text) is gpu


def test_the_installed_build_agrees_with_torch() -> None:
    built = torch.version.cuda is not None or torch.version.hip is not None
    assert hardware.torch_built_for_gpu() is built


def test_detecting_the_cpu_does_not_import_torch() -> None:
    if hardware.torch_built_for_gpu():
        pytest.skip("a GPU build of torch: detection asks torch")
    code = (
        "import sys; from radixserve.options import hardware; "
        "print(hardware.detect_device(), 'torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split() == ["cpu", "False"]
