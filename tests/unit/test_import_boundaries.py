"""The architecture's boundaries, enforced by walking every module's imports (including the
ones under TYPE_CHECKING and inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "radixserve"

# package (or module) prefix -> radixserve modules it may import (prefix match)
ALLOWED: dict[str, tuple[str, ...]] = {
    "radixserve.models": (
        "radixserve.models",
        "radixserve.layers",
        "radixserve.distributed",
        "radixserve.utils",
        "radixserve.model_executor.forward_batch",
    ),
    "radixserve.layers": (
        "radixserve.layers",
        "radixserve.distributed",
        "radixserve.utils",
        "radixserve.model_executor.forward_batch",
        "radixserve.mem_cache.kv_cache",
        "radixserve.kernels",  # layers pick kernels; models never call them directly
        # Leaf modules of exception types only: a request or an option the layer refuses
        # (the expert recorder off, an --ep-size that does not divide the experts).
        "radixserve.errors",
        "radixserve.options.errors",
    ),
    # The build's startup record (where the library is) uses the leaf cache utilities.
    "radixserve.kernels": (
        "radixserve.kernels",
        "radixserve.utils.startup_cache",
        "radixserve.utils.cache_dir",
    ),
    # kv_codes: the 8-bit KV codes' conversion in PyTorch (a leaf of torch calls).
    "radixserve.mem_cache": ("radixserve.mem_cache", "radixserve.kernels.kv_codes"),
    # KV transfer and bootstrap: no scheduler, model or cache code (they get buffers and
    # payloads handed in), so both sides of a PD pair can use them from any process.
    "radixserve.disaggregation": ("radixserve.disaggregation",),
    # radixserve.errors is a leaf (it imports nothing): the client-error base class.
    "radixserve.sampling": ("radixserve.sampling", "radixserve.errors"),
    "radixserve.errors": (),
    "radixserve.managers.tokenizer_manager": (
        "radixserve.errors",
        "radixserve.speculative.meta",
        "radixserve.managers.detokenizer",
        "radixserve.managers.session_params",  # session_params checked before queueing
        "radixserve.managers.outputs",  # the typed results it hands the API layers
        "radixserve.messages",
        "radixserve.sampling.sampling_params",
        "radixserve.sampling.constrained",  # grammar validation before queueing
        "radixserve.sampling.custom_logit_processor",  # its string's shape, checked (not loaded)
        "radixserve.multimodal.request_images",  # images checked and placeholders expanded
    ),
    # The typed results: the finish reason and the speculative figures, nothing else.
    "radixserve.managers.outputs": ("radixserve.messages", "radixserve.speculative.meta"),
    # Image reading, keying and processing: request-side leaves, no model code.
    "radixserve.multimodal": ("radixserve.multimodal", "radixserve.errors", "radixserve.messages"),
    # Leaves: defaults (the HTTP address) and metrics import nothing of radixserve; the output
    # parsers (tool calls, reasoning) only the client-error type.
    "radixserve.defaults": (),
    "radixserve.observability": ("radixserve.observability",),
    "radixserve.parsers": ("radixserve.parsers", "radixserve.errors"),
    # Adapters wrap layers; nothing above them (the manager is handed the model).
    "radixserve.lora": ("radixserve.lora", "radixserve.errors", "radixserve.layers"),
    # The option table and its rules read files and kernel facts (GGUF block types, the CPU's
    # features), never the model code or the runtime.
    "radixserve.options": (
        "radixserve.options",
        "radixserve.defaults",
        "radixserve.default_model",
        "radixserve.kernels",
        "radixserve.lora.config",
        "radixserve.utils",
    ),
    "radixserve.server_args": ("radixserve.options", "radixserve.defaults"),
    # Leaf utilities: caches, CPU plans, dtype choice, GGUF prefetch. Of the kernels they read
    # only facts (CPU features, GGUF block types); kernel calls are handed in (cpu_threads).
    "radixserve.utils": (
        "radixserve.utils",
        "radixserve.kernels.cpu_features",
        "radixserve.kernels.gguf_types",
    ),
    # The parallel groups and the node layout; launching processes is managers' (worker_node).
    "radixserve.distributed": (
        "radixserve.distributed",
        "radixserve.utils",
        "radixserve.errors",
        "radixserve.server_args",
    ),
    # Drafting and verification run on the target's model, KV and sampler, handed in through
    # speculative/target.py's protocols; of managers/ only the request type is read.
    "radixserve.speculative": (
        "radixserve.speculative",
        "radixserve.sampling",
        "radixserve.model_executor",
        "radixserve.mem_cache",
        "radixserve.models.eagle_common",
        "radixserve.managers.schedule_batch",
        "radixserve.server_args",
    ),
}
# package prefix -> radixserve modules it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "radixserve.entrypoints": (
        "radixserve.models",
        "radixserve.layers",
        "radixserve.model_executor",
        "radixserve.mem_cache",
        "radixserve.managers.scheduler",
    ),
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def radixserve_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("radixserve"):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("radixserve"))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_module_respects_boundaries(path: Path) -> None:
    name = module_name(path)
    imports = radixserve_imports(path)
    for prefix, allowed in ALLOWED.items():
        if within(name, prefix):
            bad = sorted(i for i in imports if not any(within(i, a) for a in allowed))
            assert not bad, f"{name} may not import {bad}"
    for prefix, forbidden in FORBIDDEN.items():
        if within(name, prefix):
            bad = sorted(i for i in imports if any(within(i, f) for f in forbidden))
            assert not bad, f"{name} may not import {bad}"


def test_the_walker_sees_imports() -> None:
    # Guard against a walker that silently finds nothing.
    assert "radixserve.layers.radix_attention" in radixserve_imports(
        PACKAGE / "models" / "llama.py"
    )
