#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-bench for the side-by-side benchmark (compare.py), and
# llama-quantize, llama-simple and llama-completion for the GGUF test files and reference text
# (make_gguf_models.py; llama-simple decodes greedily with llama.cpp's default 4 threads,
# llama-completion takes -t and gives the same greedy text with --temp 0 -no-cnv).
#
# llama.cpp's source comes from the llama-cpp-python sdist on the Python package index (it vendors
# llama.cpp under vendor/llama.cpp), so nothing is fetched except through pip. The binaries are
# static (no shared libraries to carry around) and cached: a second run prints their paths at once.
#
#   bash benchmarks/build_llama_cpp.sh                 # build (or reuse) and probe
#   bash benchmarks/build_llama_cpp.sh --model X.gguf  # probe with this model
#   bash benchmarks/build_llama_cpp.sh --no-amx        # build without llama.cpp's AMX kernels
#   bash benchmarks/build_llama_cpp.sh --force         # rebuild even if cached
#
# Environment: RADIXSERVE_BENCH_CACHE (default ~/.cache/radixserve-bench),
# LLAMA_CPP_PYTHON_VERSION (default pinned below; "latest" for the newest sdist), JOBS (default 2).
#
# Probe: on some machines the CPU reports AMX but using it dies with SIGILL. After a build the
# script runs llama-bench on the model for a few tokens; if it dies from a signal, it rebuilds with
# AMX disabled (-mno-amx-*, GGML_AMX_*=OFF) and says so. The variant that works is remembered.
#
# The last lines on stdout are machine-readable (compare.py parses them):
#   LLAMA_SERVER=/path/llama-server
#   LLAMA_BENCH=/path/llama-bench
#   LLAMA_CPP_INFO=/path/info.txt   (version, commit, variant, cmake flags, build seconds)
#   LLAMA_QUANTIZE=/path/llama-quantize
#   LLAMA_SIMPLE=/path/llama-simple
#   LLAMA_COMPLETION=/path/llama-completion
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${RADIXSERVE_BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/radixserve-bench}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON="python3"

model=""
force=0
variant=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) model="$2"; shift 2 ;;
        --force) force=1; shift ;;
        --no-amx) variant="noamx"; shift ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

log() { echo "[build_llama_cpp] $*" >&2; }

# Everything built and cached; the first two are what compare.py needs.
TARGETS=(llama-server llama-bench llama-quantize llama-simple llama-completion)

have_all() {
    # $1: bin folder. True when every target is there.
    local target
    for target in "${TARGETS[@]}"; do
        [[ -x "$1/$target" ]] || return 1
    done
}

fetch_source() {
    # Prints the extracted llama-cpp-python source folder.
    local sdist_dir="$CACHE/sdist" spec="llama-cpp-python"
    [[ "$VERSION" != "latest" ]] && spec="llama-cpp-python==$VERSION"
    mkdir -p "$sdist_dir"
    local archive
    archive="$(ls -t "$sdist_dir"/llama_cpp_python-"${VERSION/latest/}"*.tar.gz 2>/dev/null | head -1 || true)"
    if [[ -z "$archive" || "$VERSION" == "latest" && $force -eq 1 ]]; then
        log "downloading the $spec sdist (pip) into $sdist_dir ..."
        "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "$spec" -d "$sdist_dir" >&2
        archive="$(ls -t "$sdist_dir"/llama_cpp_python-*.tar.gz | head -1)"
    fi
    local name
    name="$(basename "$archive" .tar.gz)"
    if [[ ! -d "$CACHE/src/$name/vendor/llama.cpp/ggml" ]]; then
        log "extracting $archive ..."
        mkdir -p "$CACHE/src"
        rm -rf "${CACHE:?}/src/$name"
        tar -xzf "$archive" -C "$CACHE/src"
    fi
    echo "$CACHE/src/$name"
}

find_model() {
    [[ -n "$model" ]] && { echo "$model"; return; }
    "$PYTHON" -c 'from radixserve.default_model import ensure_default_model as e; print(e())' \
        2>/dev/null || true
}

cmake_flags() {
    # $1: variant ("native" or "noamx")
    local flags=(
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF
        -DLLAMA_USE_PREBUILT_UI=OFF
    )
    if [[ "$1" == "noamx" ]]; then
        # With GGML_NATIVE, -march=native turns AMX on where the CPU reports it; an explicit
        # -mno-* wins over -march in GCC and Clang whatever the order.
        flags+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
            "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
            "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    fi
    printf '%s\n' "${flags[@]}"
}

build_variant() {
    # $1: source folder, $2: variant; installs the binaries into $CACHE/<name>-<variant>/bin.
    local src="$1/vendor/llama.cpp" variant="$2" name out build start
    name="$(basename "$1")"
    out="$CACHE/$name-$variant"
    build="$out/build"
    mkdir -p "$out/bin"
    local -a flags
    mapfile -t flags < <(cmake_flags "$variant")
    log "building ${TARGETS[*]} ($variant, -j$JOBS); this takes several minutes ..."
    start=$(date +%s)
    local -a generator=()
    command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
    cmake -S "$src" -B "$build" "${generator[@]}" "${flags[@]}" >"$out/cmake-configure.log" 2>&1 \
        || { tail -30 "$out/cmake-configure.log" >&2; return 1; }
    nice -n 10 cmake --build "$build" --target "${TARGETS[@]}" -j "$JOBS" >"$out/cmake-build.log" 2>&1 \
        || { tail -30 "$out/cmake-build.log" >&2; return 1; }
    local target
    for target in "${TARGETS[@]}"; do
        cp "$build/bin/$target" "$out/bin/"
    done
    local seconds=$(( $(date +%s) - start ))
    local commit
    commit="$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)"
    {
        echo "llama_cpp_python_version=${name#llama_cpp_python-}"
        echo "llama_cpp_commit=$commit"
        echo "variant=$variant"
        echo "build_seconds=$seconds"
        echo "jobs=$JOBS"
        echo "cmake_flags=${flags[*]}"
        echo "server_version=$("$out/bin/llama-server" --version 2>&1 | tr '\n' ' ')"
    } >"$out/info.txt"
    log "built in ${seconds}s: $out/bin"
}

probe() {
    # $1: bin folder. Returns 1 when llama-bench dies from a signal (SIGILL from AMX, ...).
    local gguf rc=0
    gguf="$(find_model)"
    if [[ -z "$gguf" || ! -f "$gguf" ]]; then
        log "no model to probe with (pass --model); skipping the probe"
        return 0
    fi
    timeout 300 "$1/llama-bench" -m "$gguf" -p 16 -n 4 -r 1 -t 1 >"$1/../probe.log" 2>&1 || rc=$?
    if [[ $rc -gt 128 && $rc -ne 124 ]]; then
        log "probe: llama-bench died with signal $((rc - 128)) (see $1/../probe.log)"
        return 1
    fi
    [[ $rc -eq 0 ]] || log "probe: llama-bench exited with $rc (not a signal); see $1/../probe.log"
    return 0
}

main() {
    local src name chosen_file
    src="$(fetch_source)"
    name="$(basename "$src")"
    chosen_file="$CACHE/$name.variant"
    if [[ -z "$variant" ]]; then
        variant="$(cat "$chosen_file" 2>/dev/null || echo native)"
    fi
    local bin="$CACHE/$name-$variant/bin"
    if [[ $force -eq 1 ]] || ! have_all "$bin"; then
        [[ $force -eq 1 ]] && rm -rf "${CACHE:?}/$name-$variant"
        build_variant "$src" "$variant"
        if ! probe "$bin"; then
            if [[ "$variant" == "noamx" ]]; then
                log "llama-bench crashes even without AMX; giving up"
                exit 1
            fi
            log "rebuilding with AMX disabled (-DGGML_AMX_*=OFF, -mno-amx-*) ..."
            variant="noamx"
            bin="$CACHE/$name-$variant/bin"
            build_variant "$src" "$variant"
            probe "$bin" || { log "llama-bench crashes even without AMX; giving up"; exit 1; }
            echo "probe: the native build died with a signal; using the AMX-free build" \
                >>"$CACHE/$name-$variant/info.txt"
        fi
        echo "$variant" >"$chosen_file"
    else
        log "cached: $bin"
    fi
    echo "LLAMA_SERVER=$bin/llama-server"
    echo "LLAMA_BENCH=$bin/llama-bench"
    echo "LLAMA_CPP_INFO=$CACHE/$name-$variant/info.txt"
    echo "LLAMA_QUANTIZE=$bin/llama-quantize"
    echo "LLAMA_SIMPLE=$bin/llama-simple"
    echo "LLAMA_COMPLETION=$bin/llama-completion"
}

main
