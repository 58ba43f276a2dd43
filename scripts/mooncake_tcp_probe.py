"""Moves a KV-page-shaped torch tensor between two processes with Mooncake's transfer engine.

Proof for issue 30's first step: the receiver registers a zeroed buffer and hands its session id
("host:rpc_port") and buffer address to the sender over a pipe (the job radixserve's bootstrap
server does between real prefill and decode servers); the sender writes its pages with
`transfer_sync_write` over TCP and the receiver checks every byte. Needs the `disaggregation`
extra (mooncake-transfer-engine-non-cuda), whose engine.so also links libibverbs.so.1 even when
only TCP is used.

    python scripts/mooncake_tcp_probe.py --mib 256 --repeat 5
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--mib", type=int, default=256, help="bytes moved per transfer")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

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
