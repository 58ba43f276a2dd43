"""Speculative decoding: n-gram drafting, one-pass verification, exact acceptance."""
