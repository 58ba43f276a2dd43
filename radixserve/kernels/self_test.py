"""Builds the C++ kernels and checks each against the PyTorch reference on small inputs.

Run by build.load_extension in a child process before the extension is trusted (an illegal
instruction or a wrong result fails the child, not the server). Exit status 0 = passed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from radixserve.kernels import reference
from radixserve.kernels.build import _compile

Check = Callable[[object], None]


def _close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item() + 1e-6
    if not err <= tol * scale:
        raise AssertionError(f"{name}: max error {err:.3g} exceeds {tol:.1g} x {scale:.3g}")


def check_elementwise(ext: object) -> None:
    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        x = torch.randn(5, 64, dtype=dtype)
        w = torch.randn(64, dtype=dtype)
        _close("rms_norm", ext.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5), tol)
        res = torch.randn(5, 64, dtype=dtype)
        want_out, want_res = reference.fused_add_rms_norm(x, res, w, 1e-5)
        x2, res2 = x.clone(), res.clone()
        ext.fused_add_rms_norm(x2, res2, w, 1e-5)
        _close("fused_add_rms_norm", x2, want_out, tol)
        _close("fused_add_rms_norm residual", res2, want_res, tol)
        gu = torch.randn(5, 128, dtype=dtype) * 4
        _close("silu_and_mul", ext.silu_and_mul(gu), reference.silu_and_mul(gu), tol)


def check_rope_and_attention(ext: object) -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim, slots_n = 4, 2, 16, 64
    cos_sin = torch.randn(32, dim)
    qkv = torch.randn(7, (heads + 2 * kv_heads) * dim)
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 9])
    slots = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    for neox in (True, False):
        caches = [torch.zeros(slots_n, kv_heads, dim) for _ in range(4)]
        results = []
        for fn, (kc, vc) in (
            (ext.rope_store_kv, caches[:2]),
            (reference.rope_store_kv, caches[2:]),
        ):
            t = qkv.clone()
            q, k, v = t.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
            fn(q, k, v, positions, cos_sin, kc, vc, slots, dim, dim, neox, 1.0, 1.0)
            results.append(t)
        _close("rope q/k", results[0], results[1], 1e-5)
        _close("k_cache", caches[0], caches[2], 1e-5)
        _close("v_cache", caches[1], caches[3], 1e-5)
    # Four requests: a short prefill over a prefix and a 40-token one over a 70-token prefix
    # (several query-row items and two key blocks: the gathered prefill path, register-blocked
    # where head_dim is a multiple of 16, scalar otherwise), a decode, and a decode whose keys
    # span two key blocks (direct path); then one decode alone (one work item per KV head
    # instead of one for all heads). GQA groups of 2 and 3 and plain multi-head attention
    # cover the direct kernel's query counts; bfloat16 caches its converting loads.
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    batches = (
        ([1, 0, 2, 3], [3, 20, 90, 70], [5, 1, 1, 40], [0, 5, 6, 7]),
        ([2], [100], [1], [0]),
    )
    for heads, kv_heads, head_dim, kv_dtype in (
        (4, 2, 16, torch.float32),
        (4, 2, 24, torch.float32),
        (6, 2, 16, torch.float32),
        (3, 3, 24, torch.bfloat16),
    ):
        k_cache = torch.randn(256, kv_heads, head_dim).to(kv_dtype)
        v_cache = torch.randn(256, kv_heads, head_dim).to(kv_dtype)
        req_to_token = torch.randint(0, 256, (4, 120))
        for rows, prefix, new, starts in batches:
            q = torch.randn(starts[-1] + new[-1], heads * head_dim)
            got = ext.paged_attention(
                q,
                k_cache,
                v_cache,
                req_to_token,
                t(rows),
                t(prefix),
                t(new),
                t(starts),
                heads,
                0.25,
                1.0,
                1.0,
            )
            want = reference.paged_attention(
                q,
                k_cache.float(),
                v_cache.float(),
                req_to_token,
                rows,
                prefix,
                new,
                starts,
                heads,
                0.25,
            )
            _close(
                f"paged_attention ({heads} heads, {kv_heads} KV heads, head_dim {head_dim}, "
                f"{len(rows)} requests, {kv_dtype})",
                got,
                want,
                1e-4,
            )


def check_gguf(ext: object) -> None:
    torch.manual_seed(0)
    # Column counts off the packed kernel's 16-column panels; K = 320 spans two of its K blocks
    # (256), so the accumulate-into-output step runs too.
    for n, k in ((25, 96), (40, 320)):
        for qtype in (reference.GGML_Q4_1, reference.GGML_Q8_0):
            blocks = _random_blocks(n, k, qtype)
            # Every integer row tile (1-4 rows), and the packed float kernel (12+ rows for Q4_1,
            # 32+ for Q8_0) with whole and partial 6-row tiles.
            for rows in (1, 2, 3, 6, 13, 37):
                x = torch.randn(rows, k)
                # Activations are quantized to int16 per block of 32 on the integer path: ~1e-4
                # relative error at most.
                _close(
                    "gguf_linear",
                    ext.gguf_linear(x, blocks, qtype, n),
                    reference.gguf_linear(x, blocks, qtype, n),
                    1e-3,
                )
                if rows == 2:
                    # One row runs the column-tiled kernel, two the row-tiled one: the same
                    # arithmetic per output, so a request's logits do not depend on whether it
                    # decodes alone or beside another.
                    alone = ext.gguf_linear(x[:1].contiguous(), blocks, qtype, n)
                    if not torch.equal(alone[0], ext.gguf_linear(x, blocks, qtype, n)[0]):
                        raise AssertionError(
                            "gguf_linear: one row differs from the same row of two"
                        )
                if rows >= 6:
                    _close(
                        "gguf_linear_tiled",
                        ext.gguf_linear_tiled(x, blocks, qtype, n),
                        reference.gguf_linear(x, blocks, qtype, n),
                        1e-5,
                    )


def check_gguf_amx_bf16(ext: object) -> None:
    """bfloat16 rows on AMX-BF16 tiles (gguf_gemm_amx.cpp), where this build and the OS have
    them: partial row blocks and panels, one and four row blocks per pass. The weights are
    rounded to bf16 (2^-9 relative each) and the output too: 1e-2 of the largest output."""
    if not ext.gguf_tiled_amx_available():
        return
    torch.manual_seed(0)
    for rows, n, k in ((13, 25, 96), (70, 40, 320)):
        x = torch.randn(rows, k).to(torch.bfloat16)
        for qtype in (reference.GGML_Q4_1, reference.GGML_Q8_0):
            blocks = _random_blocks(n, k, qtype)
            want = reference.gguf_linear(x.float(), blocks, qtype, n)
            _close(
                "gguf_linear_tiled_amx", ext.gguf_linear_tiled_amx(x, blocks, qtype, n), want, 1e-2
            )
            # The greedy LM head's argmax kept while those tiles are written: exactly the
            # argmax of the logits they write, on the whole head and on a shorter vocabulary.
            logits = ext.gguf_linear(x, blocks, qtype, n)
            for columns in (n, n - 3):
                got = ext.gguf_linear_argmax(x, blocks, qtype, n, columns)
                if not torch.equal(got, logits[:, :columns].argmax(dim=-1)):
                    raise AssertionError(f"gguf_linear_argmax differs ({rows} rows, {columns})")


def check_gguf_block_types(ext: object) -> None:
    """Every other block type gguf_linear runs (gguf_kquant.cpp), integer path and tiles."""

    torch.manual_seed(0)
    n, k = 25, 512
    # process-wide choices: checked both ways, then restored
    previous = ext.kquant_int8(), ext.q8k_panel_min_rows()
    ext.set_kquant_int8(False)
    ext.set_q8k_panel_min_rows(2**62)
    try:
        _check_block_types(ext, n, k)
    finally:
        ext.set_kquant_int8(previous[0])
        ext.set_q8k_panel_min_rows(previous[1])


def _check_block_types(ext: object, n: int, k: int) -> None:
    from radixserve.kernels import gguf_dequant, gguf_types

    for qtype in sorted(gguf_types.NATIVE_TYPES - gguf_types.LEGACY_CHAIN_TYPES):
        if not ext.gguf_kernel_type(qtype):
            raise AssertionError(f"gguf_linear lacks {gguf_types.type_name(qtype)}")
        fmt = gguf_types.FORMATS[qtype]
        blocks = torch.randint(0, 256, (n, k // fmt.weights, fmt.bytes), dtype=torch.uint8)
        for offset in gguf_types.FP16_FIELDS.get(qtype, ()):
            scales = (torch.rand(n, k // fmt.weights) * 0.002).to(torch.float16)
            blocks[..., offset : offset + 2] = scales.view(torch.uint8).reshape(n, -1, 2)
        for offset in gguf_types.E8M0_FIELDS.get(qtype, ()):
            # Power-of-two scales near 2 ** -10 (MXFP4): the size of the fp16 scales above.
            blocks[..., offset] = torch.randint(114, 120, (n, k // fmt.weights), dtype=torch.uint8)
        blocks = blocks.reshape(n, -1).contiguous()
        w = gguf_dequant.dequantize_rows(blocks, qtype, n)
        for rows in (1, 2, 13):
            x = torch.randn(rows, k)
            name = f"gguf_linear {gguf_types.type_name(qtype)}"
            _close(name, ext.gguf_linear(x, blocks, qtype, n), x @ w.T, 1e-3)
            if qtype in gguf_types.Q8K_TYPES:  # and on int8 activations per 256 (gguf_q8k.cpp)
                ext.set_kquant_int8(True)
                _close(f"{name} (Q8_K)", ext.gguf_linear(x, blocks, qtype, n), x @ w.T, 3e-2)
                ext.set_kquant_int8(False)
                _check_q8k_panel(ext, name, x, blocks, qtype, n, w)


def _check_q8k_panel(
    ext: object,
    name: str,
    x: torch.Tensor,
    blocks: torch.Tensor,
    qtype: int,
    n: int,
    w: torch.Tensor,
) -> None:
    """The Q8_K kernels (per row and panel) in each variant this build has; the process-wide
    switches are restored after."""
    previous = ext.q8k_panel_min_rows(), ext.q8k_isa(), ext.kquant_int8()
    try:
        ext.set_kquant_int8(True)
        for isa in ext.q8k_isas():
            ext.set_q8k_isa(isa)
            for path, min_rows in (("panel", 1), ("rows", 2**62)):
                ext.set_q8k_panel_min_rows(min_rows)
                got = ext.gguf_linear(x, blocks, qtype, n)
                _close(f"{name} (Q8_K {path}, {isa})", got, x @ w.T, 3e-2)
    finally:
        ext.set_q8k_panel_min_rows(previous[0])
        ext.set_q8k_isa(previous[1])
        ext.set_kquant_int8(previous[2])


def _random_blocks(n: int, k: int, qtype: int) -> torch.Tensor:
    """[n, k / 32 * bytes] GGUF blocks of random quants with small fp16 scales (and mins)."""
    nbytes = reference.BLOCK_BYTES[qtype]
    blocks = torch.randint(0, 256, (n, k // 32, nbytes), dtype=torch.uint8)
    scales = (torch.rand(n, k // 32, 2) * 0.02).to(torch.float16).view(torch.uint8)
    blocks[..., 0:4] = scales.reshape(n, k // 32, 4)
    return blocks.reshape(n, -1).contiguous()


def check_float_gemm(ext: object) -> None:
    if not ext.float_packed_available():
        return
    torch.manual_seed(0)
    # Columns off the 16-column panels, K over two K blocks, whole and partial 6-row tiles.
    for rows, n, k in ((6, 25, 96), (13, 40, 320), (37, 16, 8)):
        x, w = torch.randn(rows, k), torch.randn(n, k)
        _close("float_linear_packed", ext.float_linear_packed(x, w), x @ w.T, 1e-5)
    x, w = torch.randn(300, 1536), torch.randn(40, 1536)
    _close("float_linear_packed (M blocks)", ext.float_linear_packed(x, w), x @ w.T, 1e-5)
    _same_in_row_chunks("float_linear_packed", lambda rows: ext.float_linear_packed(rows, w), x)


def check_gemm_blocking(ext: object) -> None:
    """Over 256 rows the packed GEMM blocks M (x rows kept in L2) and packs panel groups once:
    the same numbers as the reference, and bitwise the same as the rows computed in chunks
    small enough to run unblocked (a request's logits never depend on its batch's size)."""
    if not ext.float_packed_available():  # the same AVX2 build condition
        return
    torch.manual_seed(0)
    for n, k in ((40, 1536), (25, 96)):  # K = 1536: 30-row M blocks; K = 96: one block
        for qtype in (reference.GGML_Q4_1, reference.GGML_Q8_0):
            blocks = _random_blocks(n, k, qtype)
            x = torch.randn(300, k)
            _close(
                "gguf_linear_tiled (M blocks)",
                ext.gguf_linear_tiled(x, blocks, qtype, n),
                reference.gguf_linear(x, blocks, qtype, n),
                1e-5,
            )
            _same_in_row_chunks(
                "gguf_linear_tiled",
                lambda rows, b=blocks, q=qtype, cols=n: ext.gguf_linear_tiled(rows, b, q, cols),
                x,
            )


def _same_in_row_chunks(
    name: str, matmul: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> None:
    chunks = torch.cat([matmul(x[i : i + 100].contiguous()) for i in range(0, len(x), 100)])
    if not torch.equal(matmul(x), chunks):
        raise AssertionError(f"{name}: a blocked call differs from the same rows in chunks")


CHECKS: tuple[Check, ...] = (
    check_elementwise,
    check_rope_and_attention,
    check_gguf,
    check_gguf_amx_bf16,
    check_gguf_block_types,
    check_float_gemm,
    check_gemm_blocking,
)


def main() -> int:
    ext = _compile()
    for check in CHECKS:
        check(ext)
    print("self-test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
