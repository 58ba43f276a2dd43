// The K-quant decoders of the Q8_K kernels, shared by the per-row dot products (gguf_q8k.cpp)
// and the row-panel GEMM (gguf_q8k_panel.cpp): prepare() reads a super-block's scales as
// integers (SuperBlock), its float factors and zero point; codes(g) gives group g's
// 32 weight codes as unsigned bytes (at most kMaxCode <= 63, so maddubs pairs never saturate);
// kSub is how many consecutive weights share one integer scale.
#pragma once

#include <cstring>

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

#if defined(__AVX512BW__)
// codes(2j) and codes(2j + 1) as one 512-bit vector (the 512-bit kernels' step): the generic
// form joins two 256-bit decodes; Q4_K, Q5_K and Q6_K decode both groups at once from the same
// bytes (the same codes in the same lanes, in fewer instructions: at 1-2 activation rows, as MoE
// experts get at batch 8, decoding was about half the kernel's vector work).
template <class Dec>
inline __m512i joined_codes(const uint8_t* b, int j) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(Dec::codes(b, 2 * j)), Dec::codes(b, 2 * j + 1),
                            1);
}

inline __m512i broadcast32(const uint8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 32 bytes' low nibbles in the lower half, their high nibbles in the upper half.
inline __m512i nibble_halves(const uint8_t* p) {
  const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  return _mm512_and_si512(_mm512_srlv_epi16(broadcast32(p), shift), _mm512_set1_epi8(0x0F));
}
#endif

// A super-block's integer scales per run of 16 weights (Q4_K/Q5_K: each group's scale twice)
// and the coefficients of its correction term per run of 16 (Q4_K/Q5_K: the group's min, taken
// with dmin; Q6_K/Q3_K: the scale again, taken with d * zero point), as int16 vectors: the
// correction is then one madd with the activation's per-16 sums.
struct SuperBlock {
  alignas(32) int16_t sc[16];
  alignas(32) int16_t coef[16];
  float d, dmin;
};

// Q4_K/Q5_K's 12 bytes of 6-bit scales and mins, four at a time in 32-bit words: scales 0-3
// and mins 0-3 are the low 6 bits of bytes 0-3 and 4-7; scales and mins 4-7 take their low 4
// bits from bytes 8-11 (low and high nibble) and their top 2 from the top bits of bytes 0-3 and
// 4-7. One word operation per four values instead of a branchy byte loop (which made the
// scalar part of a super-block ~half of a batch-1 GEMV's instructions).
inline void prepare_k(const uint8_t* b, SuperBlock* sb) {
  uint32_t w[3];
  std::memcpy(w, b + 4, 12);
  constexpr uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, low2 = 0x03030303u;
  const uint64_t scales =
      (w[0] & low6) | static_cast<uint64_t>((w[2] & low4) | (((w[0] >> 6) & low2) << 4)) << 32;
  const uint64_t mins =
      (w[1] & low6) | static_cast<uint64_t>(((w[2] >> 4) & low4) | (((w[1] >> 6) & low2) << 4))
                          << 32;
  // each byte twice (one per run of 16), widened to int16
  const __m128i sc8 = _mm_cvtsi64_si128(static_cast<int64_t>(scales));
  const __m128i mn8 = _mm_cvtsi64_si128(static_cast<int64_t>(mins));
  _mm256_store_si256(reinterpret_cast<__m256i*>(sb->sc), _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc8, sc8)));
  _mm256_store_si256(reinterpret_cast<__m256i*>(sb->coef), _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8)));
  sb->d = half_to_float(b);
  sb->dmin = half_to_float(b + 2);
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
#if defined(__AVX512BW__)
  // groups 2j and 2j + 1 are the low and high nibbles of the same 32 bytes
  static __m512i codes64(const uint8_t* b, int j) { return nibble_halves(b + 16 + 32 * j); }
#endif
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
#if defined(__AVX512BW__)
  static __m512i codes64(const uint8_t* b, int j) {
    // bit 2j of each high-bit byte for the lower half, bit 2j + 1 for the upper
    const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * j))),
                                            _mm256_set1_epi8(static_cast<char>(1 << (2 * j + 1))), 1);
    const __mmask64 set = _mm512_test_epi8_mask(broadcast32(b + 16), bits);
    return _mm512_or_si512(nibble_halves(b + 48 + 32 * j),
                           _mm512_maskz_mov_epi8(set, _mm512_set1_epi8(16)));
  }
#endif
};

struct Q8KQ6_K {
  static constexpr int kSub = 16;      // weights per integer scale
  static constexpr int kMaxCode = 63;  // largest code
  static constexpr int64_t kBytes = 210;
  static constexpr int kZero = 32;
  static constexpr bool kMins = false;
  static void prepare(const uint8_t* b, SuperBlock* sb) {
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(sb->sc), sc);
    _mm256_store_si256(reinterpret_cast<__m256i*>(sb->coef), sc);
    sb->d = half_to_float(b + 208);
    sb->dmin = 0.0f;
  }
  static __m256i codes(const uint8_t* b, int g) {
    const __m256i low = nibbles32(b + 64 * (g / 4) + 32 * (g % 2), 4 * ((g % 4) / 2));
    const __m256i high = _mm256_and_si256(
        _mm256_srli_epi16(load32(b + 128 + 32 * (g / 4)), 2 * (g % 4)), _mm256_set1_epi8(3));
    return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
  }
#if defined(__AVX512BW__)
  static __m512i codes64(const uint8_t* b, int j) {
    // groups 2j and 2j + 1: low nibbles from 64 consecutive bytes, one shift for both; high
    // bits from the same 32 bytes, shifted by 2 (2j % 4) and 2 (2j % 4) + 2
    const int low_shift = 4 * (j % 2), high_shift = 2 * ((2 * j) % 4);
    const __m512i low = _mm512_and_si512(
        _mm512_srli_epi16(_mm512_loadu_si512(b + 64 * (j / 2)), low_shift), _mm512_set1_epi8(0x0F));
    const __m512i shifts = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(high_shift)),
                                              _mm256_set1_epi16(static_cast<int16_t>(high_shift + 2)), 1);
    const __m512i high = _mm512_and_si512(_mm512_srlv_epi16(broadcast32(b + 128 + 32 * (j / 2)), shifts),
                                          _mm512_set1_epi8(3));
    return _mm512_or_si512(low, _mm512_slli_epi16(high, 4));
  }
#endif
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
    std::memcpy(sb->coef, sb->sc, sizeof(sb->coef));
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
#if defined(__AVX512BW__)
  static __m512i codes64(const uint8_t* b, int j) { return joined_codes<Q8KQ3_K>(b, j); }
#endif
};

}  // namespace q8k
}  // namespace radixserve
#endif
