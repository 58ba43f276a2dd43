"""--load-format dummy: seeded random weights, for tests and benchmarks without a checkpoint."""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

DUMMY_WEIGHT_STD = 0.02


def init_dummy_weights(model: nn.Module, seed: int = 0, std: float = DUMMY_WEIGHT_STD) -> None:
    """Fill every parameter: norm weights with 1, biases with 0, the rest ~ N(0, std).

    Values are drawn on the CPU from one seeded generator, in parameter order, so the same seed
    gives the same model on every device.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            leaf = name.rsplit(".", 2)
            if name.endswith(".bias"):
                param.zero_()
            elif "norm" in (leaf[-2] if len(leaf) > 1 else ""):
                param.fill_(1.0)  # keeps activations at a sane scale through the layers
            else:
                values = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.copy_(values * std)
    logger.info("Initialised dummy weights (seed %d, std %g)", seed, std)
