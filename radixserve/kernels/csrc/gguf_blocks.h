// GGUF block layout and the small helpers both GGUF matmuls (gguf_gemm.cpp: integer path,
// gguf_gemm_tiled.cpp: float tiles) read it with.
#pragma once

#include "common.h"
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace radixserve {
namespace gguf {

constexpr int64_t kBlock = 32;      // weights per block
constexpr int64_t kQ4_1Bytes = 20;  // fp16 d, fp16 m, 16 bytes of nibbles
constexpr int64_t kQ8_0Bytes = 34;  // fp16 d, 32 int8
constexpr int64_t kQ4_1 = 3;        // GGML type ids
constexpr int64_t kQ8_0 = 8;

// The fp16 scale stored at p.
inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

#if defined(__AVX2__)
// Sum of the 8 lanes.
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
#endif

}  // namespace gguf
}  // namespace radixserve
