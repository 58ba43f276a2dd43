"""Shared test helpers: a manual prefill/decode driver, tiny checkpoints, HF references."""
