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
#include "gguf_q8k_decode.h"

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
using gguf::with_row_tile;
using q8k::Q8KQ3_K;
using q8k::Q8KQ4_K;
using q8k::Q8KQ5_K;
using q8k::Q8KQ6_K;
using q8k::SuperBlock;

inline int hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// The correction's integer sum: sum_j coef_j * bsum_j over the 16 runs of 16 (exact in int32);
// its float factor is correction_factor.
inline int correction(const SuperBlock& sb, const int16_t* bsums) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums));
  return hsum_epi32(_mm256_madd_epi16(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(sb.coef))));
}

template <class Dec>
inline float correction_factor(const SuperBlock& sb) {
  static_assert((Dec::kZero != 0) != Dec::kMins, "a zero point or mins, not both");
  return Dec::kMins ? sb.dmin : sb.d * static_cast<float>(Dec::kZero);
}


// out[r] for R activation rows and one weight row; each group decoded once for all rows. Per
// super-block the integer sums are exact and the float steps are those of the panel GEMM
// (gguf_q8k_panel.cpp), in the same order: a row gets the same bits alone or in a batch.
template <class Dec, int R>
void dot_rows(const uint8_t* wrow, const Q8KRows& xq, int64_t r0, int64_t k, float* out,
              int64_t out_stride) {
  const int64_t nsb = k / kSuper;
  float total[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) total[r] = 0.0f;
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
    const float cfac = correction_factor<Dec>(sb);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int corr = correction(sb, xq.bsums.data() + row * (k / 16) + s * 16);
      const float v = std::fma(static_cast<float>(hsum_epi32(isum[r])), sb.d,
                               -(static_cast<float>(corr) * cfac));
      total[r] = std::fma(v, xq.d[row * nsb + s], total[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r * out_stride] = total[r];
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
