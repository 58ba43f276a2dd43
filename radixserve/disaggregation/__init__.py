"""Prefill/decode disaggregation (issue 30): groundwork only, not wired into the scheduler.

`transfer`: KV page transfer backends (Mooncake, fake). `bootstrap`: the prefill server's
bootstrap HTTP server and its room table. The `--disaggregation-*` options are still refused.
"""
