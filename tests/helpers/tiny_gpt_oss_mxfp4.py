"""Tiny gpt-oss safetensors checkpoints with MXFP4 experts, as the published ones store them:
`experts.{gate_up,down}_proj_blocks` [experts, out, G, 16] and `_scales` [experts, out, G]
([experts, out, in] before packing, gate_up's rows alternating gate, up), quant_method mxfp4."""

from __future__ import annotations

import json
from pathlib import Path

import torch

_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def code_value(code: int) -> float:
    """An FP4 E2M1 code's value, from the spec: bit 3 the sign, bits 0-2 the magnitude."""
    return (-1.0 if code & 8 else 1.0) * _E2M1[code & 7]


def mxfp4_encode(rows: int, cols: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Random MXFP4 blocks [rows, cols / 32, 16] and scales [rows, cols / 32] with the float
    matrix [rows, cols] they stand for, computed element by element from the codes."""
    codes = torch.randint(0, 16, (rows, cols), generator=gen, dtype=torch.uint8)
    scales = torch.randint(121, 126, (rows, cols // 32), generator=gen, dtype=torch.uint8)
    values = torch.tensor([code_value(int(c)) for c in codes.flatten()]).view(rows, cols)
    values *= torch.pow(2.0, scales.double() - 127).float().repeat_interleave(32, dim=1)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # element 2j low nibble, 2j + 1 high
    return packed.view(rows, cols // 32, 16), scales, values


def write_mxfp4_checkpoint(folder: Path, hf: torch.nn.Module, seed: int) -> None:
    """Give `hf`'s experts random MXFP4-representable weights and save it to `folder` with
    those experts as blocks and scales (everything else as transformers saves it)."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    for i, layer in enumerate(hf.model.layers):
        experts = layer.mlp.experts
        prefix = f"model.layers.{i}.mlp.experts"
        for proj in ("gate_up_proj", "down_proj"):
            param = getattr(experts, proj)  # [E, in, out]
            encoded = [mxfp4_encode(param.shape[2], param.shape[1], gen) for _ in param]
            with torch.no_grad():
                param.copy_(torch.stack([values.t() for _, _, values in encoded]))
            del state[f"{prefix}.{proj}"]
            state[f"{prefix}.{proj}_blocks"] = torch.stack([b for b, _, _ in encoded])
            state[f"{prefix}.{proj}_scales"] = torch.stack([s for _, s, _ in encoded])
    hf.save_pretrained(folder)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(config))
