// The Q4_1/Q8_0 matmul of 5 or more rows (gguf_gemm_tiled.cpp's job from 12) on AMX-BF16
// tiles, for bfloat16 activations. The float path converts x to float32 and runs 16 FMAs per
// weight and row on AVX2; a TDPBF16PS does 16 x 16 x 32 multiply-adds in one instruction, so
// at 64 rows the multiplications stop mattering and dequantizing the weights is most of the
// time. This file holds the entry points and the layout for 17 rows or more; up to 16 rows take
// gguf_gemm_amx_few.cpp's (the pieces both share: gguf_amx_rows.h).
//
// Each thread takes panels of 16 weight rows (output columns). A panel is dequantized once (as
// float: Q4_1 d * q + m, Q8_0 d * q, the float path's values) and rounded to bf16 into the VNNI
// pair layout a B tile wants: per pair of K, the 16 rows' (w[2p], w[2p + 1]) dwords, so one B
// tile is 32 K x 16 rows (1 KiB) and a whole panel is K * 64 bytes (36 KiB at K = 576, 96 KiB
// at K = 1536: in L2 while every row block passes over it). Activation rows are A tiles read
// straight from x (16 rows x 32 bf16, any row stride); a partial last block of rows is copied
// into a zero-padded buffer once per call. Two panels and two 16-row blocks share their tile
// loads (four products per four loads); a lone last panel runs with up to four row blocks.
//
// Each 16-row block has one fp32 accumulator tile taken over K in order, so a row's result
// depends only on its own x row: the same bits whichever rows share its call (as the float
// path). Rounding: x is used as is (already bf16); the weights lose bf16's 8-bit mantissa
// (relative error <= 2^-9 each), products and sums are fp32.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "amx_tiles.h"
#include "gguf_amx_rows.h"
#include "gguf_blocks.h"
#include "gguf_q8k_panel.h"
#include "kernels.h"

namespace radixserve {
namespace {

// Off: bfloat16 x takes the float path (converted to float32), as in a build without AMX.
std::atomic<bool> g_amx_bf16_enabled{true};

#if defined(RS_GGUF_AMX_BF16)
using amx_rows::aligned64;
using amx_rows::amx_linear_few;
using amx_rows::dequantize_rows;
using amx_rows::kFewRowsMax;
using amx_rows::kLanes;
using amx_rows::kStepK;
using amx_rows::kTileRows;

constexpr int64_t kTileBytes = 1024;
constexpr int kMaxBlocks = 4;  // row blocks per pass: C tiles 0-3

// panel[(p * 16 + r) * 2 + j] = bf16(W[n0 + r, 2p + j]); rows past `rows` are zero. `rows_buf`
// holds the dequantized rows in order first (dequantize_rows).
void pack_panel_bf16(const uint8_t* wp, int64_t row_bytes, int64_t qtype, int64_t k, int64_t n0,
                     int rows, int32_t* rows_buf, int32_t* panel) {
  dequantize_rows(wp, row_bytes, qtype, k, n0, rows, rows_buf);
  constexpr std::integral_constant<int, kLanes> lanes{};
  q8k_panel::interleave_rows(rows_buf, static_cast<int>(k / 2), panel, lanes);
}

// A pass over B (1-4) blocks of 16 activation rows: block i's A tiles start at a[i] (rows
// lda[i] bytes apart); its fp32 results go to c[i] (rows ldc[i] bytes apart), 16 x 16 each.
// Tiles: C 0-3, A 4/5/7 (block 3 reuses 4 after block 0's product read it), B 6.
template <int B>
void amx_pass(const int32_t* panel, int64_t steps, const uint16_t* const* a, const int64_t* lda,
              float* const* c, const int64_t* ldc) {
  static_assert(B >= 1 && B <= kMaxBlocks, "1 to 4 row blocks");
  amx_rows::zero_c_tiles<B>();
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(6, reinterpret_cast<const uint8_t*>(panel) + s * kTileBytes, 64);
    _tile_loadd(4, a[0] + s * kStepK, lda[0]);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (B > 1) {
      _tile_loadd(5, a[1] + s * kStepK, lda[1]);
      _tile_dpbf16ps(1, 5, 6);
    }
    if constexpr (B > 2) {
      _tile_loadd(7, a[2] + s * kStepK, lda[2]);
      _tile_dpbf16ps(2, 7, 6);
    }
    if constexpr (B > 3) {
      _tile_loadd(4, a[3] + s * kStepK, lda[3]);
      _tile_dpbf16ps(3, 4, 6);
    }
  }
  _tile_stored(0, c[0], ldc[0]);
  if constexpr (B > 1) _tile_stored(1, c[1], ldc[1]);
  if constexpr (B > 2) _tile_stored(2, c[2], ldc[2]);
  if constexpr (B > 3) _tile_stored(3, c[3], ldc[3]);
}

using PassFn = void (*)(const int32_t*, int64_t, const uint16_t* const*, const int64_t*,
                        float* const*, const int64_t*);
constexpr PassFn kPasses[kMaxBlocks] = {amx_pass<1>, amx_pass<2>, amx_pass<3>, amx_pass<4>};

// The same over two panels (p[0], p[1]) and B (1-2) row blocks: C tile 2i + j holds block i x
// panel j (result c[2i + j]). Per 32 K two A and two B loads feed four products, with no tile
// reloaded while a product still reads it (amx_pass<4> reloads A tile 4), and x is read from
// L2 once per two panels instead of once per panel.
template <int B>
void amx_pass_pair(const int32_t* const* p, int64_t steps, const uint16_t* const* a,
                   const int64_t* lda, float* const* c, const int64_t* ldc) {
  static_assert(B == 1 || B == 2, "1 or 2 row blocks");
  const uint8_t* p0 = reinterpret_cast<const uint8_t*>(p[0]);
  const uint8_t* p1 = reinterpret_cast<const uint8_t*>(p[1]);
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (B > 1) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(6, p0 + s * kTileBytes, 64);
    _tile_loadd(7, p1 + s * kTileBytes, 64);
    _tile_loadd(4, a[0] + s * kStepK, lda[0]);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (B > 1) {
      _tile_loadd(5, a[1] + s * kStepK, lda[1]);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c[0], ldc[0]);
  _tile_stored(1, c[1], ldc[1]);
  if constexpr (B > 1) {
    _tile_stored(2, c[2], ldc[2]);
    _tile_stored(3, c[3], ldc[3]);
  }
}

// Activation rows per call region: x's rows a pass reads for every panel stay in L2
// (K = 1536: 128 rows, 384 KiB) instead of streaming from memory once per panel.
constexpr int64_t kRowBytesBudget = 512 * 1024;

void amx_linear(const uint16_t* xp, int64_t ldx, int64_t m, int64_t k, const uint8_t* wp,
                int64_t row_bytes, int64_t qtype, int64_t n, const Output& out) {
  const int64_t steps = k / kStepK;
  const int64_t panels = (n + kLanes - 1) / kLanes;
  const int64_t full_blocks = m / kTileRows, tail_rows = m % kTileRows;
  // The last partial block of rows, zero-padded to 16 (an A tile always loads 16 rows).
  std::vector<uint16_t> tail(tail_rows > 0 ? kTileRows * k : 0, 0);
  for (int64_t r = 0; r < tail_rows; ++r) {
    std::memcpy(tail.data() + r * k, xp + (full_blocks * kTileRows + r) * ldx, k * 2);
  }
  const int64_t blocks = full_blocks + (tail_rows > 0 ? 1 : 0);
  const int64_t region_blocks = std::max<int64_t>(
      kMaxBlocks, kRowBytesBudget / (kTileRows * k * 2) / kMaxBlocks * kMaxBlocks);
  for (int64_t blk0 = 0; blk0 < blocks; blk0 += region_blocks) {
    const int64_t blk_end = std::min(blocks, blk0 + region_blocks);
    at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
      static thread_local std::vector<int32_t> panel_store[2], rows_store;
      const int64_t panel_dwords = steps * kLanes * kLanes;
      int32_t* panel[2] = {aligned64(panel_store[0], panel_dwords),
                           aligned64(panel_store[1], panel_dwords)};
      int32_t* rows_buf = aligned64(rows_store, panel_dwords);
      alignas(64) float scratch[kMaxBlocks][kTileRows][kLanes];
      amx::configure_full_tiles();
      for (int64_t pi = begin; pi < end;) {
        const int np = pi + 1 < end ? 2 : 1;  // panels this pass: two, or a lone last one
        const int64_t n0 = pi * kLanes;
        int cols[2] = {0, 0};
        for (int j = 0; j < np; ++j) {
          cols[j] = static_cast<int>(std::min<int64_t>(kLanes, n - n0 - j * kLanes));
          pack_panel_bf16(wp, row_bytes, qtype, k, n0 + j * kLanes, cols[j], rows_buf, panel[j]);
        }
        const int per_pass = kMaxBlocks / np;  // row blocks: C tiles = blocks x panels <= 4
        for (int64_t b = blk0; b < blk_end; b += per_pass) {
          const int count = static_cast<int>(std::min<int64_t>(per_pass, blk_end - b));
          const uint16_t* a[kMaxBlocks];
          int64_t lda[kMaxBlocks], ldc[kMaxBlocks];
          float* c[kMaxBlocks];
          bool direct[kMaxBlocks];
          for (int i = 0; i < count; ++i) {
            const int64_t blk = b + i;
            const bool partial = blk == full_blocks;  // the padded tail block
            a[i] = partial ? tail.data() : xp + blk * kTileRows * ldx;
            lda[i] = (partial ? k : ldx) * 2;
            for (int j = 0; j < np; ++j) {
              // Whole 16 x 16 results go straight into out; the rest through scratch.
              const int slot = i * np + j;
              // (bfloat16 results are rounded on the way, through scratch)
              direct[slot] = !partial && cols[j] == kLanes && out.f32 != nullptr;
              c[slot] = direct[slot] ? out.f32 + blk * kTileRows * n + n0 + j * kLanes
                                     : &scratch[slot][0][0];
              ldc[slot] = direct[slot] ? n * 4 : kLanes * 4;
            }
          }
          if (np == 1) {
            kPasses[count - 1](panel[0], steps, a, lda, c, ldc);
          } else if (count == 2) {
            amx_pass_pair<2>(panel, steps, a, lda, c, ldc);
          } else {
            amx_pass_pair<1>(panel, steps, a, lda, c, ldc);
          }
          for (int i = 0; i < count; ++i) {
            const int64_t row0 = (b + i) * kTileRows;
            const int64_t rows = std::min<int64_t>(kTileRows, m - row0);
            for (int j = 0; j < np; ++j) {
              const int slot = i * np + j;
              if (direct[slot]) continue;
              for (int64_t r = 0; r < rows; ++r) {
                store_row(out, row0 + r, n0 + j * kLanes, scratch[slot][r], cols[j]);
              }
            }
          }
        }
        pi += np;
      }
      _tile_release();
    });
  }
}
#endif

}  // namespace

bool gguf_tiled_amx_compiled() {
#if defined(RS_GGUF_AMX_BF16)
  return true;
#else
  return false;
#endif
}

bool gguf_tiled_amx_available() { return gguf_tiled_amx_compiled() && amx::tile_state_permitted(); }

void set_gguf_tiled_amx_enabled(bool enabled) { g_amx_bf16_enabled.store(enabled); }

bool gguf_tiled_amx_enabled() {
  return g_amx_bf16_enabled.load(std::memory_order_relaxed) && gguf_tiled_amx_available();
}

namespace {

// x: [M, K] bfloat16 with unit stride in K; blocks: [N, K / 32 * block bytes] Q4_1 or Q8_0.
void check_amx_call(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                    int64_t out_features) {
  TORCH_CHECK(gguf_tiled_amx_available(),
              "gguf_linear_tiled_amx needs AMX-BF16 (in this build, granted by the OS)");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.stride(1) == 1,
              "x must be bfloat16 [rows, K] with unit stride");
  TORCH_CHECK(qtype == gguf::kQ4_1 || qtype == gguf::kQ8_0,
              "gguf_linear_tiled_amx runs Q4_1 and Q8_0, not GGML type ", qtype);
  const int64_t k = x.size(1);
  TORCH_CHECK(k % gguf::kBlock == 0, "K must be a multiple of 32");
  const int64_t bytes = qtype == gguf::kQ4_1 ? gguf::kQ4_1Bytes : gguf::kQ8_0Bytes;
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous() && blocks.dim() == 2 &&
                  blocks.size(0) == out_features && blocks.size(1) == k / gguf::kBlock * bytes,
              "blocks do not match [N, K]");
}

// The [M, N] products into `dst` (the few-row or the many-row layout).
void run_amx(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype, int64_t n,
             Output dst) {
#if defined(RS_GGUF_AMX_BF16)
  const int64_t m = x.size(0), k = x.size(1);
  dst.n = n;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  if (m > 0 && n > 0 && m <= kFewRowsMax) {
    amx_linear_few(xp, x.stride(0), m, k, blocks.data_ptr<uint8_t>(), blocks.size(1), qtype, n,
                   dst);
  } else if (m > 0 && n > 0) {
    amx_linear(xp, x.stride(0), m, k, blocks.data_ptr<uint8_t>(), blocks.size(1), qtype, n, dst);
  }
#endif
}

// Returns [M, N] in `out_type` (float32, or bfloat16 rounded from the float32 sums).
at::Tensor amx_call(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                    int64_t out_features, at::ScalarType out_type) {
  check_amx_call(x, blocks, qtype, out_features);
  auto out = at::empty({x.size(0), out_features}, x.options().dtype(out_type));
  Output dst;
  if (out_type == at::kFloat) {
    dst.f32 = out.data_ptr<float>();
  } else {
    dst.bf16 = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  }
  run_amx(x, blocks, qtype, out_features, dst);
  return out;
}

}  // namespace

// Returns [M, N] float32.
at::Tensor gguf_linear_tiled_amx(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                                 int64_t out_features) {
  return amx_call(x, blocks, qtype, out_features, at::kFloat);
}

// The same sums rounded to bfloat16 as each tile row is written (gguf_linear's bf16 result).
at::Tensor gguf_linear_tiled_amx_bf16(const at::Tensor& x, const at::Tensor& blocks,
                                      int64_t qtype, int64_t out_features) {
  return amx_call(x, blocks, qtype, out_features, at::kBFloat16);
}

// Each row's argmax over the first `columns` of those bfloat16 results, never written.
at::Tensor gguf_argmax_tiled_amx_bf16(const at::Tensor& x, const at::Tensor& blocks,
                                      int64_t qtype, int64_t out_features, int64_t columns) {
  check_amx_call(x, blocks, qtype, out_features);
  TORCH_CHECK(columns > 0 && columns <= out_features, "columns must be in [1, out_features]");
  auto out = at::zeros({x.size(0)}, x.options().dtype(at::kLong));
#if defined(RS_GGUF_AMX_BF16)
  RowArgmax argmax(x.size(0), columns, at::get_num_threads());
  Output dst;
  dst.argmax = &argmax;
  run_amx(x, blocks, qtype, out_features, dst);
  argmax.finish(out.data_ptr<int64_t>());
#endif
  return out;
}

}  // namespace radixserve
