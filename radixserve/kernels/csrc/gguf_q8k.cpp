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

#include <algorithm>
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
// The float rows (prefill's activations): the same operations in vectors, so the same codes,
// scale and sums (the max is exact in any order; cvtps rounds half to even, as nearbyintf does
// in the default rounding mode). Scalar, quantizing was ~15% of a 512-row panel GEMM.
template <>
void quantize_super_block<float>(const float* src, int8_t* q, float* d_out, int16_t* bsums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  for (int64_t i = 0; i < kSuper; i += 8) {
    // max(|x|, running max): a NaN input leaves the max as it was, as std::max does
    vmax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(src + i)), vmax);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float d = amax / 127.0f;
  const float id = d > 0.0f ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  for (int64_t s = 0; s < kSuper / 16; ++s) {
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + 16 * s), vid));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + 16 * s + 8), vid));
    // int32 -> int16 -> int8 (|v| <= 127: no saturation); packs works per 128-bit lane
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), _MM_SHUFFLE(3, 1, 2, 0));
    const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * s), bytes);
    __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(_mm256_add_epi32(a, b)),
                                _mm256_extracti128_si256(_mm256_add_epi32(a, b), 1));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(1, 0, 3, 2)));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(2, 3, 0, 1)));
    bsums[s] = static_cast<int16_t>(_mm_cvtsi128_si32(sum));
  }
  *d_out = d;
}

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


// A super-block's float steps for R activation rows, from its exact integer sums and their
// corrections' (correction()): the same operations in the same order as the panel GEMM
// (gguf_q8k_panel.cpp), so a row gets the same bits alone or in a batch.
template <class Dec, int R>
inline void add_sums(const SuperBlock& sb, const int* sums, const int* corrs, const Q8KRows& xq,
                     int64_t r0, int64_t k, int64_t s, float* total) {
  const float cfac = correction_factor<Dec>(sb);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const float v =
        std::fma(static_cast<float>(sums[r]), sb.d, -(static_cast<float>(corrs[r]) * cfac));
    total[r] = std::fma(v, xq.d[(r0 + r) * (k / kSuper) + s], total[r]);
  }
}

template <class Dec, int R>
inline void add_super_block(const SuperBlock& sb, const int* sums, const Q8KRows& xq, int64_t r0,
                            int64_t k, int64_t s, float* total) {
  int corrs[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) corrs[r] = correction(sb, xq.bsums.data() + (r0 + r) * (k / 16) + s * 16);
  add_sums<Dec, R>(sb, sums, corrs, xq, r0, k, s, total);
}

// A few rows stream the weights from memory: each super-block asks for the bytes ahead of it.
// One burst of prefetches per weight row (4 rows ahead) left the loads and the arithmetic
// mostly serialized: 7.5 GB/s a thread from memory vs ~13 for a plain sum; this, 9.3. Two to
// four rows (MoE experts at batch 8) gained as much: 24 layers of moe-1b's experts at 8
// tokens took 59 ms on one thread with it, 76 without.
// 2 KiB ahead (first 8): with the two threads (one core's two hyperthreads here) streaming
// different experts' few-row columns, 8 tokens of moe-1b's experts took 38-39 ms against 41 at
// 8 KiB (1 KiB: 40, 16 KiB: 39-40), with 1 and 32 tokens and dense batch-1 GEMVs unchanged.
constexpr int64_t kPrefetchBytes = 2048;

template <class Dec>
inline void prefetch_ahead(const uint8_t* blk) {
  const char* ahead = reinterpret_cast<const char*>(blk) + kPrefetchBytes;
  for (int64_t i = 0; i < Dec::kBytes; i += 64) _mm_prefetch(ahead + i, _MM_HINT_T0);
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
    prefetch_ahead<Dec>(blk);
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
    int sums[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) sums[r] = hsum_epi32(isum[r]);
    add_super_block<Dec, R>(sb, sums, xq, r0, k, s, total);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r * out_stride] = total[r];
}

#if defined(__AVX512BW__)
// dot_rows with 64 codes (two groups) per step in 512-bit vectors: the same integer sums
// (exact, so the same bits), with half the multiply-adds and a vpermw to spread the four
// 16-run scales over the lanes instead of two broadcasts per group. At batch 1 the per-row
// kernel is instruction-bound (~110 per super-block on AVX2: 6.6-7.5 GB/s a thread from memory).
inline int hsum_epi32(__m512i v) {
  return hsum_epi32(_mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

// acc + madd(p, scales): one VNNI instruction where the CPU has it (the same wrapping int32
// sums, so the same bits), two otherwise. Per activation row and 64 codes this is a third of
// the row's work in the loop, which bounds few-row GEMVs (MoE experts at batch 8: ~1.4 rows).
inline __m512i madd_accumulate(__m512i acc, __m512i p, __m512i scales) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, p, scales);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(p, scales));
#endif
}

// A row's integer sum and its correction's (correction()) reduced together: one pair of
// horizontal adds for both instead of two separate reductions. Exact in int32, so the same
// values as hsum_epi32 and correction.
inline void sum_and_correction(__m512i isum, const SuperBlock& sb, const int16_t* bsums, int* sum,
                               int* corr) {
  const __m256i a =
      _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
  const __m256i c = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums)),
                                      _mm256_load_si256(reinterpret_cast<const __m256i*>(sb.coef)));
  const __m256i pairs = _mm256_hadd_epi32(a, c);  // per 128-bit lane: a a c c
  __m128i both = _mm_add_epi32(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
  both = _mm_hadd_epi32(both, both);  // a c a c
  *sum = _mm_cvtsi128_si32(both);
  *corr = _mm_extract_epi32(both, 1);
}

template <class Dec, int R>
void dot_rows_512(const uint8_t* wrow, const Q8KRows& xq, int64_t r0, int64_t k, float* out,
                  int64_t out_stride) {
  const int64_t nsb = k / kSuper;
  float total[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) total[r] = 0.0f;
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* blk = wrow + s * Dec::kBytes;
    prefetch_ahead<Dec>(blk);
    SuperBlock sb;
    Dec::prepare(blk, &sb);
    const __m512i sc = _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(sb.sc)));
    __m512i isum[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i u = Dec::codes64(blk, j);
      // int16 lane i of the maddubs result holds codes 2i, 2i+1: run 4j + i / 8
      const __m512i scales = _mm512_permutexvar_epi16(
          _mm512_add_epi16(_mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3),
                           _mm512_set1_epi16(static_cast<int16_t>(4 * j))),
          sc);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* x = xq.q.data() + (r0 + r) * k + s * kSuper + 64 * j;
        const __m512i p = _mm512_maddubs_epi16(u, _mm512_loadu_si512(x));
        isum[r] = madd_accumulate(isum[r], p, scales);
      }
    }
    int sums[R], corrs[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int16_t* bsums = xq.bsums.data() + (r0 + r) * (k / 16) + s * 16;
      sum_and_correction(isum[r], sb, bsums, &sums[r], &corrs[r]);
    }
    add_sums<Dec, R>(sb, sums, corrs, xq, r0, k, s, total);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r * out_stride] = total[r];
}

// dot_rows_512 for two weight rows (output columns) at once, interleaved super-block by
// super-block: each output's integer sums and float steps are dot_rows_512's, in the same
// order (the same bits), but the two columns' independent chains (scale decode, multiply-adds,
// reductions) overlap, and each activation row is loaded once for both. At a few activation
// rows a column's chain is short and mostly latency (MoE experts at batch 8 get 1-3 rows each),
// so one column at a time left the core waiting.
template <class Dec, int R>
void dot_rows_512_x2(const uint8_t* wrow0, const uint8_t* wrow1, const Q8KRows& xq, int64_t r0,
                     int64_t k, float* out, int64_t out_stride) {
  const int64_t nsb = k / kSuper;
  float total0[R], total1[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) total0[r] = total1[r] = 0.0f;
  const __m512i lanes = _mm512_srli_epi16(
      _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                       12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
      3);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* blk0 = wrow0 + s * Dec::kBytes;
    const uint8_t* blk1 = wrow1 + s * Dec::kBytes;
    prefetch_ahead<Dec>(blk0);
    prefetch_ahead<Dec>(blk1);
    SuperBlock sb0, sb1;
    Dec::prepare(blk0, &sb0);
    Dec::prepare(blk1, &sb1);
    const __m512i sc0 =
        _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(sb0.sc)));
    const __m512i sc1 =
        _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(sb1.sc)));
    __m512i isum0[R], isum1[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) isum0[r] = isum1[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i u0 = Dec::codes64(blk0, j);
      const __m512i u1 = Dec::codes64(blk1, j);
      const __m512i run = _mm512_add_epi16(lanes, _mm512_set1_epi16(static_cast<int16_t>(4 * j)));
      const __m512i scales0 = _mm512_permutexvar_epi16(run, sc0);
      const __m512i scales1 = _mm512_permutexvar_epi16(run, sc1);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512i x = _mm512_loadu_si512(xq.q.data() + (r0 + r) * k + s * kSuper + 64 * j);
        isum0[r] = madd_accumulate(isum0[r], _mm512_maddubs_epi16(u0, x), scales0);
        isum1[r] = madd_accumulate(isum1[r], _mm512_maddubs_epi16(u1, x), scales1);
      }
    }
    int sums0[R], corrs0[R], sums1[R], corrs1[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int16_t* bsums = xq.bsums.data() + (r0 + r) * (k / 16) + s * 16;
      sum_and_correction(isum0[r], sb0, bsums, &sums0[r], &corrs0[r]);
      sum_and_correction(isum1[r], sb1, bsums, &sums1[r], &corrs1[r]);
    }
    add_sums<Dec, R>(sb0, sums0, corrs0, xq, r0, k, s, total0);
    add_sums<Dec, R>(sb1, sums1, corrs1, xq, r0, k, s, total1);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    out[r * out_stride] = total0[r];
    out[r * out_stride + 1] = total1[r];
  }
}
#endif

template <class Dec>
void dot_columns(const uint8_t* blocks, int64_t row_bytes, const Q8KRows& xq, int64_t k,
                 int64_t r0, int64_t rows, float* out, int64_t out_stride, int64_t begin,
                 int64_t end) {
  const bool wide = q8k_wide();
  int64_t col = begin;
#if defined(__AVX512BW__)
  // Two columns at a time (dot_rows_512_x2), tiles of up to 4 rows: the same bits.
  if (wide) {
    for (; col + 1 < end; col += 2) {
      const uint8_t* wrow = blocks + col * row_bytes;
      for (int64_t r = 0; r < rows; r += 4) {
        float* o = out + (r0 + r) * out_stride + col;
        with_row_tile(std::min<int64_t>(4, rows - r), [&](auto tile) {
          dot_rows_512_x2<Dec, decltype(tile)::value>(wrow, wrow + row_bytes, xq, r0 + r, k, o,
                                                      out_stride);
        });
      }
    }
  }
#endif
  for (; col < end; ++col) {
    const uint8_t* wrow = blocks + col * row_bytes;
    for (int64_t r = 0; r < rows; r += 4) {
      float* o = out + (r0 + r) * out_stride + col;
      with_row_tile(std::min<int64_t>(4, rows - r), [&](auto tile) {
#if defined(__AVX512BW__)
        if (wide) {
          dot_rows_512<Dec, decltype(tile)::value>(wrow, xq, r0 + r, k, o, out_stride);
          return;
        }
#endif
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

namespace {
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
constexpr const char* kWideIsa = "avx512_vnni";
#elif defined(__AVX512BW__)
constexpr const char* kWideIsa = "avx512";
#elif defined(__AVXVNNI__)
constexpr const char* kWideIsa = "avx_vnni";
#else
constexpr const char* kWideIsa = nullptr;
#endif
// The variant in use, an index into q8k_isas(): 0 avx2, 1 the wide one (the default), 2 amx_int8.
std::atomic<int> g_isa{kWideIsa != nullptr ? 1 : 0};
std::atomic<int64_t> g_amx_min_rows{1};
}  // namespace

std::vector<std::string> q8k_isas() {
  std::vector<std::string> isas;
#if defined(__AVX2__)
  isas.push_back("avx2");
  if (kWideIsa != nullptr) isas.push_back(kWideIsa);
#if defined(RS_Q8K_AMX)
  if (q8k_amx_permitted()) isas.push_back("amx_int8");
#endif
#endif
  return isas;
}

void set_q8k_isa(const std::string& isa) {
  const auto isas = q8k_isas();
  const auto found = std::find(isas.begin(), isas.end(), isa);
  TORCH_CHECK(found != isas.end(), "no Q8_K kernels for ", isa, " in this build");
  g_isa.store(static_cast<int>(found - isas.begin()));
}

std::string q8k_isa() {
  const auto isas = q8k_isas();
  return isas.empty() ? "" : isas[g_isa.load()];
}

bool q8k_wide() { return g_isa.load() >= 1; }
bool q8k_amx() { return g_isa.load() == 2; }

void set_q8k_amx_min_rows(int64_t rows) { g_amx_min_rows.store(std::max<int64_t>(rows, 1)); }
int64_t q8k_amx_min_rows() { return g_amx_min_rows.load(); }

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
void size_q8k_row(int64_t k, Q8KRows& out) {
  out.q.resize(k);
  out.d.resize(k / kSuper);
  out.bsums.resize(k / 16);
}

void quantize_q8k_row_blocks(const float* x, int64_t k, int64_t s0, int64_t s1, Q8KRows& out) {
  (void)k;
  for (int64_t s = s0; s < s1; ++s) {
    quantize_super_block(x + s * kSuper, out.q.data() + s * kSuper, &out.d[s],
                         out.bsums.data() + s * 16);
  }
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
