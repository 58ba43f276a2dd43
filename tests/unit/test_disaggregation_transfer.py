"""KV transfer backends (radixserve/disaggregation/transfer.py): page bookkeeping, the fake
backend, and Mooncake moving real bytes between two processes over TCP (skipped when the
`disaggregation` extra is not importable)."""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.connection import Connection

import pytest
import torch

from radixserve.disaggregation.transfer import (
    BufferInfo,
    FakeTransfer,
    MooncakeTransfer,
    PeerBuffers,
    TransferError,
    TransferStatus,
    buffer_info,
    coalesce_pages,
    import_mooncake_engine,
    mooncake_protocol,
)

PAGE = 4  # slots per page
SLOTS = 64
HEADS, DIM = 2, 8


def _kv_buffers(layers: int = 2, fill: bool = False) -> list[torch.Tensor]:
    """K then V of each layer, [slot, head, dim] like radixserve's KVCache."""
    out = []
    for i in range(2 * layers):
        if fill:
            t = torch.arange(SLOTS * HEADS * DIM, dtype=torch.float32).reshape(SLOTS, HEADS, DIM)
            out.append((t + 1000 * i).to(torch.bfloat16))
        else:
            out.append(torch.zeros(SLOTS, HEADS, DIM, dtype=torch.bfloat16))
    return out


def test_coalesce_pages_merges_consecutive_runs() -> None:
    assert coalesce_pages([]) == []
    assert coalesce_pages([(0, 5), (1, 6), (2, 7), (9, 8), (10, 2)]) == [
        (0, 5, 3),
        (9, 8, 1),
        (10, 2, 1),
    ]


def test_buffer_info_pages() -> None:
    t = torch.zeros(SLOTS, HEADS, DIM, dtype=torch.bfloat16)
    info = buffer_info(t, PAGE)
    assert info.page_bytes == PAGE * HEADS * DIM * 2
    assert info.num_pages == SLOTS // PAGE
    with pytest.raises(TransferError, match="contiguous"):
        buffer_info(t.transpose(0, 1), PAGE)


def test_peer_buffers_json_round_trip() -> None:
    peer = PeerBuffers("127.0.0.1:1234", (BufferInfo(1, 2048, 64), BufferInfo(4096, 2048, 64)))
    assert PeerBuffers.from_json(peer.to_json()) == peer


def test_fake_transfer_completes_at_once_and_moves_nothing() -> None:
    fake = FakeTransfer()
    src = _kv_buffers(fill=True)
    fake.register_buffers(src, PAGE)
    dst = PeerBuffers("2.2.2.2:0", ())  # a warm-up request's peer describes nothing
    handle = fake.submit(dst, [(0, 0), (1, 1)])
    assert fake.poll(handle) is TransferStatus.DONE
    assert fake.wait(fake.submit(dst, [])) is TransferStatus.DONE
    assert fake.session_id == "fake"
    fake.close()


def test_registered_buffers_stay_alive() -> None:
    """The engine writes into registered memory from its own threads; a caller dropping its
    pool must not free it under a transfer (scripts/mooncake_tcp_probe.py once did)."""
    import gc
    import weakref

    backend = FakeTransfer()
    tensor = torch.zeros(SLOTS, HEADS, DIM)
    ref = weakref.ref(tensor)
    backend.register_buffers([tensor], PAGE)
    del tensor
    gc.collect()
    assert ref() is not None
    backend.close()


def test_mooncake_protocol_choice() -> None:
    assert mooncake_protocol("mooncake_tcp", "mlx5_0") == "tcp"
    assert mooncake_protocol("mooncake", None) == "tcp"
    assert mooncake_protocol("mooncake", "mlx5_0") == "rdma"


def _mooncake_importable() -> str | None:
    try:
        import_mooncake_engine()
    except TransferError as e:
        return str(e)
    return None


_MISSING = _mooncake_importable()
needs_mooncake = pytest.mark.skipif(
    _MISSING is not None, reason=f"Mooncake transfer engine not importable: {_MISSING}"
)


def test_missing_mooncake_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "mooncake", None)  # makes `import mooncake...` fail
    monkeypatch.delitem(sys.modules, "mooncake.engine", raising=False)
    with pytest.raises(TransferError, match=r"radixserve\[disaggregation\]"):
        MooncakeTransfer("127.0.0.1")


def _decode_side(conn: Connection) -> None:
    """The receiving process: registers zeroed buffers, publishes them, then reports which of
    its pages hold what after the sender is done."""
    backend = MooncakeTransfer("127.0.0.1")
    bufs = _kv_buffers()
    backend.register_buffers(bufs, PAGE)
    conn.send(backend.describe().to_json())
    conn.recv()  # the sender is done
    conn.send([b.clone() for b in bufs])
    conn.recv()
    backend.close()


@needs_mooncake
def test_mooncake_moves_pages_between_two_processes_over_tcp() -> None:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_decode_side, args=(child,), daemon=True)
    proc.start()
    try:
        assert parent.poll(60), "decode side did not start"
        peer = PeerBuffers.from_json(parent.recv())
        assert peer.session_id.startswith("127.0.0.1:")
        assert len(peer.buffers) == 4

        prefill = MooncakeTransfer("127.0.0.1", protocol="tcp")
        src = _kv_buffers(fill=True)
        prefill.register_buffers(src, PAGE)
        # pages 2,3,4 -> 10,11,12 (one run) and page 7 -> page 0
        pages = [(2, 10), (3, 11), (4, 12), (7, 0)]
        handle = prefill.submit(peer, pages)
        assert prefill.wait(handle, timeout_s=60) is TransferStatus.DONE
        with pytest.raises(TransferError, match="unknown"):
            prefill.poll(handle)  # a completed handle is forgotten

        parent.send(None)
        assert parent.poll(60)
        got = parent.recv()
        parent.send(None)
        moved = {dst: src_page for src_page, dst in pages}
        for layer, (s, d) in enumerate(zip(src, got, strict=True)):
            for page in range(SLOTS // PAGE):
                rows = slice(page * PAGE, (page + 1) * PAGE)
                if page in moved:
                    want = s[moved[page] * PAGE : (moved[page] + 1) * PAGE]
                else:
                    want = torch.zeros_like(d[rows])
                assert torch.equal(d[rows], want), (layer, page)

        # Refused before anything moves: a page outside the peer's pool, another page size.
        with pytest.raises(TransferError, match="out of range"):
            prefill.submit(peer, [(0, SLOTS // PAGE)])
        other = PeerBuffers(
            peer.session_id,
            tuple(BufferInfo(b.ptr, b.length, b.page_bytes * 2) for b in peer.buffers),
        )
        with pytest.raises(TransferError, match="page is"):
            prefill.submit(other, [(0, 0)])
        prefill.close()
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()


@needs_mooncake
def test_mooncake_transfer_to_a_dead_peer_fails() -> None:
    """A decode server that is gone: the write fails (connection refused) instead of hanging,
    and the handle reports FAILED so the prefill side can free its pages."""
    backend = MooncakeTransfer("127.0.0.1")
    buf = torch.zeros(SLOTS, HEADS, DIM, dtype=torch.bfloat16)
    backend.register_buffers([buf], PAGE)
    info = backend.describe().buffers[0]
    dead = PeerBuffers("127.0.0.1:1", (info,))  # port 1: nothing listens there
    handle = backend.submit(dead, [(0, 0)])
    assert backend.wait(handle, timeout_s=60) is TransferStatus.FAILED
    backend.close()


ROWS_BIG = 12_000


def _decode_side_big(conn: Connection) -> None:
    backend = MooncakeTransfer("127.0.0.1")
    buf = torch.zeros(ROWS_BIG, 2, dtype=torch.int32)
    backend.register_buffers([buf], 1)
    conn.send(backend.describe().to_json())
    conn.recv()
    conn.send(buf.clone())
    conn.recv()
    backend.close()


@needs_mooncake
def test_mooncake_many_scattered_pages_in_one_transfer() -> None:
    """5000 separate runs in one submit: more than Mooncake's TCP lane takes in one batch
    (about 4096 failed with 0.3.13), so the backend must split the batch."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_decode_side_big, args=(child,), daemon=True)
    proc.start()
    try:
        assert parent.poll(60), "decode side did not start"
        peer = PeerBuffers.from_json(parent.recv())
        prefill = MooncakeTransfer("127.0.0.1")
        src = torch.arange(ROWS_BIG * 2, dtype=torch.int32).reshape(ROWS_BIG, 2) + 1
        prefill.register_buffers([src], 1)
        pages = [(2 * i, 2 * i + 1) for i in range(5000)]  # no two pages coalesce
        assert len(coalesce_pages(pages)) == 5000
        assert prefill.wait(prefill.submit(peer, pages), timeout_s=120) is TransferStatus.DONE
        parent.send(None)
        assert parent.poll(60)
        got = parent.recv()
        parent.send(None)
        want = torch.zeros_like(src)
        want[1:10_000:2] = src[0:10_000:2]
        assert torch.equal(got, want)
        prefill.close()
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
