"""Prefill/decode disaggregation (issue 30; docs/scaling.md): the pieces both sides use, with
no scheduler, model or cache code (managers/disagg_*.py wire them into the scheduler).

`transfer`: KV page transfer backends (Mooncake, fake, in-process). `bootstrap`: the prefill
server's bootstrap HTTP server and its room table. `kv_sender` / `kv_receiver`: the ZMQ control
exchange of one request's KV hand-over, prefill side and decode side.
"""
