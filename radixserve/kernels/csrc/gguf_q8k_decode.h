// The K-quant decoders of the Q8_K kernels, shared by the per-row dot products (gguf_q8k.cpp)
// and the row-panel GEMM (gguf_q8k_panel.cpp): prepare() reads a super-block's scales as
// integers (sc: one per 16 weights), its float factors and zero point; codes(g) gives group g's
// 32 weight codes as unsigned bytes (at most kMaxCode <= 63, so maddubs pairs never saturate);
// kSub is how many consecutive weights share one integer scale.
#pragma once

#include "gguf_blocks.h"

#if defined(__AVX2__)
#include <immintrin.h>

namespace radixserve {
namespace q8k {

using gguf::half_to_float;

inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline __m256i nibbles32(const uint8_t* p, int shift) {
  return _mm256_and_si256(_mm256_srli_epi16(load32(p), shift), _mm256_set1_epi8(0x0F));
}
inline __m256i bit_set(__m256i v, int bit) {
  const __m256i m = _mm256_set1_epi8(static_cast<char>(1 << bit));
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m);
}

struct SuperBlock {
  int16_t sc[16];
  int mins[8];
  float d, dmin;
};

inline void k_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

inline void prepare_k(const uint8_t* b, SuperBlock* sb) {
  sb->d = half_to_float(b);
  sb->dmin = half_to_float(b + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    k_scale_min(b + 4, j, &sc, &mn);
    sb->sc[2 * j] = sb->sc[2 * j + 1] = static_cast<int16_t>(sc);
    sb->mins[j] = mn;
  }
}

struct Q8KQ4_K {
  static constexpr int kSub = 32;      // weights per integer scale
  static constexpr int kMaxCode = 15;  // largest code
  static constexpr int64_t kBytes = 144;
  static constexpr int kZero = 0;
  static constexpr bool kMins = true;
  static void prepare(const uint8_t* b, SuperBlock* sb) { prepare_k(b, sb); }
  static __m256i codes(const uint8_t* b, int g) {
    return nibbles32(b + 16 + 32 * (g / 2), 4 * (g % 2));
  }
};

struct Q8KQ5_K {
  static constexpr int kSub = 32;      // weights per integer scale
  static constexpr int kMaxCode = 31;  // largest code
  static constexpr int64_t kBytes = 176;
  static constexpr int kZero = 0;
  static constexpr bool kMins = true;
  static void prepare(const uint8_t* b, SuperBlock* sb) { prepare_k(b, sb); }
  static __m256i codes(const uint8_t* b, int g) {
    const __m256i low = nibbles32(b + 48 + 32 * (g / 2), 4 * (g % 2));
    const __m256i high = _mm256_and_si256(bit_set(load32(b + 16), g), _mm256_set1_epi8(16));
    return _mm256_or_si256(low, high);
  }
};

struct Q8KQ6_K {
  static constexpr int kSub = 16;      // weights per integer scale
  static constexpr int kMaxCode = 63;  // largest code
  static constexpr int64_t kBytes = 210;
  static constexpr int kZero = 32;
  static constexpr bool kMins = false;
  static void prepare(const uint8_t* b, SuperBlock* sb) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int s = 0; s < 16; ++s) sb->sc[s] = sc[s];
    sb->d = half_to_float(b + 208);
    sb->dmin = 0.0f;
  }
  static __m256i codes(const uint8_t* b, int g) {
    const __m256i low = nibbles32(b + 64 * (g / 4) + 32 * (g % 2), 4 * ((g % 4) / 2));
    const __m256i high = _mm256_and_si256(
        _mm256_srli_epi16(load32(b + 128 + 32 * (g / 4)), 2 * (g % 4)), _mm256_set1_epi8(3));
    return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
  }
};

struct Q8KQ3_K {
  static constexpr int kSub = 16;      // weights per integer scale
  static constexpr int kMaxCode = 7;  // largest code
  static constexpr int64_t kBytes = 110;
  static constexpr int kZero = 4;
  static constexpr bool kMins = false;
  static void prepare(const uint8_t* b, SuperBlock* sb) {
    const uint8_t* s = b + 96;
    for (int i = 0; i < 16; ++i) {
      const int low = i < 8 ? (s[i] & 0x0F) : (s[i - 8] >> 4);
      const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
      sb->sc[i] = static_cast<int16_t>((low | (high << 4)) - 32);
    }
    sb->d = half_to_float(b + 108);
    sb->dmin = 0.0f;
  }
  static __m256i codes(const uint8_t* b, int g) {
    // q + 4: the 2-bit low part plus 4 where the high-mask bit is set
    const __m256i low = _mm256_and_si256(
        _mm256_srli_epi16(load32(b + 32 + 32 * (g / 4)), 2 * (g % 4)), _mm256_set1_epi8(3));
    const __m256i high = _mm256_and_si256(bit_set(load32(b), g), _mm256_set1_epi8(4));
    return _mm256_or_si256(low, high);
  }
};

}  // namespace q8k
}  // namespace radixserve
#endif
