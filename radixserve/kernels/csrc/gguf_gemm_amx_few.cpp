// The Q4_1/Q8_0 matmul of 5 to 16 bfloat16 rows on AMX-BF16 tiles (a decode batch, a
// speculative verify); gguf_gemm_amx.cpp runs more rows and holds the entry points.
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "amx_tiles.h"
#include "gguf_amx_rows.h"
#include "gguf_q8k_panel.h"

#if defined(RS_GGUF_AMX_BF16)
namespace radixserve {
namespace amx_rows {
namespace {

// Few activation rows (a decode batch, a speculative verify: at most 16) turn the roles round:
// the weights are the A operand, 16 weight rows x 32 K of bf16 per tile, which is simply their
// dequantized rows in order, so a panel needs no transpose; x, transposed once per call into
// the VNNI pair layout, is the B operand (16 K pairs x 16 rows, zero-padded). C[i][r] is weight
// row i times x row r: the same products, summed in the same K order, as amx_linear's C[r][i],
// so a row's result has the same bits on either path. Up to four panels run side by side, each
// in its own C tile: one panel's products all accumulate into one tile, so alone they waited on
// each other's latency (~60 cycles a step, 40% of the time at 8 rows) instead of the unit's
// throughput. The rest is dequantizing.
constexpr int kFewPanels = 4;  // C tiles 0-3; A tiles 4, 5, 7 (4 again for the fourth); B 6

// C tiles 0 .. P-1 = the P panels' dequantized rows (A, w[j] + step * 16 dwords, rows `width`
// dwords apart) times x's transposed steps (B, xt + step * 256 dwords), K in order.
template <int P>
void few_panels_pass(const int32_t* const* w, int64_t width, const int32_t* xt, int64_t steps) {
  static_assert(P >= 1 && P <= kFewPanels, "1 to 4 panels");
  zero_c_tiles<P>();
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(6, xt + s * kLanes * kTileRows, 64);
    _tile_loadd(4, w[0] + s * kLanes, width * 4);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (P > 1) {
      _tile_loadd(5, w[1] + s * kLanes, width * 4);
      _tile_dpbf16ps(1, 5, 6);
    }
    if constexpr (P > 2) {
      _tile_loadd(7, w[2] + s * kLanes, width * 4);
      _tile_dpbf16ps(2, 7, 6);
    }
    if constexpr (P > 3) {
      _tile_loadd(4, w[3] + s * kLanes, width * 4);
      _tile_dpbf16ps(3, 4, 6);
    }
  }
}

void store_few_panel(int tile, const Output& out, int64_t m, int64_t n0, int cols) {
  alignas(64) int32_t c_tile[kLanes * kTileRows];
  alignas(64) int32_t c_rows[kTileRows * kLanes];
  switch (tile) {
    case 0: _tile_stored(0, c_tile, 64); break;
    case 1: _tile_stored(1, c_tile, 64); break;
    case 2: _tile_stored(2, c_tile, 64); break;
    default: _tile_stored(3, c_tile, 64); break;
  }
  // c_tile[i][r] -> c_rows[r][i]: each x row's 16 outputs in a row.
  constexpr std::integral_constant<int, kLanes> lanes{};
  q8k_panel::interleave_rows(c_tile, kTileRows, c_rows, lanes);
  for (int64_t r = 0; r < m; ++r) {
    store_row(out, r, n0, reinterpret_cast<const float*>(c_rows) + r * kLanes, cols);
  }
}

}  // namespace

void amx_linear_few(const uint16_t* xp, int64_t ldx, int64_t m, int64_t k, const uint8_t* wp,
                    int64_t row_bytes, int64_t qtype, int64_t n, const Output& out) {
  const int64_t steps = k / kStepK, width = k / 2;
  const int64_t panels = (n + kLanes - 1) / kLanes;
  // x's rows as dwords (bf16 pairs), zero past m, then transposed: B tile s at xt + s * 256.
  // (The calling thread's buffers, kept between calls.)
  static thread_local std::vector<int32_t> x_store, xt_store;
  int32_t* x_rows = aligned64(x_store, kTileRows * width);
  int32_t* xt = aligned64(xt_store, kTileRows * width);
  for (int64_t r = 0; r < m; ++r) std::memcpy(x_rows + r * width, xp + r * ldx, k * 2);
  std::memset(x_rows + m * width, 0, (kTileRows - m) * width * 4);
  constexpr std::integral_constant<int, kLanes> lanes{};
  q8k_panel::interleave_rows(x_rows, static_cast<int>(width), xt, lanes);
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    static thread_local std::vector<int32_t> weight_store[kFewPanels];
    int32_t* w_rows[kFewPanels];
    for (int j = 0; j < kFewPanels; ++j) {
      w_rows[j] = aligned64(weight_store[j], kLanes * width);  // 16 dequantized rows
    }
    amx::configure_full_tiles();
    for (int64_t p0 = begin; p0 < end; p0 += kFewPanels) {
      const int count = static_cast<int>(std::min<int64_t>(kFewPanels, end - p0));
      int cols[kFewPanels];
      for (int j = 0; j < count; ++j) {
        const int64_t n0 = (p0 + j) * kLanes;
        cols[j] = static_cast<int>(std::min<int64_t>(kLanes, n - n0));
        dequantize_rows(wp, row_bytes, qtype, k, n0, cols[j], w_rows[j]);
      }
      switch (count) {
        case 1: few_panels_pass<1>(w_rows, width, xt, steps); break;
        case 2: few_panels_pass<2>(w_rows, width, xt, steps); break;
        case 3: few_panels_pass<3>(w_rows, width, xt, steps); break;
        default: few_panels_pass<4>(w_rows, width, xt, steps); break;
      }
      for (int j = 0; j < count; ++j) store_few_panel(j, out, m, (p0 + j) * kLanes, cols[j]);
    }
    _tile_release();
  });
}

}  // namespace amx_rows
}  // namespace radixserve
#endif
