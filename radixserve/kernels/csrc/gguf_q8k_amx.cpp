// The K-quant panel GEMM on AMX-INT8 tiles (q8k_isa "amx_int8"), for many activation rows.
//
// gguf_q8k_panel.cpp multiplies each run of kSub codes by its integer scale after the dot
// product, a vector operation per run and activation row that tiles cannot do. Here the scale
// goes into the weights instead: a panel of 16 weight rows is decoded once into w = code * scale
// (int16, |w| <= 63 * 128), split into its low byte (unsigned) and high byte (signed), so that
//   sum_k x_k w_k = sum_k x_k lo_k + 256 * sum_k x_k hi_k
// and one super-block of 16 activation rows x 16 weight rows is 4 + 4 tile multiply-adds of 64
// K each (TDPBSUD on the low bytes, TDPBSSD on the high ones) into two int32 tiles. The integer
// sum is the per-row kernel's exactly.
//
// The correction (the mins' or zero point's: sum_j coef_j * bsum_j over the 16 runs of 16, with
// bsum the activations' per-16 sums) is one more tile multiply-add, in bf16 (AMX-BF16): with
// bsum = 64 h + l (l in [0, 64), h in [-32, 32)) and coef | 64 coef (|coef| <= 128) every
// factor is a bf16 integer and every partial sum an fp32 integer below 2^24, so the float
// result is the integer sum exactly. Done as vector multiply-adds per row it took a third of
// the kernel's time. The float steps after it are gguf_q8k.cpp's, in its order: a row has the
// same bits here as alone on the per-row kernel.
#include <algorithm>
#include <vector>

#include "amx_tiles.h"
#include "gguf_kquant.h"
#include "gguf_q8k.h"
#include "gguf_q8k_decode.h"
#include "gguf_q8k_panel.h"

namespace radixserve {

#if defined(RS_Q8K_AMX)
namespace {

using namespace q8k_panel;  // NOLINT: the panel GEMMs' shared helpers
using q8k::Q8KQ3_K;
using q8k::Q8KQ4_K;
using q8k::Q8KQ5_K;
using q8k::Q8KQ6_K;
using q8k::SuperBlock;

constexpr int kLanes = 16;  // weight rows per panel: one int32 tile row
constexpr int64_t kTileBytes = 1024;  // one tile: 16 rows of 64 bytes
constexpr int kTileRows = 16;  // activation rows per tile
constexpr int kMeta = 16;  // records per row and super-block: kD, kCfac (and padding)
constexpr int kD = 0, kCfac = 1;

// Tiles 0-3: the int32 sums of the low and high bytes, for two blocks of 16 activation rows;
// 4/5: the two blocks' 16 rows x 64 K; 6/7: the low and high bytes of 64 K of the panel
// ([16 K / 4][16 rows x 4] bytes, VNNI order). All 16 x 64 bytes (amx::configure_full_tiles).

// Per super-block s: lo/hi[(s * kQuads + q) * 16 + r] the bytes of weights 4q..4q+3 of row r;
// corr[(s * 16 + i) * 16 + r] the bf16 pair (b_2i, b_2i+1) of row r's correction factors
// b = (coef_0..coef_15, 64 coef_0..64 coef_15); meta[(s * kMeta + i) * 16 + r] its d and cfac.
struct AmxPanel {
  std::vector<int32_t> lo, hi, corr, meta;
  alignas(64) int32_t rows_lo[16][kQuads];
  alignas(64) int32_t rows_hi[16][kQuads];
  alignas(64) int32_t rows_corr[16][16];
  alignas(64) int32_t records[16][kMeta];
};

// Small integers (|v| < 2^8 times a power of two) are bf16 values exactly: a float's top half.
inline uint16_t bf16_bits(int v) {
  const float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}


template <class Dec>
void decode_amx_panel(const uint8_t* blocks, int64_t row_bytes, int64_t k, int64_t n0,
                      int64_t rows, AmxPanel& p) {
  const int64_t nsb = k / kSuper;
  p.lo.resize(nsb * kQuads * kLanes);
  p.hi.resize(nsb * kQuads * kLanes);
  p.corr.resize(nsb * 16 * kLanes);
  p.meta.resize(nsb * kMeta * kLanes);
  if (rows < kLanes) {  // padding rows: zero weights and records, so they add nothing
    std::memset(p.rows_lo, 0, sizeof(p.rows_lo));
    std::memset(p.rows_hi, 0, sizeof(p.rows_hi));
    std::memset(p.rows_corr, 0, sizeof(p.rows_corr));
    std::memset(p.records, 0, sizeof(p.records));
  }
  for (int64_t s = 0; s < nsb; ++s) {
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* blk = blocks + (n0 + r) * row_bytes + s * Dec::kBytes;
      prefetch_blocks_ahead<Dec>(blk);
      SuperBlock sb;
      Dec::prepare(blk, &sb);
      for (int g = 0; g < 8; ++g) {  // group g: weights 32g..32g+31, runs 2g and 2g + 1
        const __m512i codes = _mm512_cvtepu8_epi16(Dec::codes(blk, g));
        const __m512i scales = _mm512_inserti64x4(_mm512_set1_epi16(sb.sc[2 * g]),
                                                  _mm256_set1_epi16(sb.sc[2 * g + 1]), 1);
        const __m512i w = _mm512_mullo_epi16(codes, scales);
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.rows_lo[r] + 8 * g), _mm512_cvtepi16_epi8(w));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.rows_hi[r] + 8 * g),
                           _mm512_cvtepi16_epi8(_mm512_srai_epi16(w, 8)));
      }
      // coef_0..15 then 64 coef_0..15 as bf16 (the top halves of the exact floats)
      const __m512 coef = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(
          _mm256_load_si256(reinterpret_cast<const __m256i*>(sb.coef))));
      const auto top_halves = [](__m512 f) {
        return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16));
      };
      _mm256_store_si256(reinterpret_cast<__m256i*>(p.rows_corr[r]), top_halves(coef));
      _mm256_store_si256(reinterpret_cast<__m256i*>(p.rows_corr[r] + 8),
                         top_halves(_mm512_mul_ps(coef, _mm512_set1_ps(64.0f))));
      int32_t* rec = p.records[r];
      rec[kD] = float_bits(sb.d);
      rec[kCfac] = float_bits(Dec::kMins ? sb.dmin : sb.d * static_cast<float>(Dec::kZero));
    }
    constexpr std::integral_constant<int, kLanes> lanes{};
    interleave_rows(&p.rows_lo[0][0], kQuads, p.lo.data() + s * kQuads * kLanes, lanes);
    interleave_rows(&p.rows_hi[0][0], kQuads, p.hi.data() + s * kQuads * kLanes, lanes);
    interleave_rows(&p.rows_corr[0][0], 16, p.corr.data() + s * 16 * kLanes, lanes);
    interleave_rows(&p.records[0][0], kMeta, p.meta.data() + s * kMeta * kLanes, lanes);
  }
}

// The activations' inputs as A tiles (activation_tiles): per block of 16 rows, for each
// super-block s, 4 tiles of int8 codes (64 K each) at code_tile(s, c), then the bf16 correction
// tile (16 x (l_0..l_15, h_0..h_15)) at corr_tile(s).
constexpr int64_t kTilesPerSuper = 5;
inline int64_t code_tile(int64_t s, int c) { return (s * kTilesPerSuper + c) * kTileBytes; }
inline int64_t corr_tile(int64_t s) { return (s * kTilesPerSuper + 4) * kTileBytes; }

// out[r * ldo + c] for `rows` (<= 16 * B) activation rows, whose A tiles are at `xa` (block 1's
// `block_bytes` further), and the panel's `cols` rows. A tile multiply-add waits on the previous
// one into the same accumulator (~50 cycles on Sapphire Rapids, against ~16 between independent
// ones), so two 16-row blocks run together: four accumulators, each B tile loaded once for both.
template <int B>
void amx_rows(const AmxPanel& p, const uint8_t* xa, int64_t block_bytes, const XRow* x, int rows,
              int64_t k, float* out, int64_t ldo, int cols) {
  static_assert(B == 1 || B == 2, "one or two blocks of 16 rows");
  const int64_t nsb = k / kSuper;
  alignas(64) int32_t sum_lo[B * kTileRows][kLanes];
  alignas(64) int32_t sum_hi[B * kTileRows][kLanes];
  alignas(64) float corr[B * kTileRows][kLanes];
  __m512 total[B * kTileRows];
  for (int r = 0; r < B * kTileRows; ++r) total[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    _tile_zero(0);  // block 0: low and high bytes' sums
    _tile_zero(1);
    if constexpr (B == 2) {
      _tile_zero(2);  // block 1
      _tile_zero(3);
    }
    const int32_t* lo = p.lo.data() + s * kQuads * kLanes;
    const int32_t* hi = p.hi.data() + s * kQuads * kLanes;
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {  // 64 K at a time: 16 dwords of the panel
      _tile_loadd(6, lo + 16 * c * kLanes, 64);
      _tile_loadd(7, hi + 16 * c * kLanes, 64);
      _tile_loadd(4, xa + code_tile(s, c), 64);
      _tile_dpbsud(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      if constexpr (B == 2) {
        _tile_loadd(5, xa + block_bytes + code_tile(s, c), 64);
        _tile_dpbsud(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
      }
    }
    _tile_stored(0, sum_lo, 64);
    _tile_stored(1, sum_hi, 64);
    _tile_zero(0);
    _tile_loadd(6, p.corr.data() + s * 16 * kLanes, 64);
    _tile_loadd(4, xa + corr_tile(s), 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (B == 2) {
      _tile_stored(2, sum_lo[kTileRows], 64);
      _tile_stored(3, sum_hi[kTileRows], 64);
      _tile_zero(2);
      _tile_loadd(5, xa + block_bytes + corr_tile(s), 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_stored(2, corr[kTileRows], 64);
    }
    _tile_stored(0, corr, 64);
    const int32_t* meta = p.meta.data() + s * kMeta * kLanes;
    const __m512 d = _mm512_loadu_ps(reinterpret_cast<const float*>(meta + kD * kLanes));
    const __m512 cf = _mm512_loadu_ps(reinterpret_cast<const float*>(meta + kCfac * kLanes));
    for (int r = 0; r < rows; ++r) {
      const __m512i isb = _mm512_add_epi32(_mm512_load_si512(sum_lo[r]),
                                           _mm512_slli_epi32(_mm512_load_si512(sum_hi[r]), 8));
      const __m512 v = _mm512_fmsub_ps(_mm512_cvtepi32_ps(isb), d,
                                       _mm512_mul_ps(_mm512_load_ps(corr[r]), cf));
      total[r] = _mm512_fmadd_ps(v, _mm512_set1_ps(x[r].d[s]), total[r]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
  for (int r = 0; r < rows; ++r) _mm512_mask_storeu_ps(out + r * ldo, mask, total[r]);
}

// The activations as A tiles (see code_tile, corr_tile), each 16 rows x 64 bytes contiguous
// (rows past m are zero). Loaded from the [M, K] matrix instead, a tile's 16 rows are k bytes
// apart, all in one or two cache sets when k is a multiple of 2048 (1.6x slower at k = 8192).
std::vector<uint8_t> activation_tiles(const Q8KRows& xq, int64_t m, int64_t k) {
  const int64_t nsb = k / kSuper;
  const int64_t blocks = (m + kTileRows - 1) / kTileRows;
  std::vector<uint8_t> tiles(blocks * nsb * kTilesPerSuper * kTileBytes, 0);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      uint8_t* dst = tiles.data() + b * nsb * kTilesPerSuper * kTileBytes;
      const int64_t rows = std::min<int64_t>(kTileRows, m - b * kTileRows);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = b * kTileRows + r;
        for (int64_t s = 0; s < nsb; ++s) {
          for (int c = 0; c < 4; ++c) {
            std::memcpy(dst + code_tile(s, c) + r * 64, xq.q.data() + row * k + s * kSuper + 64 * c, 64);
          }
          uint16_t* corr = reinterpret_cast<uint16_t*>(dst + corr_tile(s) + r * 64);
          const int16_t* bsums = xq.bsums.data() + row * (k / 16) + s * 16;
          for (int j = 0; j < 16; ++j) {
            const int h = bsums[j] >> 6;  // floor: bsum = 64 h + l with l in [0, 64)
            corr[j] = bf16_bits(bsums[j] - 64 * h);
            corr[16 + j] = bf16_bits(h);
          }
        }
      }
    }
  });
  return tiles;
}

template <class Dec>
void amx_linear(const uint8_t* blocks, int64_t row_bytes, const Q8KRows& xq, int64_t m,
                int64_t k, int64_t n, float* out) {
  const int64_t nsb = k / kSuper;
  const int64_t panels = (n + kLanes - 1) / kLanes;
  const std::vector<uint8_t> tiles = activation_tiles(xq, m, k);
  const int64_t block_bytes = nsb * kTilesPerSuper * kTileBytes;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    static thread_local AmxPanel panel;
    amx::configure_full_tiles();  // per thread, and again per call
    XRow xr[2 * kTileRows];
    for (int64_t pi = begin; pi < end; ++pi) {
      const int64_t n0 = pi * kLanes;
      const int cols = static_cast<int>(std::min<int64_t>(kLanes, n - n0));
      decode_amx_panel<Dec>(blocks, row_bytes, k, n0, cols, panel);
      for (int64_t r0 = 0; r0 < m; r0 += 2 * kTileRows) {
        const int rows = static_cast<int>(std::min<int64_t>(2 * kTileRows, m - r0));
        for (int r = 0; r < rows; ++r) {
          xr[r] = {xq.q.data() + (r0 + r) * k, xq.bsums.data() + (r0 + r) * (k / 16),
                   xq.d.data() + (r0 + r) * nsb};
        }
        const uint8_t* xa = tiles.data() + r0 / kTileRows * block_bytes;  // its blocks' tiles
        float* o = out + r0 * n + n0;
        if (rows > kTileRows) {
          amx_rows<2>(panel, xa, block_bytes, xr, rows, k, o, n, cols);
        } else {
          amx_rows<1>(panel, xa, block_bytes, xr, rows, k, o, n, cols);
        }
      }
    }
    _tile_release();
  });
}

}  // namespace

bool q8k_amx_permitted() { return amx::tile_state_permitted(); }

void q8k_amx_linear(const uint8_t* blocks, int64_t row_bytes, int64_t qtype, const Q8KRows& xq,
                    int64_t m, int64_t k, int64_t n, float* out) {
  TORCH_CHECK(q8k_amx_permitted(), "the OS did not grant the AMX tile state");
  switch (qtype) {
    case gguf::kQ3_K: amx_linear<Q8KQ3_K>(blocks, row_bytes, xq, m, k, n, out); break;
    case gguf::kQ4_K: amx_linear<Q8KQ4_K>(blocks, row_bytes, xq, m, k, n, out); break;
    case gguf::kQ5_K: amx_linear<Q8KQ5_K>(blocks, row_bytes, xq, m, k, n, out); break;
    case gguf::kQ6_K: amx_linear<Q8KQ6_K>(blocks, row_bytes, xq, m, k, n, out); break;
    default: TORCH_CHECK(false, "GGML type ", qtype, " has no Q8_K kernel");
  }
}

#else
bool q8k_amx_permitted() { return false; }

void q8k_amx_linear(const uint8_t*, int64_t, int64_t, const Q8KRows&, int64_t, int64_t, int64_t,
                    float*) {
  TORCH_CHECK(false, "this build has no AMX-INT8 kernels");
}
#endif

}  // namespace radixserve
