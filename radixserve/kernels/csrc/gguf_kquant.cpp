// Integer matmuls on the GGUF block types of real files (see gguf_kquant.h): each type is a
// decoder (a group of 32 weights -> int16 codes, scale a and offset o) and one templated dot
// kernel multiplies decoded groups with int16 activation blocks: per group and activation row,
// two madd_epi16 give exact int32 sums, scaled by a * (activation block scale), plus o * (the
// block's exact float sum) where the type has offsets. The block layouts are llama.cpp's (and
// gguf-py's dequantizers, which kernels/gguf_dequant.py follows and the tests compare with).
#include "gguf_kquant.h"

#include <cmath>

#include "gguf_blocks.h"

namespace radixserve {
namespace gguf {
namespace {

constexpr int64_t kGroup = 32;

#if defined(__AVX2__)
// IQ4_NL / IQ4_XS's 16 code values.
inline __m128i iq4_table() {
  return _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
}

// MXFP4's 16 FP4 E2M1 code values doubled (ggml's kvalues_mxfp4: 0, 0.5, 1, 1.5, 2, 3, 4, 6
// times 2, then negated for codes 8-15), so they are integers; the block scale is halved to match.
inline __m128i mxfp4_table() {
  return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

// 16 bytes of nibbles -> 16 low nibbles (weights 0..15) and 16 high ones (16..31), as bytes.
inline void split_nibbles16(const uint8_t* qs, __m128i* low, __m128i* high) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  *low = _mm_and_si128(raw, mask);
  *high = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
}

// The 32 one-bit high parts of Q5_0/Q5_1 (bit i of the little-endian word = weight i), as 0 or
// 16 in int16 lanes: weights 0..15 in lo, 16..31 in hi.
inline void high_bits_q5(const uint8_t* qh_bytes, __m256i* lo, __m256i* hi) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                        8192, 16384, -32768);
  const __m256i sixteen = _mm256_set1_epi16(16);
  const __m256i l = _mm256_set1_epi16(static_cast<int16_t>(qh & 0xFFFF));
  const __m256i h = _mm256_set1_epi16(static_cast<int16_t>(qh >> 16));
  *lo = _mm256_and_si256(_mm256_cmpeq_epi16(_mm256_and_si256(l, bit), bit), sixteen);
  *hi = _mm256_and_si256(_mm256_cmpeq_epi16(_mm256_and_si256(h, bit), bit), sixteen);
}

// 32 bytes -> (bytes 0..15, bytes 16..31) widened to int16, unsigned or signed.
inline void widen_u8(__m256i v, __m256i* lo, __m256i* hi) {
  *lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v));
  *hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1));
}
inline void widen_i8(__m256i v, __m256i* lo, __m256i* hi) {
  *lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
  *hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
}

// Byte i of the result: 0xFF where bit `bit` of byte i of v is set.
inline __m256i bit_set(__m256i v, int bit) {
  const __m256i m = _mm256_set1_epi8(static_cast<char>(1 << bit));
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m);
}

inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 32 bytes with each byte's nibble at `shift` (0 or 4).
inline __m256i nibbles32(const uint8_t* p, int shift) {
  return _mm256_and_si256(_mm256_srli_epi16(load32(p), shift), _mm256_set1_epi8(0x0F));
}

// ---- decoders: kGroups groups of 32 per block of kBytes; scales(a, o) once per block, then
// codes(g) per group.

// Blocks of 32 with one fp16 scale d at byte 0 and no offset (Q4_0, Q5_0, IQ4_NL).
template <int64_t Bytes>
struct ScaleOnly {
  static constexpr int64_t kGroups = 1, kBytes = Bytes;
  static constexpr bool kOffset = false;
  static void scales(const uint8_t* b, float* a, float* o) {
    a[0] = half_to_float(b);
    o[0] = 0.0f;
  }
};

// Super-blocks of 256 whose fp16 scale d at byte DAt applies to every group, the sub-block
// scales being folded into the codes (Q3_K, Q6_K).
template <int64_t Bytes, int64_t DAt>
struct SuperScale {
  static constexpr int64_t kGroups = 8, kBytes = Bytes;
  static constexpr bool kOffset = false;
  static void scales(const uint8_t* b, float* a, float* o) {
    const float d = half_to_float(b + DAt);
    for (int j = 0; j < 8; ++j) a[j] = d, o[j] = 0.0f;
  }
};

struct DecQ4_0 : ScaleOnly<18> {
  static void codes(const uint8_t* b, int, __m256i* lo, __m256i* hi) {
    __m128i l, h;
    split_nibbles16(b + 2, &l, &h);
    const __m256i eight = _mm256_set1_epi16(8);
    *lo = _mm256_sub_epi16(_mm256_cvtepu8_epi16(l), eight);
    *hi = _mm256_sub_epi16(_mm256_cvtepu8_epi16(h), eight);
  }
};

struct DecQ5_0 : ScaleOnly<22> {
  static void codes(const uint8_t* b, int, __m256i* lo, __m256i* hi) {
    __m128i l, h;
    split_nibbles16(b + 6, &l, &h);
    __m256i bl, bh;
    high_bits_q5(b + 2, &bl, &bh);
    const __m256i sixteen = _mm256_set1_epi16(16);
    *lo = _mm256_sub_epi16(_mm256_or_si256(_mm256_cvtepu8_epi16(l), bl), sixteen);
    *hi = _mm256_sub_epi16(_mm256_or_si256(_mm256_cvtepu8_epi16(h), bh), sixteen);
  }
};

struct DecQ5_1 {
  static constexpr int64_t kGroups = 1, kBytes = 24;
  static constexpr bool kOffset = true;
  static void scales(const uint8_t* b, float* a, float* o) {
    a[0] = half_to_float(b);
    o[0] = half_to_float(b + 2);
  }
  static void codes(const uint8_t* b, int, __m256i* lo, __m256i* hi) {
    __m128i l, h;
    split_nibbles16(b + 8, &l, &h);
    __m256i bl, bh;
    high_bits_q5(b + 4, &bl, &bh);
    *lo = _mm256_or_si256(_mm256_cvtepu8_epi16(l), bl);
    *hi = _mm256_or_si256(_mm256_cvtepu8_epi16(h), bh);
  }
};

struct DecIQ4_NL : ScaleOnly<18> {
  static void codes(const uint8_t* b, int, __m256i* lo, __m256i* hi) {
    __m128i l, h;
    split_nibbles16(b + 2, &l, &h);
    *lo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(iq4_table(), l));
    *hi = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(iq4_table(), h));
  }
};

// E8M0 scale byte e -> 2 ** (e - 128), i.e. half the block's scale 2 ** (e - 127) (the codes
// are doubled), built from the float's bits as ggml does: exact, the subnormal results of
// e < 2 included, and no libm call per block.
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ggml's block_mxfp4 (gpt-oss experts): the E8M0 byte, then 16 bytes whose low nibbles are
// weights 0..15 and high nibbles 16..31 (IQ4_NL's order, another table and scale). Codes are at
// most 12 in magnitude: 32 of them times int16 activations sum exactly in int32.
struct DecMXFP4 {
  static constexpr int64_t kGroups = 1, kBytes = 17;
  static constexpr bool kOffset = false;
  static void scales(const uint8_t* b, float* a, float* o) {
    a[0] = e8m0_half(b[0]);
    o[0] = 0.0f;
  }
  static void codes(const uint8_t* b, int, __m256i* lo, __m256i* hi) {
    __m128i l, h;
    split_nibbles16(b + 1, &l, &h);
    *lo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(mxfp4_table(), l));
    *hi = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(mxfp4_table(), h));
  }
};

// Q4_K / Q5_K's 8 six-bit scales and mins, packed in 12 bytes.
inline void k_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

inline void k_scales(const uint8_t* b, float* a, float* o) {
  const float d = half_to_float(b), dmin = half_to_float(b + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    k_scale_min(b + 4, j, &sc, &mn);
    a[j] = d * static_cast<float>(sc);
    o[j] = -(dmin * static_cast<float>(mn));
  }
}

struct DecQ4_K {
  static constexpr int64_t kGroups = 8, kBytes = 144;
  static constexpr bool kOffset = true;
  static void scales(const uint8_t* b, float* a, float* o) { k_scales(b, a, o); }
  static void codes(const uint8_t* b, int g, __m256i* lo, __m256i* hi) {
    widen_u8(nibbles32(b + 16 + 32 * (g / 2), 4 * (g % 2)), lo, hi);
  }
};

struct DecQ5_K {
  static constexpr int64_t kGroups = 8, kBytes = 176;
  static constexpr bool kOffset = true;
  static void scales(const uint8_t* b, float* a, float* o) { k_scales(b, a, o); }
  static void codes(const uint8_t* b, int g, __m256i* lo, __m256i* hi) {
    const __m256i low = nibbles32(b + 48 + 32 * (g / 2), 4 * (g % 2));
    const __m256i high = _mm256_and_si256(bit_set(load32(b + 16), g), _mm256_set1_epi8(16));
    widen_u8(_mm256_or_si256(low, high), lo, hi);
  }
};

struct DecQ6_K : SuperScale<210, 208> {
  static void codes(const uint8_t* b, int g, __m256i* lo, __m256i* hi) {
    const __m256i low = nibbles32(b + 64 * (g / 4) + 32 * (g % 2), 4 * ((g % 4) / 2));
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(load32(b + 128 + 32 * (g / 4)), 2 * (g % 4)),
                                          _mm256_set1_epi8(3));
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)),
                                      _mm256_set1_epi8(32));
    widen_i8(q, lo, hi);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    *lo = _mm256_mullo_epi16(*lo, _mm256_set1_epi16(sc[2 * g]));
    *hi = _mm256_mullo_epi16(*hi, _mm256_set1_epi16(sc[2 * g + 1]));
  }
};

// Q3_K's 16 signed six-bit scales (one per 16 weights), packed in 12 bytes.
inline int q3_k_scale(const uint8_t* s, int i) {
  const int low = i < 8 ? (s[i] & 0x0F) : (s[i - 8] >> 4);
  const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

struct DecQ3_K : SuperScale<110, 108> {
  static void codes(const uint8_t* b, int g, __m256i* lo, __m256i* hi) {
    const __m256i low = _mm256_and_si256(_mm256_srli_epi16(load32(b + 32 + 32 * (g / 4)), 2 * (g % 4)),
                                         _mm256_set1_epi8(3));
    // weight = low - 4 where the high-mask bit is clear
    const __m256i minus = _mm256_andnot_si256(bit_set(load32(b), g), _mm256_set1_epi8(4));
    widen_i8(_mm256_sub_epi8(low, minus), lo, hi);
    *lo = _mm256_mullo_epi16(*lo, _mm256_set1_epi16(static_cast<int16_t>(q3_k_scale(b + 96, 2 * g))));
    *hi = _mm256_mullo_epi16(*hi, _mm256_set1_epi16(static_cast<int16_t>(q3_k_scale(b + 96, 2 * g + 1))));
  }
};

struct DecIQ4_XS {
  static constexpr int64_t kGroups = 8, kBytes = 136;
  static constexpr bool kOffset = false;
  static void scales(const uint8_t* b, float* a, float* o) {
    const float d = half_to_float(b);
    uint16_t high;
    std::memcpy(&high, b + 2, 2);
    for (int j = 0; j < 8; ++j) {
      const int low = (b[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
      const int ls = (low | (((high >> (2 * j)) & 3) << 4)) - 32;
      a[j] = d * static_cast<float>(ls);
      o[j] = 0.0f;
    }
  }
  static void codes(const uint8_t* b, int g, __m256i* lo, __m256i* hi) {
    __m128i l, h;
    split_nibbles16(b + 8 + 16 * g, &l, &h);
    *lo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(iq4_table(), l));
    *hi = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(iq4_table(), h));
  }
};

inline __m256 dot_group(__m256i w_lo, __m256i w_hi, const int16_t* x) {
  const __m256i x_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i x_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
  return _mm256_cvtepi32_ps(
      _mm256_add_epi32(_mm256_madd_epi16(w_lo, x_lo), _mm256_madd_epi16(w_hi, x_hi)));
}

// One weight row against activation rows r0..r0+R-1: each group is decoded once for all R.
template <class Dec, int R>
void dot_rows(const uint8_t* wrow, const QuantizedRows& xq, int64_t r0, int64_t k, float* out,
              int64_t out_stride) {
  const int64_t nb = k / kGroup, nsb = nb / Dec::kGroups;
  __m256 acc[R];
  float off[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), off[r] = 0.0f;
  const int16_t* xq_base = xq.q.data() + r0 * k;
  const float* scale_base = xq.scale.data() + r0 * nb;
  const float* sum_base = xq.sum.data() + r0 * nb;
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* blk = wrow + s * Dec::kBytes;
    float a[Dec::kGroups], o[Dec::kGroups];
    Dec::scales(blk, a, o);
    for (int g = 0; g < Dec::kGroups; ++g) {
      const int64_t b = s * Dec::kGroups + g;
      __m256i lo, hi;
      Dec::codes(blk, g, &lo, &hi);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 p = dot_group(lo, hi, xq_base + r * k + b * kGroup);
        acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(a[g] * scale_base[r * nb + b]), acc[r]);
        // std::fma here and in dot_cols4: the same rounding whatever the compiler contracts
        if constexpr (Dec::kOffset) off[r] = std::fma(o[g], sum_base[r * nb + b], off[r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r * out_stride] = hsum(acc[r]) + off[r];
}

// One activation row against 4 consecutive weight rows (batch-1 decode): with one row,
// dot_rows<Dec, 1> is one FMA chain per output (latency-bound); four independent chains share
// each activation block's loads. Per output the arithmetic is dot_rows<Dec, 1>'s, in the same
// order, so a request's outputs do not depend on the batch it decodes in.
template <class Dec>
void dot_cols4(const uint8_t* w, int64_t row_bytes, const QuantizedRows& xq, int64_t k,
               float* out) {
  const int64_t nb = k / kGroup, nsb = nb / Dec::kGroups;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  float off[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint8_t* rows[4] = {w, w + row_bytes, w + 2 * row_bytes, w + 3 * row_bytes};
  for (int64_t s = 0; s < nsb; ++s) {
    float a[4][Dec::kGroups], o[4][Dec::kGroups];
    for (int c = 0; c < 4; ++c) {
      Dec::scales(rows[c] + s * Dec::kBytes, a[c], o[c]);
      _mm_prefetch(reinterpret_cast<const char*>(rows[c] + (s + 4) * Dec::kBytes), _MM_HINT_T0);
    }
    for (int g = 0; g < Dec::kGroups; ++g) {
      const int64_t b = s * Dec::kGroups + g;
      const int16_t* x = xq.q.data() + b * kGroup;
      const float sx = xq.scale[b];
#define RS_KQ_COL(c)                                                                      \
  {                                                                                       \
    __m256i lo, hi;                                                                       \
    Dec::codes(rows[c] + s * Dec::kBytes, g, &lo, &hi);                                   \
    acc##c = _mm256_fmadd_ps(dot_group(lo, hi, x), _mm256_set1_ps(a[c][g] * sx), acc##c); \
    if constexpr (Dec::kOffset) off[c] = std::fma(o[c][g], xq.sum[b], off[c]);            \
  }
      RS_KQ_COL(0) RS_KQ_COL(1) RS_KQ_COL(2) RS_KQ_COL(3)
#undef RS_KQ_COL
    }
  }
  out[0] = hsum(acc0) + off[0];
  out[1] = hsum(acc1) + off[1];
  out[2] = hsum(acc2) + off[2];
  out[3] = hsum(acc3) + off[3];
}

template <class Dec>
void dot_columns(const uint8_t* blocks, int64_t row_bytes, const QuantizedRows& xq, int64_t k,
                 int64_t r0, int64_t rows, float* out, int64_t out_stride, int64_t begin,
                 int64_t end) {
  if (rows == 1 && r0 == 0) {
    for (; begin + 4 <= end; begin += 4) {
      dot_cols4<Dec>(blocks + begin * row_bytes, row_bytes, xq, k, out + begin);
    }
  }
  for (int64_t col = begin; col < end; ++col) {
    const uint8_t* wrow = blocks + col * row_bytes;
    for (int64_t r = 0; r < rows; r += 4) {
      float* o = out + (r0 + r) * out_stride + col;
      with_row_tile(std::min<int64_t>(4, rows - r), [&](auto tile) {
        dot_rows<Dec, decltype(tile)::value>(wrow, xq, r0 + r, k, o, out_stride);
      });
    }
  }
}

template <class Dec>
void dequantize_group(const uint8_t* row, int64_t b, __m256 v[4], GroupScales* cache) {
  static_assert(Dec::kGroups <= 8, "GroupScales holds 8 groups");
  const int64_t s = b / Dec::kGroups;
  const int g = static_cast<int>(b % Dec::kGroups);
  const uint8_t* blk = row + s * Dec::kBytes;
  if (cache->block != blk) {
    Dec::scales(blk, cache->a, cache->o);
    cache->block = blk;
  }
  __m256i lo, hi;
  Dec::codes(blk, g, &lo, &hi);
  const __m256 va = _mm256_set1_ps(cache->a[g]), vo = _mm256_set1_ps(cache->o[g]);
  const __m128i parts[4] = {_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1),
                            _mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)};
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_fmadd_ps(va, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(parts[i])), vo);
  }
}

// Calls f.template operator()<Decoder>() for qtype's decoder.
template <class F>
void with_decoder(int64_t qtype, F&& f) {
  switch (qtype) {
    case kQ4_0: f(DecQ4_0{}); break;
    case kQ5_0: f(DecQ5_0{}); break;
    case kQ5_1: f(DecQ5_1{}); break;
    case kIQ4_NL: f(DecIQ4_NL{}); break;
    case kQ3_K: f(DecQ3_K{}); break;
    case kQ4_K: f(DecQ4_K{}); break;
    case kQ5_K: f(DecQ5_K{}); break;
    case kQ6_K: f(DecQ6_K{}); break;
    case kIQ4_XS: f(DecIQ4_XS{}); break;
    case kMXFP4: f(DecMXFP4{}); break;
    default: TORCH_CHECK(false, "GGML type ", qtype, " has no integer kernel");
  }
}
#endif

// (weights, bytes) per block of each type here.
bool block_shape(int64_t qtype, int64_t* weights, int64_t* bytes) {
  switch (qtype) {
    case kQ4_0: *weights = 32, *bytes = 18; return true;
    case kQ5_0: *weights = 32, *bytes = 22; return true;
    case kQ5_1: *weights = 32, *bytes = 24; return true;
    case kIQ4_NL: *weights = 32, *bytes = 18; return true;
    case kQ3_K: *weights = 256, *bytes = 110; return true;
    case kQ4_K: *weights = 256, *bytes = 144; return true;
    case kQ5_K: *weights = 256, *bytes = 176; return true;
    case kQ6_K: *weights = 256, *bytes = 210; return true;
    case kIQ4_XS: *weights = 256, *bytes = 136; return true;
    case kMXFP4: *weights = 32, *bytes = 17; return true;
    default: return false;
  }
}

}  // namespace

bool kquant_type(int64_t qtype) {
#if defined(__AVX2__)
  int64_t w, b;
  return block_shape(qtype, &w, &b);
#else
  (void)qtype;
  return false;
#endif
}

int64_t kquant_row_bytes(int64_t qtype, int64_t k) {
  int64_t w = 0, b = 0;
  TORCH_CHECK(block_shape(qtype, &w, &b), "GGML type ", qtype, " has no integer kernel");
  TORCH_CHECK(k % w == 0, "K = ", k, " is not a multiple of the block size ", w);
  return k / w * b;
}

#if defined(__AVX2__)
void kquant_dequantize_group(const uint8_t* row, int64_t qtype, int64_t b, __m256 v[4],
                             GroupScales* cache) {
  with_decoder(qtype, [&](auto dec) { dequantize_group<decltype(dec)>(row, b, v, cache); });
}
#endif

}  // namespace gguf

void kquant_dot_columns(const uint8_t* blocks, int64_t row_bytes, int64_t qtype,
                        const QuantizedRows& xq, int64_t k, int64_t r0, int64_t rows, float* out,
                        int64_t out_stride, int64_t begin, int64_t end) {
#if defined(__AVX2__)
  gguf::with_decoder(qtype, [&](auto dec) {
    gguf::dot_columns<decltype(dec)>(blocks, row_bytes, xq, k, r0, rows, out, out_stride, begin,
                                     end);
  });
#else
  (void)blocks, (void)row_bytes, (void)qtype, (void)xq, (void)k, (void)r0, (void)rows;
  (void)out, (void)out_stride, (void)begin, (void)end;
  TORCH_CHECK(false, "the GGUF block kernels for this type need AVX2");
#endif
}

}  // namespace radixserve
