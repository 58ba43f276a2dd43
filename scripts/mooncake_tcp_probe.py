"""Moves a KV-page-shaped torch tensor between two processes with Mooncake's transfer engine.

Proof for issue 30's first step: the receiver registers a zeroed buffer and hands its session id
("host:rpc_port") and buffer address to the sender over a pipe (the job radixserve's bootstrap
server does between real prefill and decode servers); the sender writes its pages with
`transfer_sync_write` over TCP and the receiver checks every byte. Needs the `disaggregation`
extra (mooncake-transfer-engine-non-cuda), whose engine.so also links libibverbs.so.1 even when
only TCP is used.

    python scripts/mooncake_tcp_probe.py --mib 256 --repeat 5
    python scripts/mooncake_tcp_probe.py --kv --repeat 5   # KV pages via MooncakeTransfer

`--kv` moves scattered pages of a KV-pool-shaped set of buffers (per layer K and V,
[slot, head, dim], bf16) with radixserve's `MooncakeTransfer`, as a prefill would hand a
prompt's pages to a decode server whose free pages lie elsewhere.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from multiprocessing.connection import Connection


def _engine(host: str):  # -> mooncake.engine.TransferEngine
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    # P2PHANDSHAKE: no metadata server; peers exchange segment descriptors directly on the
    # engine's RPC port, which is why the session id is "host:rpc_port".
    if engine.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("mooncake TransferEngine.initialize failed")
    return engine


def _receiver(conn: Connection, host: str, nbytes: int) -> None:
    import torch

    engine = _engine(host)
    buf = torch.zeros(nbytes, dtype=torch.uint8)
    if engine.register_memory(buf.data_ptr(), nbytes) != 0:
        raise RuntimeError("register_memory failed")
    conn.send((f"{host}:{engine.get_rpc_port()}", buf.data_ptr()))
    seed = conn.recv()  # the sender is done
    expected = torch.arange(nbytes, dtype=torch.int64).add_(seed).remainder_(251).to(torch.uint8)
    conn.send(bool(torch.equal(buf, expected)))
    conn.recv()  # keep the buffer registered until the sender has left


def _kv_pool(args: argparse.Namespace, fill: bool) -> list:
    import torch

    shape = (args.pages * args.page_size, args.heads, args.head_dim)
    out = []
    for i in range(2 * args.layers):
        t = torch.zeros(shape, dtype=torch.bfloat16)
        if fill:
            t.view(torch.int16).copy_(
                torch.arange(t.numel(), dtype=torch.int32).add_(i).remainder_(30011).view(shape)
            )
        out.append(t)
    return out


def _kv_receiver(conn: Connection, args: argparse.Namespace) -> None:
    from radixserve.disaggregation.transfer import MooncakeTransfer

    backend = MooncakeTransfer(args.host)
    bufs = _kv_pool(args, fill=False)
    backend.register_buffers(bufs, args.page_size)
    conn.send(backend.describe().to_json())
    pages = conn.recv()  # (src, dst) pairs, once the sender is done
    src = _kv_pool(args, fill=True)
    ps = args.page_size
    ok = all(
        bool((d[dst * ps : (dst + 1) * ps] == s[sp * ps : (sp + 1) * ps]).all())
        for d, s in zip(bufs, src, strict=True)
        for sp, dst in pages
    )
    conn.send(ok)
    conn.recv()
    backend.close()


def kv_main(args: argparse.Namespace) -> None:
    import random

    from radixserve.disaggregation.transfer import (
        MooncakeTransfer,
        PeerBuffers,
        TransferStatus,
        coalesce_pages,
    )

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_kv_receiver, args=(child, args), daemon=True)
    proc.start()
    peer = PeerBuffers.from_json(parent.recv())
    backend = MooncakeTransfer(args.host)
    backend.register_buffers(_kv_pool(args, fill=True), args.page_size)
    rng = random.Random(0)
    # A prompt's pages: consecutive on the prefill side, scattered free pages on the decode side.
    n = args.move
    start = rng.randrange(args.pages - n)
    dst_pages = rng.sample(range(args.pages), n)
    pages = list(zip(range(start, start + n), dst_pages, strict=True))
    page_bytes = sum(b.page_bytes for b in backend.describe().buffers)
    nbytes = n * page_bytes
    times = []
    for _ in range(args.repeat + 1):  # the first one opens the connection: not counted
        t0 = time.perf_counter()
        status = backend.wait(backend.submit(peer, pages), timeout_s=120)
        times.append(time.perf_counter() - t0)
        if status is not TransferStatus.DONE:
            raise SystemExit(f"transfer {status.value}")
    parent.send(pages)
    ok = parent.recv()
    parent.send(None)
    proc.join(10)
    backend.close()
    steady = times[1:]
    best = min(steady)
    print(
        f"{n} KV pages x {2 * args.layers} buffers ({len(coalesce_pages(pages))} runs, "
        f"{nbytes / 2**20:.1f} MiB) over TCP to {peer.session_id}: bytes equal={ok}; "
        f"first {times[0] * 1e3:.1f} ms, best {best * 1e3:.1f} ms = {nbytes / best / 1e9:.2f} GB/s, "
        f"median {sorted(steady)[len(steady) // 2] * 1e3:.1f} ms"
    )
    if not ok:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--mib", type=int, default=256, help="bytes moved per transfer")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--kv", action="store_true", help="KV pages via MooncakeTransfer")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=8, help="KV heads")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--page-size", type=int, default=16, help="slots per page")
    parser.add_argument("--pages", type=int, default=1024, help="pages in each pool")
    parser.add_argument("--move", type=int, default=256, help="pages moved per transfer")
    args = parser.parse_args()
    if args.kv:
        kv_main(args)
        return

    import torch

    nbytes = args.mib << 20
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(child, args.host, nbytes), daemon=True)
    proc.start()
    session, peer_ptr = parent.recv()

    engine = _engine(args.host)
    seed = 7
    src = torch.arange(nbytes, dtype=torch.int64).add_(seed).remainder_(251).to(torch.uint8)
    if engine.register_memory(src.data_ptr(), nbytes) != 0:
        raise RuntimeError("register_memory failed")
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        ret = engine.transfer_sync_write(session, src.data_ptr(), peer_ptr, nbytes)
        times.append(time.perf_counter() - t0)
        if ret < 0:
            raise RuntimeError(f"transfer_sync_write returned {ret}")
    parent.send(seed)
    ok = parent.recv()
    parent.send(None)
    proc.join(10)
    best = min(times)
    print(
        f"{args.mib} MiB x {args.repeat} over TCP to {session}: bytes equal={ok}; "
        f"best {best * 1e3:.1f} ms = {nbytes / best / 1e9:.2f} GB/s, "
        f"median {sorted(times)[len(times) // 2] * 1e3:.1f} ms"
    )
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
