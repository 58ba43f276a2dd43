"""Builds (once per CPU) and loads the C++ kernel extension; probes it before trusting it.

`python -m radixserve.kernels.build` builds ahead of time (scripts/install.sh does this); at run
time `load_extension()` finds the build in torch's extension cache. A start after a load that
passed remembers where the built library is (a startup record named by the extension's name,
which hashes the sources) and imports it directly: torch.utils.cpp_extension's import and its
ninja up-to-date check cost ~0.1 s of every start. The build targets the CPU it
runs on (-march=native), so its name carries a fingerprint of the CPU's model and flags. A CPU
flag is not proof that an instruction runs, so a freshly built extension first runs its
self-test in a child process; only when that exits cleanly is it used, else the pure-PyTorch
kernels run and the reason is logged.

RADIXSERVE_DISABLE_CPU_KERNELS=1 forces the pure-PyTorch kernels.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from radixserve.kernels.cpu_features import cpu_features

logger = logging.getLogger(__name__)

DISABLE_ENV = "RADIXSERVE_DISABLE_CPU_KERNELS"
SOURCES = (
    "bindings.cpp",
    "elementwise.cpp",
    "attention.cpp",
    "gguf_gemm.cpp",
    "fused_layer.cpp",
    "single_row_chain.cpp",
    "threads.cpp",
    "gguf_gemm_tiled.cpp",
    "gguf_gemm_amx.cpp",
    "gguf_gemm_amx_few.cpp",
    "gguf_paired_rows.cpp",
    "gguf_kquant.cpp",
    "gguf_q8k.cpp",
    "gguf_q8k_panel.cpp",
    "gguf_q8k_amx.cpp",
    "float_gemm.cpp",
    "half_weight_gemm.cpp",
    "moe.cpp",
    "moe_layer.cpp",
    "sampling.cpp",
)
PROBE_MARKER = "probe-passed"  # in the build folder, once the self-test passed there
BUILD_VERSION = 2  # bump when the sources change in a way the file hashes would not show


def _source_dir() -> Path:
    return Path(__file__).resolve().parent / "csrc"


def _torch_location() -> str:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    return str(Path(spec.origin).resolve().parent) if spec and spec.origin else ""


def extension_name() -> str:
    import hashlib

    digest = hashlib.sha256(str(BUILD_VERSION).encode())
    # The build compiles against one torch install (its include paths are in torch's build
    # file): two environments on one machine get two builds instead of rebuilding in turn.
    digest.update(_torch_location().encode())
    headers = sorted(path.name for path in _source_dir().glob("*.h"))  # every header counts
    for name in (*SOURCES, *headers):
        digest.update((_source_dir() / name).read_bytes())
    return f"radixserve_cpu_{cpu_features().fingerprint}_{digest.hexdigest()[:8]}"


def _compile(verbose: bool = False) -> ModuleType:
    import fcntl

    from torch.utils import cpp_extension

    flags = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-DNDEBUG"]
    build_dir = Path(cpp_extension._get_build_directory(extension_name(), verbose=False))
    # torch guards a build with a plain lock file that a killed build (Ctrl-C during install)
    # leaves behind, and every later load then waits on it forever. Builds go through this
    # flock, which the OS releases when its holder dies: whoever holds it knows that a torch
    # lock file left in the folder belongs to a dead build.
    with (build_dir / "radixserve-build.flock").open("w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if stale.exists():
            logger.warning("Removing %s, left by an interrupted kernel build", stale)
            stale.unlink(missing_ok=True)
        sources = _stage_sources(build_dir / "src")
        return cpp_extension.load(
            name=extension_name(),
            sources=[str(sources / s) for s in SOURCES],
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],
            verbose=verbose,
        )


def _stage_sources(stage: Path) -> Path:
    """Copy the sources into the build folder and compile the copies. The folder's name already
    carries a hash of their contents, but torch's build file names the source paths, so two
    checkouts of the same sources (git worktrees, a fresh clone beside an old one) would
    otherwise rebuild each other's extension in turn."""
    import shutil

    stage.mkdir(exist_ok=True)
    for path in [*(_source_dir() / s for s in SOURCES), *_source_dir().glob("*.h")]:
        target = stage / path.name
        if not target.exists() or target.read_bytes() != path.read_bytes():
            shutil.copyfile(path, target)
    return stage


def _probe_marker() -> Path:
    from torch.utils import cpp_extension

    root = Path(cpp_extension._get_build_directory(extension_name(), verbose=False))
    return root / PROBE_MARKER


def _probe_in_child() -> str | None:
    """Run the self-test in a child process (an illegal instruction kills only the child).
    None when it passed, else the reason."""
    marker = _probe_marker()
    if marker.is_file():
        return None
    env = {**os.environ, DISABLE_ENV: "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "radixserve.kernels.self_test"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return f"self-test exited with {proc.returncode}: {tail[0]}"
    marker.write_text("ok\n")
    return None


RECORD_KIND = "kernel-build"


def _remembered_build() -> ModuleType | None:
    """The extension imported from the library a previous load of the same build found (and
    whose self-test passed), or None when there is no such record or file."""
    import importlib.util

    name = extension_name()
    try:
        from radixserve.utils.startup_cache import key_of, read_record

        record = read_record(RECORD_KIND, key_of([name]))
    except ImportError:  # the install's background build runs before platformdirs is in
        return None
    library = Path(str(record.get("library", ""))) if record else None
    if library is None or not library.is_file():
        return None
    if not (library.parent / PROBE_MARKER).is_file():
        return None
    import torch  # noqa: F401  (the library links against libtorch: load it first)

    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:  # a library from another torch, a half-written file
        logger.debug("remembered kernel build %s did not import: %s", library, e)
        return None
    sys.modules[name] = module
    return module


def _remember_build(module: ModuleType) -> None:
    try:
        from radixserve.utils.startup_cache import key_of, write_record
    except ImportError:  # see _remembered_build: the next load remembers it
        return
    library = getattr(module, "__file__", None)
    if library:
        write_record(RECORD_KIND, key_of([extension_name()]), {"library": str(library)})


@functools.cache
def load_extension() -> ModuleType | None:
    """The compiled kernels, or None (no compiler, build failure, failed probe, disabled)."""
    if os.environ.get(DISABLE_ENV, "0") not in ("", "0"):
        logger.info("CPU kernels disabled by %s; using the PyTorch kernels", DISABLE_ENV)
        return None
    remembered = _remembered_build()
    if remembered is not None:
        return remembered
    try:
        problem = _probe_in_child()
    except Exception as e:  # no compiler, a timeout, an unwritable cache
        problem = f"{type(e).__name__}: {e}"
    if problem is not None:
        logger.warning("C++ CPU kernels unavailable (%s); using the PyTorch kernels", problem)
        return None
    module = _compile()
    _remember_build(module)
    return module


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(f"CPU: {cpu_features().summary}")
    print(f"Building {extension_name()} (first build takes about a minute) ...", flush=True)
    ext = load_extension()
    if ext is None:
        print("The C++ kernels could not be built or failed their self-test; PyTorch kernels run.")
        sys.exit(1)
    print("C++ CPU kernels built and self-tested.")


if __name__ == "__main__":
    main()
