"""Hierarchical KV cache: a host-memory tier and a disk tier below the device KV pool."""
