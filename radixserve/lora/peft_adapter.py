"""Reading a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) and
checking it against the served model and the server's LoRA limits.

Everything wrong with an adapter raises LoRAError with a message that names the file, tensor or
setting at fault, so /load_lora_adapter can answer a clear 400.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from radixserve.layers.lora import LoRAWeights, SubProjection
from radixserve.lora.config import SUPPORTED_TARGET_MODULES, LoRAConfig, LoRAError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILES = ("adapter_model.safetensors", "adapter_model.bin")

# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (PEFT may keep an adapter
# name before ".weight", e.g. lora_A.default.weight).
_KEY = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$"
)


@dataclass(frozen=True)
class LoRAAdapter:
    """An adapter ready to serve: per (layer index, our module path), its stacked weights."""

    name: str
    path: str
    rank: int
    target_modules: tuple[str, ...]
    weights: Mapping[tuple[int, str], LoRAWeights]

    @property
    def nbytes(self) -> int:
        return sum(
            w.a.numel() * w.a.element_size() + w.b.numel() * w.b.element_size()
            for w in self.weights.values()
        )


def load_peft_adapter(
    name: str,
    path: str | Path,
    layer_projections: list[dict[str, SubProjection]],
    config: LoRAConfig,
    dtype: torch.dtype,
    device: torch.device,
) -> LoRAAdapter:
    """Read and check the adapter at `path`; `layer_projections` describes the model's decoder
    layers (layers.lora.decoder_sub_projections of each)."""
    folder = Path(path)
    if not folder.is_dir():
        raise LoRAError(
            f"LoRA adapter {name!r}: no adapter folder at the given lora_path.", "lora_path"
        )
    peft_config = _read_config(name, folder)
    scaling = _scaling(name, peft_config)
    tensors = _read_tensors(name, folder)
    per_module = _group(name, tensors, len(layer_projections))
    rank = _check_rank(name, peft_config, per_module, config)
    targets = sorted({module for _, module in per_module}, key=SUPPORTED_TARGET_MODULES.index)
    not_allowed = [m for m in targets if m not in config.target_modules]
    if not_allowed:
        raise LoRAError(
            f"LoRA adapter {name!r} targets {', '.join(not_allowed)}, outside the server's "
            f"--lora-target-modules ({', '.join(config.target_modules)}).",
            "lora_path",
        )
    weights = _stack(name, per_module, layer_projections, scaling, dtype, device)
    return LoRAAdapter(name, str(path), rank, tuple(targets), weights)


def _read_config(name: str, folder: Path) -> dict[str, Any]:
    file = folder / CONFIG_FILE
    if not file.is_file():
        raise LoRAError(f"LoRA adapter {name!r}: the folder has no {CONFIG_FILE}.", "lora_path")
    try:
        cfg = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoRAError(
            f"LoRA adapter {name!r}: unreadable {CONFIG_FILE}: {exc}", "lora_path"
        ) from None
    if not isinstance(cfg, dict):
        raise LoRAError(f"LoRA adapter {name!r}: {CONFIG_FILE} is not an object.", "lora_path")
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise LoRAError(f"LoRA adapter {name!r}: peft_type {peft_type} is not LORA.", "lora_path")
    refusals = {
        # PEFT turns gate/up/down targets of a MoE model into LoRA on the expert stacks.
        "target_parameters": "adapters on parameters (target_parameters, e.g. a mixture-of-"
        "experts model's expert weights) are not supported",
        "use_dora": "DoRA adapters are not supported",
        "modules_to_save": "adapters that replace whole modules (modules_to_save) are not supported",
        "rank_pattern": "per-module ranks (rank_pattern) are not supported",
        "alpha_pattern": "per-module alphas (alpha_pattern) are not supported",
        "fan_in_fan_out": "fan_in_fan_out adapters are not supported",
    }
    for key, why in refusals.items():
        if cfg.get(key):
            raise LoRAError(f"LoRA adapter {name!r}: {why}.", "lora_path")
    if cfg.get("bias", "none") not in ("none", None):
        raise LoRAError(
            f"LoRA adapter {name!r}: trained biases (bias={cfg['bias']!r}) are not supported.",
            "lora_path",
        )
    return cfg


def _scaling(name: str, cfg: dict[str, Any]) -> float:
    r, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise LoRAError(
            f"LoRA adapter {name!r}: invalid rank r={r!r} in {CONFIG_FILE}.", "lora_path"
        )
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise LoRAError(f"LoRA adapter {name!r}: invalid lora_alpha={alpha!r}.", "lora_path")
    # PEFT: alpha / r, or alpha / sqrt(r) with rank-stabilised LoRA.
    return float(alpha) / (math.sqrt(r) if cfg.get("use_rslora") else r)


def _read_tensors(name: str, folder: Path) -> dict[str, torch.Tensor]:
    for file_name in WEIGHTS_FILES:
        file = folder / file_name
        if not file.is_file():
            continue
        try:
            if file_name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(file))
            return torch.load(str(file), map_location="cpu", weights_only=True)
        except Exception as exc:  # a corrupt file: the client's adapter, not our bug
            raise LoRAError(
                f"LoRA adapter {name!r}: cannot read {file_name}: {exc}", "lora_path"
            ) from None
    raise LoRAError(
        f"LoRA adapter {name!r}: the folder has no {' or '.join(WEIGHTS_FILES)}.", "lora_path"
    )


def _group(
    name: str, tensors: dict[str, torch.Tensor], num_layers: int
) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    """{(layer, projection): {"A": tensor, "B": tensor}}, refusing anything else."""
    grouped: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.search(key)
        if match is None:
            raise LoRAError(
                f"LoRA adapter {name!r}: tensor {key!r} is not a LoRA A/B matrix of a decoder "
                f"projection ({', '.join(SUPPORTED_TARGET_MODULES)}).",
                "lora_path",
            )
        layer, module, which = int(match.group(1)), match.group(2), match.group(3)
        if module not in SUPPORTED_TARGET_MODULES:
            raise LoRAError(
                f"LoRA adapter {name!r} targets {module!r}; supported target modules: "
                f"{', '.join(SUPPORTED_TARGET_MODULES)}.",
                "lora_path",
            )
        if layer >= num_layers:
            raise LoRAError(
                f"LoRA adapter {name!r}: tensor {key!r} is for layer {layer} but the model "
                f"has {num_layers} layers.",
                "lora_path",
            )
        grouped.setdefault((layer, module), {})[which] = tensor
    if not grouped:
        raise LoRAError(f"LoRA adapter {name!r} holds no LoRA weights.", "lora_path")
    for (layer, module), pair in grouped.items():
        if set(pair) != {"A", "B"}:
            missing = "B" if "A" in pair else "A"
            raise LoRAError(
                f"LoRA adapter {name!r}: layer {layer} {module} lacks its lora_{missing} matrix.",
                "lora_path",
            )
    return grouped


def _check_rank(
    name: str,
    cfg: dict[str, Any],
    per_module: dict[tuple[int, str], dict[str, torch.Tensor]],
    config: LoRAConfig,
) -> int:
    rank = int(cfg["r"])
    if config.max_lora_rank is not None and rank > config.max_lora_rank:
        raise LoRAError(
            f"LoRA adapter {name!r} has rank {rank}, above the server's --max-lora-rank "
            f"{config.max_lora_rank}.",
            "lora_path",
        )
    for (layer, module), pair in per_module.items():
        a, b = pair["A"], pair["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise LoRAError(
                f"LoRA adapter {name!r}: layer {layer} {module} has A {tuple(a.shape)} and B "
                f"{tuple(b.shape)}, not of its configured rank {rank}.",
                "lora_path",
            )
    return rank


def _stack(
    name: str,
    per_module: dict[tuple[int, str], dict[str, torch.Tensor]],
    layer_projections: list[dict[str, SubProjection]],
    scaling: float,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[tuple[int, str], LoRAWeights]:
    """Stack each fused layer's parts: A rows one after another, B block-diagonal."""
    parts: dict[tuple[int, str], list[tuple[SubProjection, torch.Tensor, torch.Tensor]]] = {}
    for (layer, module), pair in sorted(
        per_module.items(), key=lambda kv: (kv[0][0], SUPPORTED_TARGET_MODULES.index(kv[0][1]))
    ):
        sub = layer_projections[layer].get(module)
        if sub is None:
            raise LoRAError(
                f"LoRA adapter {name!r} targets {module} in layer {layer}, a mixture-of-experts "
                "layer without a dense MLP: only its attention projections take adapters.",
                "lora_path",
            )
        a, b = pair["A"], pair["B"]
        if a.shape[1] != sub.in_features or b.shape[0] != sub.out_features:
            raise LoRAError(
                f"LoRA adapter {name!r} does not fit this model: layer {layer} {module} maps "
                f"{a.shape[1]} -> {b.shape[0]} features, the model's {module} maps "
                f"{sub.in_features} -> {sub.out_features}.",
                "lora_path",
            )
        parts.setdefault((layer, sub.module), []).append((sub, a, b))
    out: dict[tuple[int, str], LoRAWeights] = {}
    for key, items in parts.items():
        total_rank = sum(a.shape[0] for _, a, _ in items)
        out_features = max(sub.offset + sub.out_features for sub, _, _ in items)
        # The fused layer's full output width: the last part's end may fall short of it when
        # the adapter skips the last part (e.g. only q_proj of qkv).
        full = layer_projections[key[0]]
        width = max(s.offset + s.out_features for s in full.values() if s.module == key[1])
        out_features = max(out_features, width)
        a_cat = torch.cat([a.to(torch.float32) for _, a, _ in items])
        b_bd = torch.zeros(out_features, total_rank, dtype=torch.float32)
        col = 0
        for sub, a, b in items:
            r = a.shape[0]
            b_bd[sub.offset : sub.offset + sub.out_features, col : col + r] = b.float()
            col += r
        out[key] = LoRAWeights(
            a_cat.to(dtype=dtype, device=device).contiguous(),
            b_bd.to(dtype=dtype, device=device).contiguous(),
            scaling,
        )
    return out
