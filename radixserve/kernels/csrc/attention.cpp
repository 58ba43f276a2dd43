// Attention over the paged KV cache, read through the request-to-token table (no gather of the
// whole K/V into a temporary). One kernel serves decode (one new token per request) and extend
// (prefill, chunked prefill, prefill over a cached prefix): new token j of request b sits at
// position prefix_lens[b] + j and sees keys [0, prefix_lens[b] + j].
// Work is split over (request, kv head, block of query rows); each item streams its keys in
// blocks with an online softmax, so memory use is independent of the context length.
#include <algorithm>
#include <vector>

#include "common.h"
#include "gemm_micro.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace radixserve {
namespace {

constexpr int64_t kQueryRows = 8;  // query rows per work item (times the GQA group size)
constexpr int64_t kKeyBlock = 64;  // keys per block
constexpr int64_t kDirectQueries = 8;  // up to this many query vectors: no K/V gather

struct WorkItem {
  int64_t req;
  int64_t row0;  // first query row of the block, relative to the request's new tokens
  int64_t kv_head;
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
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// q . k for 4 key rows at once: four independent accumulator chains, one horizontal reduction
// for all four (a single chain per dot product waits on every FMA's latency).
template <typename C>
inline __m128 dot4(const float* q, const C* k0, const C* k1, const C* k2, const C* k3,
                   int64_t dim) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t d = 0; d < dim; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    a0 = _mm256_fmadd_ps(qv, load8(k0 + d), a0);
    a1 = _mm256_fmadd_ps(qv, load8(k1 + d), a1);
    a2 = _mm256_fmadd_ps(qv, load8(k2 + d), a2);
    a3 = _mm256_fmadd_ps(qv, load8(k3 + d), a3);
  }
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// attend_direct for M query vectors and head_dim a multiple of 8, in AVX2: scores four keys at
// a time, and P.V with the M accumulators of each 8-wide slice of the head in registers.
template <typename C, int M>
void attend_direct_avx2(int64_t kv_head, const float* qv, const int64_t* limit, int64_t key_end,
                        const C* k_cache, const C* v_cache, const int64_t* token_row,
                        int64_t kv_row, int64_t dim, float* acc, float* run_max,
                        float* run_sum) {
  alignas(32) float scores[M * kKeyBlock];
  const C* krow[kKeyBlock];
  const C* vrow[kKeyBlock];
  for (int64_t k0 = 0; k0 < key_end; k0 += kKeyBlock) {
    const int64_t kb = std::min(kKeyBlock, key_end - k0);
    for (int64_t j = 0; j < kb; ++j) {
      krow[j] = k_cache + token_row[k0 + j] * kv_row + kv_head * dim;
      vrow[j] = v_cache + token_row[k0 + j] * kv_row + kv_head * dim;
    }
    for (int64_t j = 0; j < kb; j += 4) {
      // A tail of fewer than 4 keys repeats the last one: the same arithmetic for every key.
      const C* k1 = krow[std::min(j + 1, kb - 1)];
      const C* k2 = krow[std::min(j + 2, kb - 1)];
      const C* k3 = krow[std::min(j + 3, kb - 1)];
      for (int i = 0; i < M; ++i) {
        alignas(16) float four[4];
        _mm_store_ps(four, dot4(qv + i * dim, krow[j], k1, k2, k3, dim));
        for (int64_t t = 0; t < 4 && j + t < kb; ++t) scores[i * kKeyBlock + j + t] = four[t];
      }
    }
    for (int i = 0; i < M; ++i) {
      const int64_t valid = std::max<int64_t>(0, std::min(kb, limit[i] - k0));
      float* sp = scores + i * kKeyBlock;
      if (valid > 0) softmax_update(sp, valid, run_max + i, run_sum + i, acc + i * dim, dim);
      // Keys this query may not see weigh exactly 0 (their K/V rows are written, finite).
      for (int64_t j = valid; j < kb; ++j) sp[j] = 0.0f;
    }
    for (int64_t d = 0; d < dim; d += 8) {
      __m256 a[M];
      for (int i = 0; i < M; ++i) a[i] = _mm256_loadu_ps(acc + i * dim + d);
      for (int64_t j = 0; j < kb; ++j) {
        const __m256 v = load8(vrow[j] + d);
        for (int i = 0; i < M; ++i) {
          a[i] = _mm256_fmadd_ps(_mm256_set1_ps(scores[i * kKeyBlock + j]), v, a[i]);
        }
      }
      for (int i = 0; i < M; ++i) _mm256_storeu_ps(acc + i * dim + d, a[i]);
    }
  }
}

// Runs attend_direct_avx2 when it applies (AVX2, head_dim % 8 == 0); false otherwise.
template <typename C>
bool attend_direct_fast(int64_t kv_head, const float* qv, int64_t m_count, const int64_t* limit,
                        int64_t key_end, const C* k_cache, const C* v_cache,
                        const int64_t* token_row, int64_t kv_row, int64_t dim, float* acc,
                        float* run_max, float* run_sum) {
  if (dim % 8 != 0) return false;
#define RADIXSERVE_DIRECT(M)                                                                  \
  case M:                                                                                     \
    attend_direct_avx2<C, M>(kv_head, qv, limit, key_end, k_cache, v_cache, token_row, kv_row, \
                             dim, acc, run_max, run_sum);                                     \
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
bool attend_direct_fast(int64_t, const float*, int64_t, const int64_t*, int64_t, const C*,
                        const C*, const int64_t*, int64_t, int64_t, float*, float*, float*) {
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

template <typename T, typename C>
void attend_item(const WorkItem& item, const T* q, int64_t q_stride, const C* k_cache,
                 const C* v_cache, const int64_t* token_row, int64_t prefix, int64_t n_new,
                 int64_t q_start, int64_t heads, int64_t kv_heads, int64_t dim, float scale,
                 T* out) {
  const int64_t group = heads / kv_heads;
  const int64_t rows = std::min(kQueryRows, n_new - item.row0);
  const int64_t m_count = rows * group;
  const int64_t kv_row = kv_heads * dim;
  std::vector<float> qv(m_count * dim), acc(m_count * dim, 0.0f);
  std::vector<float> run_max(m_count, -1e30f), run_sum(m_count, 0.0f);
  std::vector<int64_t> limit(m_count);
  for (int64_t r = 0; r < rows; ++r) {
    const T* qrow = q + (q_start + item.row0 + r) * q_stride;
    for (int64_t g = 0; g < group; ++g) {
      const int64_t i = r * group + g;
      const T* src = qrow + (item.kv_head * group + g) * dim;
      for (int64_t d = 0; d < dim; ++d) qv[i * dim + d] = to_float(src[d]) * scale;
      limit[i] = prefix + item.row0 + r + 1;  // keys [0, limit) are visible
    }
  }
  const int64_t key_end = prefix + item.row0 + rows;
  if (m_count <= kDirectQueries &&
      attend_direct_fast<C>(item.kv_head, qv.data(), m_count, limit.data(), key_end, k_cache,
                            v_cache, token_row, kv_row, dim, acc.data(), run_max.data(),
                            run_sum.data())) {
    // done
  } else if (m_count <= kDirectQueries) {
    attend_direct<C>(item.kv_head, qv.data(), m_count, limit.data(), key_end, k_cache, v_cache,
                     token_row, kv_row, dim, acc.data(), run_max.data(), run_sum.data());
  } else if (!attend_gathered_fast<C>(item.kv_head, qv.data(), m_count, limit.data(), key_end,
                                      k_cache, v_cache, token_row, kv_row, dim, acc.data(),
                                      run_max.data(), run_sum.data())) {
    attend_gathered<C>(item.kv_head, qv.data(), m_count, limit.data(), key_end, k_cache,
                       v_cache, token_row, kv_row, dim, acc.data(), run_max.data(),
                       run_sum.data());
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* orow = out + (q_start + item.row0 + r) * heads * dim;
    for (int64_t g = 0; g < group; ++g) {
      const int64_t i = r * group + g;
      const float inv = 1.0f / run_sum[i];
      T* dst = orow + (item.kv_head * group + g) * dim;
      for (int64_t d = 0; d < dim; ++d) dst[d] = from_float<T>(acc[i * dim + d] * inv);
    }
  }
}

}  // namespace

// q: [T, H*D] (rows may be strided); k_cache, v_cache: [S, Hkv, D]; req_to_token: [R, L] int64;
// per request b: req_pool_indices[b], prefix_lens[b], extend_lens[b], and q_starts[b], the row
// of its first new token in q. Returns out [T, H*D].
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& req_to_token,
                           const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens,
                           const at::Tensor& extend_lens, const at::Tensor& q_starts,
                           int64_t heads, double scale) {
  check_cpu(q, "q");
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
  std::vector<WorkItem> items;
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(rp[b] >= 0 && rp[b] < req_to_token.size(0), "req_pool_index out of range");
    TORCH_CHECK(pp[b] >= 0 && ep[b] >= 0 && pp[b] + ep[b] <= max_len, "lengths out of range");
    TORCH_CHECK(sp[b] >= 0 && sp[b] + ep[b] <= q.size(0), "q_starts out of range");
    for (int64_t r0 = 0; r0 < ep[b]; r0 += kQueryRows) {
      for (int64_t h = 0; h < kv_heads; ++h) items.push_back({b, r0, h});
    }
  }
  auto out = at::empty({q.size(0), heads * dim}, q.options());
  const int64_t* r2t = req_to_token.data_ptr<int64_t>();
  dispatch_float_bf16(q.scalar_type(), "attn_q", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    using T = scalar_t;
    dispatch_float_bf16(k_cache.scalar_type(), "attn_kv", [&](auto tag_) {
    using scalar_t = decltype(tag_);
          using C = scalar_t;
          const T* qp = q.data_ptr<T>();
          const C* kc = k_cache.data_ptr<C>();
          const C* vc = v_cache.data_ptr<C>();
          T* op = out.data_ptr<T>();
          at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
            for (int64_t w = b; w < e; ++w) {
              const WorkItem& it = items[w];
              attend_item<T, C>(it, qp, q.stride(0), kc, vc, r2t + rp[it.req] * max_len,
                                pp[it.req], ep[it.req], sp[it.req], heads, kv_heads, dim,
                                static_cast<float>(scale), op);
            }
          });
        });
  });
  return out;
}

}  // namespace radixserve
