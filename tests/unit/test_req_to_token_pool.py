from __future__ import annotations

import pytest
import torch

from radixserve.mem_cache.req_to_token_pool import ReqToTokenPool


def test_alloc_until_full_then_none() -> None:
    pool = ReqToTokenPool(3, 16)
    rows = [pool.alloc() for _ in range(3)]
    assert sorted(rows) == [0, 1, 2]  # type: ignore[type-var]
    assert pool.available_size() == 0
    assert pool.alloc() is None
    pool.free(1)
    assert pool.available_size() == 1
    assert pool.alloc() == 1


def test_table_shape_and_dtype() -> None:
    pool = ReqToTokenPool(4, 10)
    assert pool.req_to_token.shape == (4, 10)
    assert pool.req_to_token.dtype == torch.int64


def test_write_then_read_round_trip() -> None:
    pool = ReqToTokenPool(2, 16)
    r = pool.alloc()
    assert r is not None
    pool.write(r, 0, torch.tensor([5, 6, 7]))
    pool.write(r, 3, torch.tensor([9, 1], dtype=torch.int32))
    assert pool.read(r, 0, 5).tolist() == [5, 6, 7, 9, 1]
    assert pool.read(r, 2, 4).tolist() == [7, 9]
    assert pool.req_to_token[r, :5].tolist() == [5, 6, 7, 9, 1]


def test_read_is_a_copy() -> None:
    pool = ReqToTokenPool(1, 8)
    r = pool.alloc()
    assert r is not None
    pool.write(r, 0, torch.tensor([1, 2]))
    got = pool.read(r, 0, 2)
    pool.write(r, 0, torch.tensor([3, 4]))
    assert got.tolist() == [1, 2]


def test_rows_are_independent() -> None:
    pool = ReqToTokenPool(2, 4)
    a, b = pool.alloc(), pool.alloc()
    assert a is not None and b is not None
    pool.write(a, 0, torch.tensor([1, 1, 1, 1]))
    pool.write(b, 0, torch.tensor([2, 2, 2, 2]))
    assert pool.read(a, 0, 4).tolist() == [1, 1, 1, 1]


def test_double_free_raises() -> None:
    pool = ReqToTokenPool(2, 4)
    r = pool.alloc()
    assert r is not None
    pool.free(r)
    with pytest.raises(RuntimeError, match="double free"):
        pool.free(r)
    assert pool.available_size() == 2


def test_bounds_are_checked_with_parameter_names() -> None:
    pool = ReqToTokenPool(2, 4)
    r = pool.alloc()
    assert r is not None
    with pytest.raises(ValueError, match="max_context_len"):
        pool.write(r, 2, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="max_context_len"):
        pool.read(r, 3, 2)
    with pytest.raises(ValueError, match="req_pool_idx"):
        pool.write(5, 0, torch.tensor([1]))
    with pytest.raises(RuntimeError, match="not allocated"):
        pool.read(1 - r, 0, 1)
    with pytest.raises(ValueError, match="slots"):
        pool.write(r, 0, torch.tensor([[1]]))
    with pytest.raises(ValueError, match="max_reqs"):
        ReqToTokenPool(0, 4)
    with pytest.raises(ValueError, match="max_context_len"):
        ReqToTokenPool(2, 0)
