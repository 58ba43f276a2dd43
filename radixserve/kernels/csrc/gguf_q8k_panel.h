// Pieces shared by the Q8_K panel GEMMs (gguf_q8k_panel.cpp: vpdpbusd / maddubs over a panel
// of weight rows; gguf_q8k_amx.cpp: AMX tiles): dword transposes into the panel layout, an
// activation row's Q8_K inputs, and the compile-time row-count dispatch.
#pragma once

#include <cstring>
#include <type_traits>

#include "gguf_q8k.h"

#if defined(__AVX2__)
#include <immintrin.h>

namespace radixserve {
namespace q8k_panel {

constexpr int64_t kSuper = 256;
constexpr int64_t kQuads = kSuper / 4;  // dwords of codes per weight row and super-block

inline int32_t load_dword(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// out[q * L + r] = in[r * width + q] for q < width (a multiple of L): in-register transposes of
// L x L dwords (a scalar loop of strided dword stores was ~3x slower at small batches).
#if defined(__AVX512F__)
inline void interleave_rows(const int32_t* in, int width, int32_t* out, std::integral_constant<int, 16>) {
  for (int h = 0; h < width / 16; ++h) {
    __m512i v[16];
    for (int g = 0; g < 4; ++g) {  // 4 x 4 transposes inside each 128-bit lane
      const int32_t* src = in + 4 * g * width + 16 * h;
      const __m512i a = _mm512_load_si512(src);
      const __m512i b = _mm512_load_si512(src + width);
      const __m512i c = _mm512_load_si512(src + 2 * width);
      const __m512i e = _mm512_load_si512(src + 3 * width);
      const __m512i t0 = _mm512_unpacklo_epi32(a, b), t1 = _mm512_unpackhi_epi32(a, b);
      const __m512i t2 = _mm512_unpacklo_epi32(c, e), t3 = _mm512_unpackhi_epi32(c, e);
      v[4 * g] = _mm512_unpacklo_epi64(t0, t2);      // lane j: column 4j of rows 4g..4g+3
      v[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);  // column 4j + 1
      v[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
      v[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    for (int i = 0; i < 4; ++i) {  // then the 128-bit lanes of the four row groups
      const __m512i x0 = _mm512_shuffle_i32x4(v[i], v[4 + i], _MM_SHUFFLE(1, 0, 1, 0));
      const __m512i x1 = _mm512_shuffle_i32x4(v[i], v[4 + i], _MM_SHUFFLE(3, 2, 3, 2));
      const __m512i x2 = _mm512_shuffle_i32x4(v[8 + i], v[12 + i], _MM_SHUFFLE(1, 0, 1, 0));
      const __m512i x3 = _mm512_shuffle_i32x4(v[8 + i], v[12 + i], _MM_SHUFFLE(3, 2, 3, 2));
      int32_t* dst = out + (16 * h + i) * 16;
      _mm512_storeu_si512(dst, _mm512_shuffle_i32x4(x0, x2, _MM_SHUFFLE(2, 0, 2, 0)));
      _mm512_storeu_si512(dst + 4 * 16, _mm512_shuffle_i32x4(x0, x2, _MM_SHUFFLE(3, 1, 3, 1)));
      _mm512_storeu_si512(dst + 8 * 16, _mm512_shuffle_i32x4(x1, x3, _MM_SHUFFLE(2, 0, 2, 0)));
      _mm512_storeu_si512(dst + 12 * 16, _mm512_shuffle_i32x4(x1, x3, _MM_SHUFFLE(3, 1, 3, 1)));
    }
  }
}
#endif

inline void interleave_rows(const int32_t* in, int width, int32_t* out, std::integral_constant<int, 8>) {
  for (int h = 0; h < width / 8; ++h) {
    __m256i u[8];
    for (int g = 0; g < 2; ++g) {
      auto load = [&](int r) {
        return _mm256_load_si256(reinterpret_cast<const __m256i*>(in + (4 * g + r) * width + 8 * h));
      };
      const __m256i a = load(0), b = load(1), c = load(2), e = load(3);
      const __m256i t0 = _mm256_unpacklo_epi32(a, b), t1 = _mm256_unpackhi_epi32(a, b);
      const __m256i t2 = _mm256_unpacklo_epi32(c, e), t3 = _mm256_unpackhi_epi32(c, e);
      u[4 * g] = _mm256_unpacklo_epi64(t0, t2);  // lanes: columns 0 and 4 of rows 4g..4g+3
      u[4 * g + 1] = _mm256_unpackhi_epi64(t0, t2);
      u[4 * g + 2] = _mm256_unpacklo_epi64(t1, t3);
      u[4 * g + 3] = _mm256_unpackhi_epi64(t1, t3);
    }
    for (int i = 0; i < 4; ++i) {
      int32_t* dst = out + (8 * h + i) * 8;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permute2x128_si256(u[i], u[4 + i], 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 4 * 8), _mm256_permute2x128_si256(u[i], u[4 + i], 0x31));
    }
  }
}

inline int32_t float_bits(float f) {
  int32_t v;
  std::memcpy(&v, &f, 4);
  return v;
}

// One activation row's inputs: its int8 codes, per-16 sums and per-256 scales.
struct XRow {
  const int8_t* q;
  const int16_t* bsums;
  const float* d;
};

// Calls f(std::integral_constant<int, R>{}) for R = rows (1 to kMax).
template <int kMax, class F>
void with_rows(int64_t rows, F&& f) {
  if constexpr (kMax == 1) {
    f(std::integral_constant<int, 1>{});
  } else {
    if (rows >= kMax) {
      f(std::integral_constant<int, kMax>{});
    } else {
      with_rows<kMax - 1>(rows, f);
    }
  }
}

// A panel's L weight rows are L streams from memory, too many for the hardware prefetcher at
// small batches (where decoding is most of a panel's time): each asks for its super-block a few
// blocks ahead as it is decoded.
constexpr int64_t kPrefetchBlocks = 4;

template <class Dec>
inline void prefetch_blocks_ahead(const uint8_t* blk) {
  const char* ahead = reinterpret_cast<const char*>(blk) + kPrefetchBlocks * Dec::kBytes;
  for (int64_t i = 0; i < Dec::kBytes; i += 64) _mm_prefetch(ahead + i, _MM_HINT_T0);
}

}  // namespace q8k_panel
}  // namespace radixserve
#endif
