// K-quant matmuls on int8 activations quantized per super-block of 256 (llama.cpp's Q8_K):
// one float scale per 256 activations lets a super-block's eight groups accumulate in int32
// with the weights' integer sub-block scales (madd_epi16), and only one float multiply-add per
// super-block and activation row is left, where the int16 path (gguf_kquant.cpp) needs one per
// group of 32. Activation rounding is int8's (relative error ~4e-3 per value, as llama.cpp's);
// gguf_linear takes this path for Q3_K/Q4_K/Q5_K/Q6_K when set_kquant_int8(true) chose it.
//
// Per super-block and row: sum_g sc_g * (u_g . x_g) in int32, with u the weight codes as
// unsigned bytes (maddubs: u8 x s8 pairs into int16, at most 2 * 63 * 127 = 16002), minus the
// zero point z * sum_s sc_s * bsum_s (Q6_K: z = 32, Q3_K: 4) and, for Q4_K/Q5_K, the mins
// dmin * sum_g m_g * (x's sum over group g), both from the activation's per-16 sums (bsums).
#include "gguf_q8k.h"

#include <atomic>
#include <cmath>

#include "gguf_blocks.h"
#include "gguf_kquant.h"

namespace radixserve {
namespace {

std::atomic<bool> g_use_q8k{false};

constexpr int64_t kSuper = 256;

template <typename T>
void quantize_super_block(const T* src, int8_t* q, float* d_out, int16_t* bsums) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kSuper; ++i) amax = std::max(amax, std::abs(to_float(src[i])));
  const float d = amax / 127.0f;
  const float id = d > 0.0f ? 1.0f / d : 0.0f;
  for (int64_t s = 0; s < kSuper / 16; ++s) {
    int sum = 0;
    for (int64_t i = 16 * s; i < 16 * s + 16; ++i) {
      const int v = static_cast<int>(__builtin_nearbyintf(to_float(src[i]) * id));
      q[i] = static_cast<int8_t>(v);
      sum += v;
    }
    bsums[s] = static_cast<int16_t>(sum);
  }
  *d_out = d;
}

#if defined(__AVX2__)
using gguf::half_to_float;
using gguf::hsum;
using gguf::with_row_tile;

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

// Decoders: prepare() reads a super-block's scales as integers (sc: one per 16 weights), its
// float factors and zero point; codes(g) gives group g's 32 weight codes as unsigned bytes.
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
  static constexpr int64_t kBytes = 144;
  static constexpr int kZero = 0;
  static constexpr bool kMins = true;
  static void prepare(const uint8_t* b, SuperBlock* sb) { prepare_k(b, sb); }
  static __m256i codes(const uint8_t* b, int g) {
    return nibbles32(b + 16 + 32 * (g / 2), 4 * (g % 2));
  }
};

struct Q8KQ5_K {
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

// sum_s sc_s * bsum_s * z and sum_g m_g * (bsum_2g + bsum_2g+1): the zero-point and min terms.
template <class Dec>
inline void corrections(const SuperBlock& sb, const int16_t* bsums, int* zero, int* mins) {
  int z = 0, mn = 0;
  if constexpr (Dec::kZero != 0) {
    for (int s = 0; s < 16; ++s) z += sb.sc[s] * bsums[s];
    z *= Dec::kZero;
  }
  if constexpr (Dec::kMins) {
    for (int g = 0; g < 8; ++g) mn += sb.mins[g] * (bsums[2 * g] + bsums[2 * g + 1]);
  }
  *zero = z;
  *mins = mn;
}

// out[r] for R activation rows and one weight row; each group decoded once for all rows.
template <class Dec, int R>
void dot_rows(const uint8_t* wrow, const Q8KRows& xq, int64_t r0, int64_t k, float* out,
              int64_t out_stride) {
  const int64_t nsb = k / kSuper;
  __m256 acc[R];
  float off[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), off[r] = 0.0f;
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* blk = wrow + s * Dec::kBytes;
    SuperBlock sb;
    Dec::prepare(blk, &sb);
    __m256i isum[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      const __m256i u = Dec::codes(blk, g);
      const __m256i scales = _mm256_setr_m128i(_mm_set1_epi16(sb.sc[2 * g]),
                                               _mm_set1_epi16(sb.sc[2 * g + 1]));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* x = xq.q.data() + (r0 + r) * k + s * kSuper + 32 * g;
        const __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, scales));
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const float dx = xq.d[row * (k / kSuper) + s];
      int zero, mins;
      corrections<Dec>(sb, xq.bsums.data() + row * (k / 16) + s * 16, &zero, &mins);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(sb.d * dx), acc[r]);
      off[r] = std::fma(-sb.d * dx, static_cast<float>(zero), off[r]);
      off[r] = std::fma(-sb.dmin * dx, static_cast<float>(mins), off[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r * out_stride] = hsum(acc[r]) + off[r];
}

template <class Dec>
void dot_columns(const uint8_t* blocks, int64_t row_bytes, const Q8KRows& xq, int64_t k,
                 int64_t r0, int64_t rows, float* out, int64_t out_stride, int64_t begin,
                 int64_t end) {
  for (int64_t col = begin; col < end; ++col) {
    const uint8_t* wrow = blocks + col * row_bytes;
    if (rows == 1) {
      const uint8_t* ahead = wrow + 4 * row_bytes;
      for (int64_t i = 0; i < row_bytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + i), _MM_HINT_T0);
    }
    for (int64_t r = 0; r < rows; r += 4) {
      float* o = out + (r0 + r) * out_stride + col;
      with_row_tile(std::min<int64_t>(4, rows - r), [&](auto tile) {
        dot_rows<Dec, decltype(tile)::value>(wrow, xq, r0 + r, k, o, out_stride);
      });
    }
  }
}
#endif

}  // namespace

bool q8k_type(int64_t qtype) {
#if defined(__AVX2__)
  return qtype == gguf::kQ3_K || qtype == gguf::kQ4_K || qtype == gguf::kQ5_K ||
         qtype == gguf::kQ6_K;
#else
  (void)qtype;
  return false;
#endif
}

void set_kquant_int8(bool on) { g_use_q8k.store(on); }
bool kquant_int8() { return g_use_q8k.load(); }

template <typename T>
void quantize_q8k(const T* x, int64_t m, int64_t k, int64_t stride, Q8KRows& out) {
  const int64_t nsb = k / kSuper;
  out.q.resize(m * k);
  out.d.resize(m * nsb);
  out.bsums.resize(m * (k / 16));
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t s = 0; s < nsb; ++s) {
        quantize_super_block(x + r * stride + s * kSuper, out.q.data() + r * k + s * kSuper,
                             &out.d[r * nsb + s], out.bsums.data() + r * (k / 16) + s * 16);
      }
    }
  });
}
template void quantize_q8k<float>(const float*, int64_t, int64_t, int64_t, Q8KRows&);
template void quantize_q8k<at::BFloat16>(const at::BFloat16*, int64_t, int64_t, int64_t,
                                         Q8KRows&);

void q8k_dot_columns(const uint8_t* blocks, int64_t row_bytes, int64_t qtype, const Q8KRows& xq,
                     int64_t k, int64_t r0, int64_t rows, float* out, int64_t out_stride,
                     int64_t begin, int64_t end) {
#if defined(__AVX2__)
  switch (qtype) {
    case gguf::kQ3_K: dot_columns<Q8KQ3_K>(blocks, row_bytes, xq, k, r0, rows, out, out_stride, begin, end); break;
    case gguf::kQ4_K: dot_columns<Q8KQ4_K>(blocks, row_bytes, xq, k, r0, rows, out, out_stride, begin, end); break;
    case gguf::kQ5_K: dot_columns<Q8KQ5_K>(blocks, row_bytes, xq, k, r0, rows, out, out_stride, begin, end); break;
    case gguf::kQ6_K: dot_columns<Q8KQ6_K>(blocks, row_bytes, xq, k, r0, rows, out, out_stride, begin, end); break;
    default: TORCH_CHECK(false, "GGML type ", qtype, " has no Q8_K kernel");
  }
#else
  (void)blocks, (void)row_bytes, (void)qtype, (void)xq, (void)k, (void)r0, (void)rows;
  (void)out, (void)out_stride, (void)begin, (void)end;
  TORCH_CHECK(false, "the Q8_K kernels need AVX2");
#endif
}

}  // namespace radixserve
