// What both layouts of the AMX-BF16 GGUF matmul share (gguf_gemm_amx.cpp: 17 rows or more,
// gguf_gemm_amx_few.cpp: up to 16): the tile shapes, aligned buffers, and weight rows dequantized
// to bf16 in order.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf_blocks.h"
#include "tile_output.h"

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__) && \
    defined(__AVX512BW__)
#define RS_GGUF_AMX_BF16 1
#endif

#if defined(RS_GGUF_AMX_BF16)
#include <immintrin.h>

namespace radixserve {
namespace amx_rows {

using gguf::half_to_float;
using gguf::kQ4_1;
using gguf::kQ4_1Bytes;
using gguf::kQ8_0Bytes;

constexpr int kLanes = 16;      // weight rows per panel: one fp32 C tile row
constexpr int kTileRows = 16;   // activation rows per A tile
constexpr int64_t kStepK = 32;  // K per tile product: 16 pairs of bf16

// `v` resized to `dwords` (plus room to align) and its first 64-byte aligned dword: the
// transposes' vector loads and stores want alignment (the tile loads do not).
inline int32_t* aligned64(std::vector<int32_t>& v, int64_t dwords) {
  v.resize(dwords + kLanes);
  return reinterpret_cast<int32_t*>((reinterpret_cast<uintptr_t>(v.data()) + 63) &
                                    ~uintptr_t{63});
}

// Weights 32b..32b+31 of one row as 32 bf16 in order (16 dwords of pairs, k even in the low
// half); dst is 64-byte aligned.
inline void dequantize_pairs(const uint8_t* row, int64_t qtype, int64_t b, int32_t* dst) {
  __m512 lo, hi;  // weights 0..15 and 16..31 of the block
  if (qtype == kQ4_1) {
    // A nibble has 16 values: bf16(d * q + m) for each, then one word permute looks the 32
    // weights up (the same fp32 fma and rounding as converting each weight, fewer instructions).
    const uint8_t* blk = row + b * kQ4_1Bytes;
    const __m512 nibbles = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 table = _mm512_fmadd_ps(_mm512_set1_ps(half_to_float(blk)), nibbles,
                                         _mm512_set1_ps(half_to_float(blk + 2)));
    const __m512i values = _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(table));
    // The 16 bytes in both halves (a broadcast load, no shuffle), widened to words; the low
    // nibbles are weights 0..15 and the high ones 16..31, so the upper 16 words shift by 4.
    // (Shuffles share one port: inserting the halves took a second one per block.)
    const __m256i raw = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4)));
    const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i index = _mm512_and_si512(
        _mm512_srlv_epi16(_mm512_cvtepu8_epi16(raw), shifts),
        _mm512_set1_epi16(0x0F));  // weight i's nibble
    _mm512_store_si512(dst, _mm512_permutexvar_epi16(index, values));
    return;
  } else {
    const uint8_t* blk = row + b * kQ8_0Bytes;
    const __m512 d = _mm512_set1_ps(half_to_float(blk));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
    lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)));
    hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)));
  }
  // Round to nearest even; element i < 16 from `lo`.
  _mm512_store_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

// The bytes read ahead of the block being dequantized: a panel's 16 rows are one contiguous run
// of the file, read in order, but at ~200 cycles of arithmetic per KiB the hardware prefetcher
// alone left the loads waiting on memory (most of the LM head's time at 64 rows).
constexpr int64_t kPrefetchBytes = 2048;

// Weight rows n0 .. n0 + rows - 1 as bf16, in order, into `rows_buf` ([16][K / 2] dwords,
// 64-byte aligned); rows past `rows` are zero. Row by row reads the weights sequentially (block
// by block across the 16 rows was 16 strided streams).
inline void dequantize_rows(const uint8_t* wp, int64_t row_bytes, int64_t qtype, int64_t k, int64_t n0,
                     int rows, int32_t* rows_buf) {
  const int64_t nb = k / kStepK, width = k / 2;
  if (rows < kLanes) std::memset(rows_buf + rows * width, 0, (kLanes - rows) * width * 4);
  const int64_t block_bytes = qtype == kQ4_1 ? kQ4_1Bytes : kQ8_0Bytes;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = wp + (n0 + r) * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      _mm_prefetch(reinterpret_cast<const char*>(row + b * block_bytes) + kPrefetchBytes,
                   _MM_HINT_T0);
      dequantize_pairs(row, qtype, b, rows_buf + r * width + b * kLanes);
    }
  }
}

// C tiles 0 .. N-1 zeroed: the accumulators of a pass over N panels or row blocks.
template <int N>
inline void zero_c_tiles() {
  static_assert(N >= 1 && N <= 4, "C tiles 0-3");
  _tile_zero(0);
  if constexpr (N > 1) _tile_zero(1);
  if constexpr (N > 2) _tile_zero(2);
  if constexpr (N > 3) _tile_zero(3);
}

// At most this many rows take amx_linear_few.
constexpr int64_t kFewRowsMax = kTileRows;

// out = x [m <= 16, K] (bf16, rows ldx apart) times the Q4_1/Q8_0 weight rows [n, K]
// (gguf_gemm_amx_few.cpp).
void amx_linear_few(const uint16_t* xp, int64_t ldx, int64_t m, int64_t k, const uint8_t* wp,
                    int64_t row_bytes, int64_t qtype, int64_t n, const Output& out);

}  // namespace amx_rows
}  // namespace radixserve
#endif
