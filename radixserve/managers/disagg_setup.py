"""Builds the scheduler's prefill/decode disaggregation role from the server arguments:
the KV transfer backend over this process's KV pool, and the role's manager
(managers/disagg_prefill.py or disagg_decode.py). None for a plain server."""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING

from radixserve.disaggregation.kv_receiver import KVReceiver, LocalLayout
from radixserve.disaggregation.transfer import (
    FakeTransfer,
    KVTransferBackend,
    MooncakeTransfer,
    mooncake_protocol,
)
from radixserve.managers.disagg_decode import DisaggDecode
from radixserve.managers.disagg_prefill import DisaggPrefill

if TYPE_CHECKING:
    from radixserve.managers.scheduler import Scheduler
    from radixserve.mem_cache.kv_cache import KVCache
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

# SGLang's variable for the address a server advertises to its peers.
HOST_IP_ENV = "SGLANG_HOST_IP"

DisaggRole = DisaggPrefill | DisaggDecode


def advertise_host(args: ServerArgs) -> str:
    """The address the peer reaches this server's KV at: SGLANG_HOST_IP, else --host when it
    names one address, else the address of the default route (127.0.0.1 without one)."""
    env = os.environ.get(HOST_IP_ENV, "").strip()
    if env:
        return env
    if args.host not in ("0.0.0.0", "::", ""):
        return "127.0.0.1" if args.host == "localhost" else args.host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: it only picks a route
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def make_backend(args: ServerArgs, host: str) -> KVTransferBackend:
    name = args.disaggregation_transfer_backend
    if name == "fake":
        return FakeTransfer()
    protocol = mooncake_protocol(name, args.disaggregation_ib_device)
    return MooncakeTransfer(host, protocol, args.disaggregation_ib_device)


def kv_buffers(kv_cache: KVCache) -> list:
    """Every distinct KV buffer in a fixed order both sides share (K alone when V shares it)."""
    if kv_cache.v_shares_k:
        return list(kv_cache.k_buffers)
    return [*kv_cache.k_buffers, *kv_cache.v_buffers]


def kv_dtype_name(kv_cache: KVCache) -> str:
    return str(kv_cache.dtype).removeprefix("torch.")


def make_disagg(args: ServerArgs, scheduler: Scheduler) -> DisaggRole | None:
    mode = args.disaggregation_mode
    if mode in (None, "null"):
        return None
    host = advertise_host(args)
    kv_cache = scheduler.runner.kv_cache
    backend = make_backend(args, host)
    backend.register_buffers(kv_buffers(kv_cache), scheduler.page_size)
    if mode == "prefill":
        return DisaggPrefill(
            scheduler,
            backend,
            host,
            args.disaggregation_bootstrap_port,
            kv_dtype_name(kv_cache),
        )
    layout = LocalLayout(
        tp_size=args.tp_size, page_size=scheduler.page_size, kv_cache_dtype=kv_dtype_name(kv_cache)
    )
    return DisaggDecode(scheduler, backend, KVReceiver(backend, layout))
