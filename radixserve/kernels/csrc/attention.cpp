// Attention over the paged KV cache, read through the request-to-token table (no gather of the
// whole K/V into a temporary). One kernel serves decode (one new token per request) and extend
// (prefill, chunked prefill, prefill over a cached prefix): new token j of request b sits at
// position prefix_lens[b] + j and sees keys [0, prefix_lens[b] + j].
// Work is split over (request, block of query rows), all KV heads in one item (or one item per
// KV head when there are too few blocks to keep every thread busy); each item streams its keys
// in blocks with an online softmax, so memory use is independent of the context length.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "common.h"
#include "gemm_micro.h"
#include "single_row.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace radixserve {
namespace {

constexpr int64_t kQueryRows = 8;  // query rows per work item (times the GQA group size)
// Query rows per work item in use: kQueryRows, or 1 for batch-invariant results
// (set_attention_query_rows): the path an item takes (direct, gathered, tiled) and so its
// arithmetic depend on how many query vectors it holds, so with blocks of 8 a row's result
// depends on where its request's block boundaries fall (a prefix-cache hit of 30 tokens shifts
// them). One row per item gives every query row, prefill or decode, the same path.
std::atomic<int64_t> g_query_rows{kQueryRows};
constexpr int64_t kKeyBlock = 64;  // keys per block
constexpr int64_t kDirectQueries = 8;  // up to this many query vectors: no K/V gather

struct WorkItem {
  int64_t req;
  int64_t row0;  // first query row of the block, relative to the request's new tokens
  int64_t h0, h1;  // KV heads [h0, h1)
  int64_t cost;    // query rows x keys: heavier items are handed out first
};

// Online-softmax update of one query vector with the scores sp[0, valid) of a key block;
// sp is overwritten with the probabilities.
inline void softmax_update(float* sp, int64_t valid, float* run_max, float* run_sum, float* acc,
                           int64_t dim) {
  float block_max = *run_max;
  for (int64_t j = 0; j < valid; ++j) block_max = std::max(block_max, sp[j]);
  const float alpha = fast_exp(*run_max - block_max);
  float sum = 0.0f;
  int64_t j = 0;
#if defined(__AVX2__)
  // fast_exp does not vectorise inside `omp simd` (see fast_exp8).
  const __m256 vmax = _mm256_set1_ps(block_max);
  __m256 vsum = _mm256_setzero_ps();
  for (; j + 8 <= valid; j += 8) {
    const __m256 e = fast_exp8(_mm256_sub_ps(_mm256_loadu_ps(sp + j), vmax));
    _mm256_storeu_ps(sp + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vsum);
  for (float v : lanes) sum += v;
#endif
  for (; j < valid; ++j) {
    sp[j] = fast_exp(sp[j] - block_max);
    sum += sp[j];
  }
  *run_sum = *run_sum * alpha + sum;
  *run_max = block_max;
#pragma omp simd
  for (int64_t d = 0; d < dim; ++d) acc[d] *= alpha;
}

// Few query vectors (decode): dot products straight against the cache rows, each K and V row
// read once for all of them, no copy.
template <typename C>
void attend_direct(int64_t kv_head, const float* qv, int64_t m_count, const int64_t* limit,
                   int64_t key_end, const C* k_cache, const C* v_cache, const int64_t* token_row,
                   int64_t kv_row, int64_t dim, float* acc, float* run_max, float* run_sum) {
  std::vector<float> scores(m_count * kKeyBlock);
  for (int64_t k0 = 0; k0 < key_end; k0 += kKeyBlock) {
    const int64_t kb = std::min(kKeyBlock, key_end - k0);
    for (int64_t j = 0; j < kb; ++j) {
      const C* kp = k_cache + token_row[k0 + j] * kv_row + kv_head * dim;
      for (int64_t i = 0; i < m_count; ++i) {
        const float* qi = qv + i * dim;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < dim; ++d) dot += qi[d] * to_float(kp[d]);
        scores[i * kKeyBlock + j] = dot;
      }
    }
    for (int64_t i = 0; i < m_count; ++i) {
      const int64_t valid = std::min(kb, limit[i] - k0);
      if (valid > 0) {
        softmax_update(scores.data() + i * kKeyBlock, valid, run_max + i, run_sum + i,
                       acc + i * dim, dim);
      }
    }
    for (int64_t j = 0; j < kb; ++j) {
      const C* vp = v_cache + token_row[k0 + j] * kv_row + kv_head * dim;
      for (int64_t i = 0; i < m_count; ++i) {
        if (j >= limit[i] - k0) continue;
        const float p = scores[i * kKeyBlock + j];
        float* ai = acc + i * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) ai[d] += p * to_float(vp[d]);
      }
    }
  }
}

#if defined(__AVX2__)
// common.h's float and bfloat16 loads, beside the 8-bit caches' below (a name declared here
// would otherwise hide them).
using ::radixserve::load8;
// The 8-bit caches, widened in registers (no float copy of the cache is made). Both formats
// are fp16 with fewer bits, widened by F16C: e5m2 is an fp16's high byte exactly; e4m3's seven
// magnitude bits placed at fp16 bit 7 make an fp16 of its value / 256 (fp16's exponent bias is
// 15, e4m3's 7; subnormals map onto fp16 subnormals alike). load8 returns value / kLoadGain<C>:
// its two callers multiply by the gain once per score and per probability instead of once per
// loaded vector (one instruction fewer per 8 values in the inner loops, which the widening
// otherwise dominates while the cache is in L2). e4m3's NaN code is never stored (from_float
// saturates).
template <typename C>
constexpr float kLoadGain = 1.0f;
#if defined(__F16C__)
template <>
constexpr float kLoadGain<c10::Float8_e4m3fn> = 256.0f;
inline __m256 load8(const c10::Float8_e5m2* p) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), raw));  // each byte to bits 15..8
}
inline __m256 load8(const c10::Float8_e4m3fn* p) {
  // Sign-extended to 16 bits and shifted by 7: the sign lands on bits 15 and 14, the magnitude
  // on 13..7; clearing bit 14 leaves an fp16 of value / 256.
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i half = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(raw), 7),
                                     _mm_set1_epi16(static_cast<int16_t>(0xBFFF)));
  return _mm256_cvtph_ps(half);
}
#else
template <typename C>
inline __m256 load8(const C* p) {
  alignas(32) float lanes[8];
  for (int i = 0; i < 8; ++i) lanes[i] = to_float(p[i]);
  return _mm256_load_ps(lanes);
}
#endif

// Scores of Q (<= 3) query vectors against four key rows: 4Q independent accumulator chains
// (one chain per dot product would wait on every FMA's latency), each key slice loaded once for
// all Q queries, one horizontal reduction per query for its four scores.
template <typename C, int Q>
inline void dots_q4(const float* q, int64_t dim, const C* k0, const C* k1, const C* k2,
                    const C* k3, float* out, int64_t out_stride, int64_t count) {
  __m256 a[Q][4];
  for (int i = 0; i < Q; ++i) {
    for (int t = 0; t < 4; ++t) a[i][t] = _mm256_setzero_ps();
  }
  for (int64_t d = 0; d < dim; d += 8) {
    const __m256 kv0 = load8(k0 + d), kv1 = load8(k1 + d), kv2 = load8(k2 + d),
                 kv3 = load8(k3 + d);
    for (int i = 0; i < Q; ++i) {
      const __m256 qv = _mm256_loadu_ps(q + i * dim + d);
      a[i][0] = _mm256_fmadd_ps(qv, kv0, a[i][0]);
      a[i][1] = _mm256_fmadd_ps(qv, kv1, a[i][1]);
      a[i][2] = _mm256_fmadd_ps(qv, kv2, a[i][2]);
      a[i][3] = _mm256_fmadd_ps(qv, kv3, a[i][3]);
    }
  }
  for (int i = 0; i < Q; ++i) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a[i][0], a[i][1]),
                                    _mm256_hadd_ps(a[i][2], a[i][3]));
    alignas(16) float four[4];
    _mm_store_ps(four, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
    for (int64_t t = 0; t < count; ++t) out[i * out_stride + t] = four[t] * kLoadGain<C>;
  }
}

// acc[i][d0, d0 + 8S) += sum_j p[i][j] * v_j[d0, d0 + 8S) over the block's keys, in key order:
// M x S accumulators in registers, each V slice loaded once for all M queries. Per output
// element the FMAs run in the same order as a one-slice loop, so the sums are bitwise equal.
template <typename C, int M, int S>
inline void pv_slices(const float* scores, int64_t kb, const C* const* vrow, int64_t d0,
                      float* acc, int64_t dim) {
  __m256 a[M][S];
  for (int i = 0; i < M; ++i) {
    for (int s = 0; s < S; ++s) a[i][s] = _mm256_loadu_ps(acc + i * dim + d0 + 8 * s);
  }
  for (int64_t j = 0; j < kb; ++j) {
    __m256 p[M];
    for (int i = 0; i < M; ++i) p[i] = _mm256_set1_ps(scores[i * kKeyBlock + j] * kLoadGain<C>);
    for (int s = 0; s < S; ++s) {
      const __m256 v = load8(vrow[j] + d0 + 8 * s);
      for (int i = 0; i < M; ++i) a[i][s] = _mm256_fmadd_ps(p[i], v, a[i][s]);
    }
  }
  for (int i = 0; i < M; ++i) {
    for (int s = 0; s < S; ++s) _mm256_storeu_ps(acc + i * dim + d0 + 8 * s, a[i][s]);
  }
}

// Prefetch `bytes` of a cache row into L1.
inline void prefetch_bytes(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
}

// attend_direct for M query vectors per KV head, KV heads [h0, h1), head_dim a multiple of 8,
// in AVX2. qv and acc hold M vectors per head, run_max and run_sum M values per head; limit[i]
// is the same for every head.
//
// Memory decides the speed here. A token's K (and V) row holds all KV heads side by side. A
// pass per head reads a third (three KV heads) of every row's cache lines in a strided pattern
// the hardware prefetcher serves badly: 3-6 GB/s of useful K/V where a contiguous read runs
// at 10 on one core. So each key block is scored for all heads of the range key by key (the K
// rows read front to back), its V rows are prefetched meanwhile, and P.V then runs per head
// over the block, now in cache. Scores take four keys x up to three queries per pass, P.V
// keeps M x S slices of a head in registers.
template <typename C, int M>
void attend_direct_avx2(int64_t h0, int64_t h1, const float* qv, const int64_t* limit,
                        int64_t key_end, const C* k_cache, const C* v_cache,
                        const int64_t* token_row, int64_t kv_row, int64_t dim, float* acc,
                        float* run_max, float* run_sum) {
  constexpr int S = M <= 1 ? 8 : M <= 3 ? 4 : M <= 6 ? 2 : 1;  // <= 12 accumulators
  constexpr int64_t kAhead = 16;  // keys whose K rows are prefetched ahead of the scoring
  const int64_t n_heads = h1 - h0;
  static thread_local std::vector<float> score_buf;  // reused, as attend_item's scratch
  score_buf.assign(n_heads * M * kKeyBlock, 0.0f);
  const C* vrow[kKeyBlock];
  const int64_t range_off = h0 * dim;
  const int64_t range_bytes = n_heads * dim * int64_t(sizeof(C));
  auto k_at = [&](int64_t key) { return k_cache + token_row[key] * kv_row; };
  auto v_at = [&](int64_t key) { return v_cache + token_row[key] * kv_row; };
  for (int64_t j = 0; j < std::min(kAhead, key_end); ++j) {
    prefetch_bytes(k_at(j) + range_off, range_bytes);
  }
  for (int64_t k0 = 0; k0 < key_end; k0 += kKeyBlock) {
    const int64_t kb = std::min(kKeyBlock, key_end - k0);
    const int64_t last = k0 + kb - 1;
    for (int64_t j = 0; j < kb; j += 4) {
      for (int64_t t = k0 + j; t < std::min(k0 + j + 4, key_end); ++t) {
        prefetch_bytes(v_at(t) + range_off, range_bytes);
      }
      for (int64_t t = k0 + j + kAhead; t < std::min(k0 + j + kAhead + 4, key_end); ++t) {
        prefetch_bytes(k_at(t) + range_off, range_bytes);
      }
      // A tail of fewer than 4 keys repeats the last one: the same arithmetic for every key.
      const C* kr0 = k_at(k0 + j);
      const C* kr1 = k_at(std::min(k0 + j + 1, last));
      const C* kr2 = k_at(std::min(k0 + j + 2, last));
      const C* kr3 = k_at(std::min(k0 + j + 3, last));
      const int64_t count = std::min<int64_t>(4, kb - j);
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t ho = h * dim;
        const float* q = qv + (h - h0) * M * dim;
        float* sc = score_buf.data() + (h - h0) * M * kKeyBlock + j;
        int i0 = 0;
        for (; i0 + 3 <= M; i0 += 3) {
          dots_q4<C, 3>(q + i0 * dim, dim, kr0 + ho, kr1 + ho, kr2 + ho, kr3 + ho,
                        sc + i0 * kKeyBlock, kKeyBlock, count);
        }
        if constexpr (M % 3 == 1) {
          dots_q4<C, 1>(q + i0 * dim, dim, kr0 + ho, kr1 + ho, kr2 + ho, kr3 + ho,
                        sc + i0 * kKeyBlock, kKeyBlock, count);
        } else if constexpr (M % 3 == 2) {
          dots_q4<C, 2>(q + i0 * dim, dim, kr0 + ho, kr1 + ho, kr2 + ho, kr3 + ho,
                        sc + i0 * kKeyBlock, kKeyBlock, count);
        }
      }
    }
    for (int64_t h = h0; h < h1; ++h) {
      float* scores = score_buf.data() + (h - h0) * M * kKeyBlock;
      float* a = acc + (h - h0) * M * dim;
      for (int i = 0; i < M; ++i) {
        const int64_t valid = std::max<int64_t>(0, std::min(kb, limit[i] - k0));
        float* sp = scores + i * kKeyBlock;
        const int64_t r = (h - h0) * M + i;
        if (valid > 0) softmax_update(sp, valid, run_max + r, run_sum + r, a + i * dim, dim);
        // Keys this query may not see weigh exactly 0 (their K/V rows are written, finite).
        for (int64_t j = valid; j < kb; ++j) sp[j] = 0.0f;
      }
      for (int64_t j = 0; j < kb; ++j) vrow[j] = v_at(k0 + j) + h * dim;
      int64_t d0 = 0;
      for (; d0 + 8 * S <= dim; d0 += 8 * S) pv_slices<C, M, S>(scores, kb, vrow, d0, a, dim);
      for (; d0 < dim; d0 += 8) pv_slices<C, M, 1>(scores, kb, vrow, d0, a, dim);
    }
  }
}

// Runs attend_direct_avx2 when it applies (AVX2, head_dim % 8 == 0); false otherwise.
template <typename C>
bool attend_direct_fast(int64_t h0, int64_t h1, const float* qv, int64_t m_count,
                        const int64_t* limit, int64_t key_end, const C* k_cache,
                        const C* v_cache, const int64_t* token_row, int64_t kv_row, int64_t dim,
                        float* acc, float* run_max, float* run_sum) {
  if (dim % 8 != 0) return false;
#define RADIXSERVE_DIRECT(M)                                                               \
  case M:                                                                                  \
    attend_direct_avx2<C, M>(h0, h1, qv, limit, key_end, k_cache, v_cache, token_row,      \
                             kv_row, dim, acc, run_max, run_sum);                          \
    return true;
  switch (m_count) {
    RADIXSERVE_DIRECT(1)
    RADIXSERVE_DIRECT(2)
    RADIXSERVE_DIRECT(3)
    RADIXSERVE_DIRECT(4)
    RADIXSERVE_DIRECT(5)
    RADIXSERVE_DIRECT(6)
    RADIXSERVE_DIRECT(7)
    RADIXSERVE_DIRECT(8)
    default:
      return false;
  }
#undef RADIXSERVE_DIRECT
}
static_assert(kDirectQueries == 8, "attend_direct_fast covers up to 8 query vectors");
#else
template <typename C>
bool attend_direct_fast(int64_t, int64_t, const float*, int64_t, const int64_t*, int64_t,
                        const C*, const C*, const int64_t*, int64_t, int64_t, float*, float*,
                        float*) {
  return false;
}
#endif

// Keys [k0, k0 + kb) of one KV head as float: K transposed (kt[d][j], kKeyBlock wide), V as rows.
template <typename C>
void gather_key_block(int64_t k0, int64_t kb, const int64_t* token_row, const C* k_cache,
                      const C* v_cache, int64_t kv_row, int64_t kv_head, int64_t dim, float* kt,
                      float* vb) {
  for (int64_t j = 0; j < kb; ++j) {
    const int64_t slot = token_row[k0 + j];
    const C* kp = k_cache + slot * kv_row + kv_head * dim;
    const C* vp = v_cache + slot * kv_row + kv_head * dim;
    for (int64_t d = 0; d < dim; ++d) kt[d * kKeyBlock + j] = to_float(kp[d]);
    for (int64_t d = 0; d < dim; ++d) vb[j * dim + d] = to_float(vp[d]);
  }
}

// Many query vectors (prefill): the key block is gathered once into a transposed float tile,
// so the scores of each query vector are a vectorised outer-product accumulation.
template <typename C>
void attend_gathered(int64_t kv_head, const float* qv, int64_t m_count, const int64_t* limit,
                     int64_t key_end, const C* k_cache, const C* v_cache,
                     const int64_t* token_row, int64_t kv_row, int64_t dim, float* acc,
                     float* run_max, float* run_sum) {
  std::vector<float> kt(dim * kKeyBlock), vb(kKeyBlock * dim), s(kKeyBlock);
  for (int64_t k0 = 0; k0 < key_end; k0 += kKeyBlock) {
    const int64_t kb = std::min(kKeyBlock, key_end - k0);
    gather_key_block(k0, kb, token_row, k_cache, v_cache, kv_row, kv_head, dim, kt.data(),
                     vb.data());
    for (int64_t i = 0; i < m_count; ++i) {
      const int64_t valid = std::min(kb, limit[i] - k0);
      if (valid <= 0) continue;
      float* sp = s.data();
      std::fill(sp, sp + kKeyBlock, 0.0f);
      const float* qi = qv + i * dim;
      for (int64_t d = 0; d < dim; ++d) {
        const float qd = qi[d];
        const float* kd = kt.data() + d * kKeyBlock;
#pragma omp simd
        for (int64_t j = 0; j < kKeyBlock; ++j) sp[j] += qd * kd[j];
      }
      float* ai = acc + i * dim;
      softmax_update(sp, valid, run_max + i, run_sum + i, ai, dim);
      for (int64_t j = 0; j < valid; ++j) {
        const float p = sp[j];
        const float* vj = vb.data() + j * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) ai[d] += p * vj[d];
      }
    }
  }
}

#if defined(__AVX2__)
// Many query vectors (prefill), register-blocked: per key block, S = Q K^T and O += P V are two
// small matmuls run by the 6x16 micro-kernel of gemm_micro.h (K gathered transposed, V as rows),
// with the online softmax between them. The scalar attend_gathered streamed the score and output
// rows through L1 once per key or dimension (one FMA per two loads and a store): ~15 GFLOP/s
// at 512 tokens on one core.
template <typename C>
void attend_gathered_tiled(int64_t kv_head, const float* qv, int64_t m_count,
                           const int64_t* limit, int64_t key_end, const C* k_cache,
                           const C* v_cache, const int64_t* token_row, int64_t kv_row,
                           int64_t dim, float* acc, float* run_max, float* run_sum) {
  using micro::kMR;
  using micro::kNR;
  // Zero-filled: keys past the end of the last block must be finite (their scores and
  // probabilities are discarded, but 0 x NaN would not be).
  std::vector<float> kt(dim * kKeyBlock, 0.0f), vb(kKeyBlock * dim, 0.0f);
  std::vector<float> s(m_count * kKeyBlock);
  for (int64_t k0 = 0; k0 < key_end; k0 += kKeyBlock) {
    const int64_t kb = std::min(kKeyBlock, key_end - k0);
    gather_key_block(k0, kb, token_row, k_cache, v_cache, kv_row, kv_head, dim, kt.data(),
                     vb.data());
    if (kb < kKeyBlock) {
      for (int64_t d = 0; d < dim; ++d) {
        std::fill(kt.begin() + d * kKeyBlock + kb, kt.begin() + (d + 1) * kKeyBlock, 0.0f);
      }
      std::fill(vb.begin() + kb * dim, vb.end(), 0.0f);
    }
    const int64_t key_cols = (kb + kNR - 1) / kNR * kNR;
    for (int64_t i0 = 0; i0 < m_count; i0 += kMR) {
      const int64_t rows = std::min(kMR, m_count - i0);
      for (int64_t j0 = 0; j0 < key_cols; j0 += kNR) {
        micro::tile_rows(rows, qv + i0 * dim, dim, kt.data() + j0, kKeyBlock, dim,
                         s.data() + i0 * kKeyBlock + j0, kKeyBlock, kNR, false);
      }
    }
    for (int64_t i = 0; i < m_count; ++i) {
      float* sp = s.data() + i * kKeyBlock;
      const int64_t valid = std::max<int64_t>(0, std::min(kb, limit[i] - k0));
      if (valid > 0) softmax_update(sp, valid, run_max + i, run_sum + i, acc + i * dim, dim);
      std::fill(sp + valid, sp + kKeyBlock, 0.0f);  // masked keys add nothing to P V
    }
    for (int64_t i0 = 0; i0 < m_count; i0 += kMR) {
      const int64_t rows = std::min(kMR, m_count - i0);
      for (int64_t d0 = 0; d0 < dim; d0 += kNR) {
        micro::tile_rows(rows, s.data() + i0 * kKeyBlock, kKeyBlock, vb.data() + d0, dim, kb,
                         acc + i0 * dim + d0, dim, kNR, true);
      }
    }
  }
}
#endif

// The register-blocked prefill path where it applies (AVX2, head_dim a multiple of 16).
template <typename C>
bool attend_gathered_fast(int64_t kv_head, const float* qv, int64_t m_count, const int64_t* limit,
                          int64_t key_end, const C* k_cache, const C* v_cache,
                          const int64_t* token_row, int64_t kv_row, int64_t dim, float* acc,
                          float* run_max, float* run_sum) {
#if defined(__AVX2__)
  if (dim % micro::kNR == 0) {
    attend_gathered_tiled<C>(kv_head, qv, m_count, limit, key_end, k_cache, v_cache, token_row,
                             kv_row, dim, acc, run_max, run_sum);
    return true;
  }
#endif
  return false;
}

struct ItemScratch {
  std::vector<float> qv, acc, run_max, run_sum;
  std::vector<int64_t> limit;
};

template <typename T, typename C>
void attend_item(const WorkItem& item, const T* q, int64_t q_stride, const C* k_cache,
                 const C* v_cache, const int64_t* token_row, int64_t prefix, int64_t n_new,
                 int64_t q_start, int64_t heads, int64_t kv_heads, int64_t dim, float scale,
                 T* out, const float* sinks = nullptr, float k_scale = 1.0f,
                 float v_scale = 1.0f) {
  // An 8-bit cache holds K / k_scale and V / v_scale: the K scale joins the query's (q.k_scale
  // k = k_scale (q.k)) and the V scale the normalisation, so the inner loops only widen codes.
  // Both are 1 for float caches, which leaves their arithmetic as it was.
  const float q_scale = scale * k_scale;
  const int64_t group = heads / kv_heads;
  const int64_t rows = std::min(g_query_rows.load(std::memory_order_relaxed), n_new - item.row0);
  const int64_t m_count = rows * group;  // query vectors per KV head
  const int64_t n_heads = item.h1 - item.h0;
  const int64_t kv_row = kv_heads * dim;
  // Per KV head of the range: m_count query vectors, accumulators and softmax state. Kept per
  // thread and reused: a decode step runs ~100 small items, and allocating these for each was a
  // visible share of batch-1 time.
  static thread_local ItemScratch scratch;
  std::vector<float>& qv = scratch.qv;
  std::vector<float>& acc = scratch.acc;
  std::vector<float>& run_max = scratch.run_max;
  std::vector<float>& run_sum = scratch.run_sum;
  std::vector<int64_t>& limit = scratch.limit;
  qv.resize(n_heads * m_count * dim);  // every element is written below
  acc.assign(n_heads * m_count * dim, 0.0f);
  run_max.assign(n_heads * m_count, -1e30f);
  run_sum.assign(n_heads * m_count, 0.0f);
  limit.resize(m_count);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < group; ++g) limit[r * group + g] = prefix + item.row0 + r + 1;
  }  // keys [0, limit) are visible, for every head
  for (int64_t h = item.h0; h < item.h1; ++h) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* qrow = q + (q_start + item.row0 + r) * q_stride;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t i = r * group + g;
        const T* src = qrow + (h * group + g) * dim;
        float* dst = qv.data() + ((h - item.h0) * m_count + i) * dim;
        for (int64_t d = 0; d < dim; ++d) dst[d] = to_float(src[d]) * q_scale;
      }
    }
  }
  const int64_t key_end = prefix + item.row0 + rows;
  const bool direct = m_count <= kDirectQueries;
  if (!(direct && attend_direct_fast<C>(item.h0, item.h1, qv.data(), m_count, limit.data(),
                                        key_end, k_cache, v_cache, token_row, kv_row, dim,
                                        acc.data(), run_max.data(), run_sum.data()))) {
    for (int64_t h = item.h0; h < item.h1; ++h) {
      const int64_t o = (h - item.h0) * m_count;
      float* const hq = qv.data() + o * dim;
      float* const ha = acc.data() + o * dim;
      float* const hm = run_max.data() + o;
      float* const hs = run_sum.data() + o;
      if (direct) {
        attend_direct<C>(h, hq, m_count, limit.data(), key_end, k_cache, v_cache, token_row,
                         kv_row, dim, ha, hm, hs);
      } else if (!attend_gathered_fast<C>(h, hq, m_count, limit.data(), key_end, k_cache,
                                          v_cache, token_row, kv_row, dim, ha, hm, hs)) {
        attend_gathered<C>(h, hq, m_count, limit.data(), key_end, k_cache, v_cache, token_row,
                           kv_row, dim, ha, hm, hs);
      }
    }
  }
  for (int64_t h = item.h0; h < item.h1; ++h) {
    for (int64_t r = 0; r < rows; ++r) {
      T* orow = out + (q_start + item.row0 + r) * heads * dim;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t i = (h - item.h0) * m_count + r * group + g;
        // A sink (gpt-oss) is one more term of the denominator, exp(sink - max) in the running
        // softmax's scale, and none of the numerator: only the normalization changes.
        const float sink = sinks ? std::exp(sinks[h * group + g] - run_max[i]) : 0.0f;
        const float inv = v_scale / (run_sum[i] + sink);
        T* dst = orow + (h * group + g) * dim;
        for (int64_t d = 0; d < dim; ++d) dst[d] = from_float<T>(acc[i * dim + d] * inv);
      }
    }
  }
}

}  // namespace

void decode_attention_heads(const float* q_row, const void* k_cache, const void* v_cache,
                            KvElem cache, float k_scale, float v_scale, int64_t kv_heads,
                            int64_t head_dim, const int64_t* token_row, int64_t prefix,
                            int64_t heads, int64_t h0, int64_t h1, float scale, float* out_row) {
  // The work item paged_attention makes for one new token of a request (keys [0, prefix]).
  const WorkItem item{0, 0, h0, h1, 0};
  auto attend = [&](auto tag) {
    using C = decltype(tag);
    attend_item<float, C>(item, q_row, heads * head_dim, static_cast<const C*>(k_cache),
                          static_cast<const C*>(v_cache), token_row, prefix, 1, 0, heads,
                          kv_heads, head_dim, scale, out_row, nullptr, k_scale, v_scale);
  };
  with_kv_elem(cache, attend);
}

void set_attention_query_rows(int64_t rows) {
  TORCH_CHECK(rows == 1 || rows == kQueryRows, "attention query rows per item: 1 or ",
              kQueryRows);
  g_query_rows.store(rows);
}

int64_t attention_query_rows() { return g_query_rows.load(); }

// q: [T, H*D] (rows may be strided); k_cache, v_cache: [S, Hkv, D] (float32, bfloat16, or 8-bit
// codes of K / k_scale and V / v_scale); req_to_token: [R, L] int64;
// per request b: req_pool_indices[b], prefix_lens[b], extend_lens[b], and q_starts[b], the row
// of its first new token in q. Returns out [T, H*D].
namespace {

at::Tensor paged_attention_impl(const at::Tensor& q, const at::Tensor& k_cache,
                                const at::Tensor& v_cache, const at::Tensor& req_to_token,
                                const at::Tensor& req_pool_indices,
                                const at::Tensor& prefix_lens, const at::Tensor& extend_lens,
                                const at::Tensor& q_starts, int64_t heads, double scale,
                                const float* sinks, double k_scale, double v_scale) {
  check_cpu(q, "q");
  TORCH_CHECK(k_scale > 0.0 && v_scale > 0.0, "KV scales must be positive");
  TORCH_CHECK(q.dim() == 2 && q.stride(1) == 1, "q must be [tokens, heads * dim], unit stride");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "KV caches must be contiguous [slots, kv_heads, dim]");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "KV caches must share a dtype");
  TORCH_CHECK(req_to_token.scalar_type() == at::kLong && req_to_token.is_contiguous(),
              "req_to_token must be a contiguous int64 table");
  const int64_t kv_heads = k_cache.size(1), dim = k_cache.size(2);
  TORCH_CHECK(q.size(1) == heads * dim, "q's width must be heads * head_dim");
  TORCH_CHECK(heads % kv_heads == 0, "heads must be a multiple of kv_heads");
  auto rpi = req_pool_indices.contiguous(), pre = prefix_lens.contiguous();
  auto ext = extend_lens.contiguous(), qs = q_starts.contiguous();
  const int64_t batch = rpi.numel();
  const int64_t* rp = rpi.data_ptr<int64_t>();
  const int64_t* pp = pre.data_ptr<int64_t>();
  const int64_t* ep = ext.data_ptr<int64_t>();
  const int64_t* sp = qs.data_ptr<int64_t>();
  const int64_t max_len = req_to_token.size(1);
  const int64_t block = g_query_rows.load(std::memory_order_relaxed);
  std::vector<WorkItem> items;
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(rp[b] >= 0 && rp[b] < req_to_token.size(0), "req_pool_index out of range");
    TORCH_CHECK(pp[b] >= 0 && ep[b] >= 0 && pp[b] + ep[b] <= max_len, "lengths out of range");
    TORCH_CHECK(sp[b] >= 0 && sp[b] + ep[b] <= q.size(0), "q_starts out of range");
    for (int64_t r0 = 0; r0 < ep[b]; r0 += block) {
      const int64_t rows = std::min(block, ep[b] - r0);
      items.push_back({b, r0, 0, kv_heads, rows * (pp[b] + r0 + rows)});
    }
  }
  // One item per block of query rows covers all KV heads (each token's K/V row read in one
  // pass, see attend_direct_avx2) when there are enough blocks to keep every thread busy;
  // otherwise (a single decode, a short extend) one item per KV head.
  // Batch-invariant mode (one row per item) always splits: whether a row's heads share an
  // item must not depend on how many other rows the batch has.
  const bool split = block == 1 || static_cast<int64_t>(items.size()) < 2 * at::get_num_threads();
  if (split && kv_heads > 1) {
    std::vector<WorkItem> per_head;
    for (const WorkItem& it : items) {
      for (int64_t h = 0; h < kv_heads; ++h) {
        per_head.push_back({it.req, it.row0, h, h + 1, it.cost / kv_heads});
      }
    }
    items.swap(per_head);
  }
  // Costs differ (a causal prefill's last rows see all keys, its first almost none): threads
  // take the heaviest remaining item from a shared counter (parallel_grab).
  std::stable_sort(items.begin(), items.end(),
                   [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  auto out = at::empty({q.size(0), heads * dim}, q.options());
  const int64_t* r2t = req_to_token.data_ptr<int64_t>();
  dispatch_float_bf16(q.scalar_type(), "attn_q", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    using T = scalar_t;
    dispatch_kv_cache(k_cache.scalar_type(), "attn_kv", [&](auto tag_) {
    using scalar_t = decltype(tag_);
          using C = scalar_t;
          const T* qp = q.data_ptr<T>();
          const C* kc = k_cache.data_ptr<C>();
          const C* vc = v_cache.data_ptr<C>();
          T* op = out.data_ptr<T>();
          parallel_grab(static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
            for (int64_t w = b; w < e; ++w) {
              const WorkItem& it = items[w];
              attend_item<T, C>(it, qp, q.stride(0), kc, vc, r2t + rp[it.req] * max_len,
                                pp[it.req], ep[it.req], sp[it.req], heads, kv_heads, dim,
                                static_cast<float>(scale), op, sinks,
                                static_cast<float>(k_scale), static_cast<float>(v_scale));
            }
          });
        });
  });
  return out;
}

}  // namespace

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& req_to_token,
                           const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens,
                           const at::Tensor& extend_lens, const at::Tensor& q_starts,
                           int64_t heads, double scale, double k_scale, double v_scale) {
  return paged_attention_impl(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens,
                              extend_lens, q_starts, heads, scale, nullptr, k_scale, v_scale);
}

// paged_attention with a learned sink logit per query head (gpt-oss): sinks float32 [heads].
at::Tensor paged_attention_sinks(const at::Tensor& q, const at::Tensor& k_cache,
                                 const at::Tensor& v_cache, const at::Tensor& req_to_token,
                                 const at::Tensor& req_pool_indices,
                                 const at::Tensor& prefix_lens, const at::Tensor& extend_lens,
                                 const at::Tensor& q_starts, int64_t heads, double scale,
                                 const at::Tensor& sinks, double k_scale, double v_scale) {
  TORCH_CHECK(sinks.scalar_type() == at::kFloat && sinks.is_contiguous() &&
                  sinks.numel() == heads,
              "sinks must be a contiguous float32 [heads]");
  return paged_attention_impl(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens,
                              extend_lens, q_starts, heads, scale, sinks.data_ptr<float>(),
                              k_scale, v_scale);
}

}  // namespace radixserve
