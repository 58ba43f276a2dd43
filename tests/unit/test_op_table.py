"""Every kernel op is declared once (kernels/op_table.py): the function layers call, the C++
function, the PyTorch reference and the torch.compile registration all come from its entry."""

from __future__ import annotations

import inspect

import pytest
import torch

from radixserve.kernels import build, op_table, ops


@pytest.mark.parametrize("op", op_table.TABLE, ids=lambda op: op.name)
def test_ops_function_is_made_from_the_entry(op: op_table.KernelOp) -> None:
    made = getattr(ops, op.name)
    assert made.__wrapped__ is op.reference
    assert inspect.signature(made) == inspect.signature(op.reference)
    assert made.__doc__ == op.reference.__doc__


@pytest.mark.parametrize("op", op_table.TABLE, ids=lambda op: op.name)
def test_the_extension_has_each_op(op: op_table.KernelOp) -> None:
    ext = build.load_extension()
    if ext is None:
        pytest.skip("C++ kernels unavailable")
    assert callable(getattr(ext, op.name))


def test_opaque_ops_are_registered_from_the_table() -> None:
    from radixserve.layers import compile_ops  # noqa: F401 (registers the ops)

    opaque = [op for op in op_table.TABLE if op.fake is not None]
    assert {op.name for op in opaque} >= {"gguf_linear", "float_linear"}
    for op in opaque:
        registered = getattr(torch.ops.radixserve, op.name).default
        assert str(registered._schema).endswith(op.schema.split("(", 1)[1])


def test_reference_runs_where_the_kernel_does_not_take_the_arguments() -> None:
    """A 3-D input is not what rms_norm's kernel takes: the reference answers, the same."""
    x = torch.randn(2, 3, 64)
    weight = torch.rand(64)
    assert torch.equal(ops.rms_norm(x, weight, 1e-6), op_table.reference.rms_norm(x, weight, 1e-6))
    with pytest.raises(TypeError):
        ops.rms_norm(x, weight, eps=1e-6)  # positional arguments only


def test_the_in_place_kernel_returns_its_inputs() -> None:
    if build.load_extension() is None:
        pytest.skip("C++ kernels unavailable")
    x, residual, weight = torch.randn(4, 64), torch.randn(4, 64), torch.rand(64)
    want = op_table.reference.fused_add_rms_norm(x, residual, weight, 1e-6)
    got = ops.fused_add_rms_norm(x, residual, weight, 1e-6)
    assert got[0] is x and got[1] is residual
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
