// Few-row GGUF integer matmul for Q4_1 and Q8_0 (speculative verify, decode batches of 2-11) on
// 512-bit vectors. The 256-bit per-row kernel (gguf_gemm.cpp, dot_rows_q4_1) spends ~7 vector
// instructions per row and block (two madds, an add, a convert, the scale product, two FMAs),
// and its 8-row verify cost ~4x a one-row decode step on a Xeon. Here each vector carries two
// rows, one per 256-bit half, with the weight block duplicated into both halves once per block:
// half the instructions per row for the same per-lane arithmetic. Every lane computes exactly
// what the same lane of the 256-bit kernel computes (the same int32 sums, d * scale rounded the
// same way, the same FMA chain over blocks, the same final horizontal sum of 8 lanes), so the
// result is bitwise that of a row alone (tests/unit/test_gguf_block_types.py).
#include "gguf_paired_rows.h"

#include <algorithm>

#include "common.h"
#include "gguf_blocks.h"

namespace radixserve {

using gguf::kBlock;
using gguf::kQ4_1;
using gguf::kQ4_1Bytes;
using gguf::kQ8_0Bytes;

namespace {
// 16 rows: eight accumulators and one offset vector (a verify of 8 drafts and its root is one
// tile: with tiles of 8 rows the ninth row cost a third of the first eight, the weight block's
// unpacking and scales being shared by fewer rows).
constexpr int64_t kPairsPerTile = 8;
constexpr int64_t kTileRows = 2 * kPairsPerTile;
// The weights stream from memory once (the first tile; later tiles find the row in L1), and the
// hardware prefetcher alone did not keep up: 30 layers of SmolLM2-135M's Q4_1 matmuls at 2 rows
// ran 2.7x slower from memory than from cache. Each block asks for the bytes 4 KiB ahead (on
// two threads, 9 rows: 11.4-12.3 ms for those 30 layers at 4 KiB, 14.5 at 8 KiB; 2 and 8 rows
// within noise).
constexpr int64_t kPrefetchBytes = 4096;
}  // namespace

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)

bool paired_rows_available() { return true; }

void pair_rows(const QuantizedRows& xq, int64_t m, int64_t k, PairedRows& out) {
  const int64_t nb = k / kBlock, pairs = (m + 1) / 2;
  const int64_t tiles = (m + kTileRows - 1) / kTileRows;
  out.rows = m;
  out.k = k;
  out.x.assign(pairs * nb * 64, 0);
  out.scale.assign(pairs * nb * 16, 0.0f);
  out.sum.assign(tiles * nb * kTileRows, 0.0f);
  for (int64_t r = 0; r < m; ++r) {
    const int64_t p = r / 2, half = r % 2, tile = r / kTileRows, lane = r % kTileRows;
    for (int64_t b = 0; b < nb; ++b) {
      const int16_t* src = xq.q.data() + r * k + b * kBlock;
      int16_t* dst = out.x.data() + (p * nb + b) * 64 + half * 16;
      std::copy(src, src + 16, dst);
      std::copy(src + 16, src + 32, dst + 32);
      std::fill_n(out.scale.data() + (p * nb + b) * 16 + half * 8, 8, xq.scale[r * nb + b]);
      out.sum[(tile * nb + b) * kTileRows + lane] = xq.sum[r * nb + b];
    }
  }
}

namespace {

// int32 sums of two 16-value halves against the duplicated weight halves: one VNNI
// instruction each where the CPU has it (the same wrapping sums as madd + add).
inline __m512i block_sums(__m512i w_lo, __m512i w_hi, const int16_t* x) {
  const __m512i x_lo = _mm512_loadu_si512(x);
  const __m512i x_hi = _mm512_loadu_si512(x + 32);
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), w_lo, x_lo), w_hi, x_hi);
#else
  return _mm512_add_epi32(_mm512_madd_epi16(w_lo, x_lo), _mm512_madd_epi16(w_hi, x_hi));
#endif
}

// Q4_1's 16 nibble bytes as [values 0..15 | values 0..15] and [16..31 | 16..31] in int16: the
// 256-bit kernel's spread (bytes 0..7 to one 128-bit lane, 8..15 to the next) in both halves.
inline void unpack_q4_pair(const uint8_t* qs, __m512i* lo16, __m512i* hi16) {
  const __m512i spread = _mm512_set_epi8(
      -1, 15, -1, 14, -1, 13, -1, 12, -1, 11, -1, 10, -1, 9, -1, 8, -1, 7, -1, 6, -1, 5, -1, 4,
      -1, 3, -1, 2, -1, 1, -1, 0, -1, 15, -1, 14, -1, 13, -1, 12, -1, 11, -1, 10, -1, 9, -1, 8,
      -1, 7, -1, 6, -1, 5, -1, 4, -1, 3, -1, 2, -1, 1, -1, 0);
  const __m512i bytes = _mm512_shuffle_epi8(
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))), spread);
  *lo16 = _mm512_and_si512(bytes, _mm512_set1_epi16(0x0F));
  *hi16 = _mm512_srli_epi16(bytes, 4);
}

inline void unpack_q8_pair(const uint8_t* qs, __m512i* lo16, __m512i* hi16) {
  const __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m256i hi =
      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16)));
  *lo16 = _mm512_inserti64x4(_mm512_castsi256_si512(lo), lo, 1);
  *hi16 = _mm512_inserti64x4(_mm512_castsi256_si512(hi), hi, 1);
}

// One weight row against the P pairs of one tile. Accumulators are named (RS_PAIR) so they
// stay in registers (see dot_rows_q4_1).
template <int P, bool kQ4, bool kPrefetch>
void tile_dot(const uint8_t* wrow, const PairedRows& xp, int64_t tile, float* out_col,
              int64_t n) {
  const int64_t k = xp.k, nb = k / kBlock;
  const int64_t p0 = tile * kPairsPerTile;
  const int16_t* x = xp.x.data() + p0 * nb * 64;
  const float* scale = xp.scale.data() + p0 * nb * 16;
  const float* sum = xp.sum.data() + tile * nb * kTileRows;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc4 = acc0,
         acc5 = acc0, acc6 = acc0, acc7 = acc0;
  __m512 off = acc0;  // per row of the tile: m * sum(x), the FMA chain of lane 0
  for (int64_t b = 0; b < nb; ++b) {
    __m512i w_lo, w_hi;
    __m512 d;
    if constexpr (kPrefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(wrow + b * (kQ4 ? kQ4_1Bytes : kQ8_0Bytes)) +
                       kPrefetchBytes,
                   _MM_HINT_T0);
    }
    if constexpr (kQ4) {
      const uint8_t* blk = wrow + b * kQ4_1Bytes;
      d = _mm512_set1_ps(gguf::half_to_float(blk));
      off = _mm512_fmadd_ps(_mm512_set1_ps(gguf::half_to_float(blk + 2)),
                            _mm512_loadu_ps(sum + b * kTileRows), off);
      unpack_q4_pair(blk + 4, &w_lo, &w_hi);
    } else {
      const uint8_t* blk = wrow + b * kQ8_0Bytes;
      d = _mm512_set1_ps(gguf::half_to_float(blk));
      unpack_q8_pair(blk + 2, &w_lo, &w_hi);
    }
#define RS_PAIR(i)                                                                         \
  if constexpr (P > i) {                                                                   \
    const __m512 part = _mm512_cvtepi32_ps(block_sums(w_lo, w_hi, x + (i * nb + b) * 64)); \
    acc##i = _mm512_fmadd_ps(part, _mm512_mul_ps(d, _mm512_loadu_ps(scale + (i * nb + b) * 16)), \
                             acc##i);                                                      \
  }
    RS_PAIR(0) RS_PAIR(1) RS_PAIR(2) RS_PAIR(3) RS_PAIR(4) RS_PAIR(5) RS_PAIR(6) RS_PAIR(7)
#undef RS_PAIR
  }
  alignas(64) float offs[kTileRows];
  _mm512_store_ps(offs, off);
  const __m512 accs[kPairsPerTile] = {acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7};
  const int64_t rows = std::min<int64_t>(kTileRows, xp.rows - tile * kTileRows);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 acc = accs[r / 2];
    const __m256 half = r % 2 == 0 ? _mm512_castps512_ps256(acc) : _mm512_extractf32x8_ps(acc, 1);
    // The 256-bit kernel's result: hsum of its 8 lanes, plus lane 0 of its offset chain
    // (Q8_0 has no offset: it adds nothing, as that kernel does).
    out_col[r * n] = kQ4 ? gguf::hsum(half) + offs[r] : gguf::hsum(half);
  }
}

// One tile of `pairs` pairs (1..kPairsPerTile) against one weight row.
template <bool kQ4, bool kPrefetch>
void run_tile(int64_t pairs, const uint8_t* wrow, const PairedRows& xp, int64_t tile, float* o,
              int64_t n) {
  switch (pairs) {
    case 1: tile_dot<1, kQ4, kPrefetch>(wrow, xp, tile, o, n); break;
    case 2: tile_dot<2, kQ4, kPrefetch>(wrow, xp, tile, o, n); break;
    case 3: tile_dot<3, kQ4, kPrefetch>(wrow, xp, tile, o, n); break;
    case 4: tile_dot<4, kQ4, kPrefetch>(wrow, xp, tile, o, n); break;
    case 5: tile_dot<5, kQ4, kPrefetch>(wrow, xp, tile, o, n); break;
    case 6: tile_dot<6, kQ4, kPrefetch>(wrow, xp, tile, o, n); break;
    case 7: tile_dot<7, kQ4, kPrefetch>(wrow, xp, tile, o, n); break;
    default: tile_dot<8, kQ4, kPrefetch>(wrow, xp, tile, o, n); break;
  }
}

template <bool kQ4>
void columns(const uint8_t* w, int64_t row_bytes, const PairedRows& xp, float* out, int64_t n,
             int64_t begin, int64_t end) {
  const int64_t pairs = (xp.rows + 1) / 2;
  const int64_t tiles = (xp.rows + kTileRows - 1) / kTileRows;
  for (int64_t col = begin; col < end; ++col) {
    const uint8_t* wrow = w + col * row_bytes;
    for (int64_t tile = 0; tile < tiles; ++tile) {
      float* o = out + tile * kTileRows * n + col;
      const int64_t tile_pairs = std::min(kPairsPerTile, pairs - tile * kPairsPerTile);
      // Only the first tile streams the row from memory; later ones find it in L1.
      if (tile == 0) {
        run_tile<kQ4, true>(tile_pairs, wrow, xp, tile, o, n);
      } else {
        run_tile<kQ4, false>(tile_pairs, wrow, xp, tile, o, n);
      }
    }
  }
}

}  // namespace

void paired_dot_columns(const uint8_t* w, int64_t row_bytes, int64_t qtype, const PairedRows& xp,
                        float* out, int64_t n, int64_t begin, int64_t end) {
  if (qtype == kQ4_1) {
    columns<true>(w, row_bytes, xp, out, n, begin, end);
  } else {
    columns<false>(w, row_bytes, xp, out, n, begin, end);
  }
}

#else

bool paired_rows_available() { return false; }

void pair_rows(const QuantizedRows&, int64_t, int64_t, PairedRows&) {
  TORCH_CHECK(false, "the paired-row GGUF kernel needs AVX512BW");
}

void paired_dot_columns(const uint8_t*, int64_t, int64_t, const PairedRows&, float*, int64_t,
                        int64_t, int64_t) {
  TORCH_CHECK(false, "the paired-row GGUF kernel needs AVX512BW");
}

#endif

}  // namespace radixserve
