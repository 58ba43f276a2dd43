// Fused element-wise kernels: RMSNorm (with the residual add), SiLU-and-mul, and RoPE applied
// in place to q and k with k and v stored into the paged KV cache in the same pass.
// Each replaces 5 to 25 small eager ops per layer; the arithmetic is float32 throughout.
#include "common.h"
#include "single_row.h"

namespace radixserve {
namespace {

template <typename T>
void rms_norm_row(const T* x, const T* w, T* out, int64_t d, float eps) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < d; ++i) {
    const float v = to_float(x[i]);
    sum += v * v;
  }
  const float inv = 1.0f / __builtin_sqrtf(sum / static_cast<float>(d) + eps);
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) {
    // Round to the model dtype before the weight, as the reference does.
    const float normed = to_float(from_float<T>(to_float(x[i]) * inv));
    out[i] = from_float<T>(to_float(w[i]) * normed);
  }
}

int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(work_per_item, 1));
}

// rr <- xr + rr; xr <- rms_norm(rr) * w (one row).
template <typename T>
void add_rms_norm_row(T* xr, T* rr, const T* wp, int64_t d, float eps) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) rr[i] = from_float<T>(to_float(xr[i]) + to_float(rr[i]));
  rms_norm_row(rr, wp, xr, d, eps);
}

template <typename T>
void fused_add_rms_norm_rows(T* xp, T* rp, const T* wp, int64_t rows, int64_t d, float eps) {
  at::parallel_for(0, rows, grain_for(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) add_rms_norm_row(xp + r * d, rp + r * d, wp, d, eps);
  });
}

// o[i] = silu(gate[i]) * up[i] for i in [0, n): eight at a time, then one at a time. A span
// that starts at a multiple of 8 of its row treats every element as the whole row does.
#if defined(__AVX2__)
// silu(g) * u on 8 lanes, the scalar loop's steps.
inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 e = fast_exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }

// float32 -> 8 bfloat16 rounded as c10::BFloat16 rounds (nearest even; NaN -> 0x7FC0), so the
// lanes hold what from_float<BFloat16> gives one value at a time.
inline void store8(c10::BFloat16* p, __m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(nan));
  // Pack the eight 32-bit lanes (each < 2^16) into 16-bit words, in order.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
#endif

template <typename T>
void silu_mul_span(const T* gate, const T* up, T* o, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  // bfloat16 rows (a bf16 model's MLP) take the same float arithmetic, widened and rounded 8
  // at a time; one value at a time they were 10x slower (the scalar exp), 15% of a batch-64
  // step.
  for (; i + 8 <= n; i += 8) store8(o + i, silu_mul8(load8(gate + i), load8(up + i)));
#endif
  for (; i < n; ++i) {
    const float g = to_float(gate[i]);
    o[i] = from_float<T>(g / (1.0f + fast_exp(-g)) * to_float(up[i]));
  }
}

template <typename T>
void silu_and_mul_rows(const T* xp, T* op, int64_t rows, int64_t d, int64_t stride) {
  at::parallel_for(0, rows, grain_for(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = xp + r * stride;
      silu_mul_span(gate, gate + d, op + r * d, d);
    }
  });
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [tokens, hidden] tensor");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "weight and x must share a dtype");
  auto out = at::empty_like(x);
  const int64_t rows = x.size(0), d = x.size(1);
  dispatch_float_bf16(x.scalar_type(), "rms_norm", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = weight.contiguous().data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain_for(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        rms_norm_row(xp + r * d, wp, op + r * d, d, static_cast<float>(eps));
      }
    });
  });
  return out;
}

// residual <- x + residual; x <- rms_norm(residual) * weight. Both in place.
void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                        double eps) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && residual.is_contiguous(),
              "x and residual must be contiguous [tokens, hidden] tensors");
  TORCH_CHECK(x.sizes() == residual.sizes(), "x and residual must have the same shape");
  TORCH_CHECK(x.scalar_type() == residual.scalar_type() &&
                  weight.scalar_type() == x.scalar_type(),
              "x, residual and weight must share a dtype");
  const int64_t rows = x.size(0), d = x.size(1);
  dispatch_float_bf16(x.scalar_type(), "fused_add_rms_norm", [&](auto tag_) {
    using scalar_t = decltype(tag_);
        fused_add_rms_norm_rows(x.data_ptr<scalar_t>(), residual.data_ptr<scalar_t>(),
                                weight.contiguous().data_ptr<scalar_t>(), rows, d,
                                static_cast<float>(eps));
      });
}

// x: [tokens, 2d] = [gate | up] -> silu(gate) * up, [tokens, d].
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) % 2 == 0,
              "x must be [tokens, 2 * d] with unit stride in the last dimension");
  const int64_t rows = x.size(0), d = x.size(1) / 2, stride = x.stride(0);
  auto out = at::empty({rows, d}, x.options());
  dispatch_float_bf16(x.scalar_type(), "silu_and_mul", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    silu_and_mul_rows(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, d, stride);
  });
  return out;
}

namespace {

template <typename T>
inline void rotate_head(T* x, const float* cos, const float* sin, int64_t rot, bool neox) {
  const int64_t half = rot / 2;
  if (neox) {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
      x[i] = from_float<T>(x1 * cos[i] - x2 * sin[i]);
      x[i + half] = from_float<T>(x2 * cos[i] + x1 * sin[i]);
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = to_float(x[2 * i]), x2 = to_float(x[2 * i + 1]);
      x[2 * i] = from_float<T>(x1 * cos[i] - x2 * sin[i]);
      x[2 * i + 1] = from_float<T>(x2 * cos[i] + x1 * sin[i]);
    }
  }
}

// dst = src / scale in the cache's type. Float caches have scale 1 (x / 1 is x exactly); an
// 8-bit cache divides, as the PyTorch reference does, so both round to the same code.
template <typename T, typename C>
inline void store_row(C* dst, const T* src, int64_t n, float scale) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = from_float<C>(to_float(src[i]) / scale);
}

// One token: RoPE on its q and k heads in place, then k and v stored into KV rows kc_row, vc_row.
template <typename T, typename C>
inline void rope_store_token(T* qt, T* kt, const T* vt, const float* cos, int64_t heads,
                             int64_t kv_heads, int64_t head_dim, int64_t rot_dim, bool neox,
                             C* kc_row, C* vc_row, float k_scale, float v_scale) {
  const float* sin = cos + rot_dim / 2;
  for (int64_t h = 0; h < heads; ++h) rotate_head(qt + h * head_dim, cos, sin, rot_dim, neox);
  for (int64_t h = 0; h < kv_heads; ++h) rotate_head(kt + h * head_dim, cos, sin, rot_dim, neox);
  store_row(kc_row, kt, kv_heads * head_dim, k_scale);
  store_row(vc_row, vt, kv_heads * head_dim, v_scale);
}

}  // namespace

void add_rms_norm_row_f32(float* x, float* residual, const float* weight, int64_t d, float eps) {
  add_rms_norm_row(x, residual, weight, d, eps);
}

void rms_norm_row_f32(const float* x, const float* weight, float* out, int64_t d, float eps) {
  rms_norm_row(x, weight, out, d, eps);
}

void silu_mul_span_f32(const float* gate, const float* up, float* out, int64_t n) {
  silu_mul_span(gate, up, out, n);
}

void rope_store_token_f32(float* q, float* k, const float* v, const float* cos, int64_t heads,
                          int64_t kv_heads, int64_t head_dim, int64_t rot_dim, bool neox,
                          void* k_cache_row, void* v_cache_row, KvElem cache, float k_scale,
                          float v_scale) {
  auto store = [&](auto tag) {
    using C = decltype(tag);
    rope_store_token(q, k, v, cos, heads, kv_heads, head_dim, rot_dim, neox,
                     static_cast<C*>(k_cache_row), static_cast<C*>(v_cache_row), k_scale,
                     v_scale);
  };
  with_kv_elem(cache, store);
}

// RoPE on q [T, H*D] and k [T, Hkv*D] in place (rows may be strided views of a fused qkv),
// then k / k_scale and v / v_scale [T, Hkv*D] stored at KV slots `slots` of k_cache / v_cache
// [S, Hkv, D] (an 8-bit cache saturating at its format's largest value; scales 1 otherwise).
void rope_store_kv(at::Tensor& q, at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& positions, const at::Tensor& cos_sin, at::Tensor& k_cache,
                   at::Tensor& v_cache, const at::Tensor& slots, int64_t head_dim,
                   int64_t rot_dim, bool neox, double k_scale, double v_scale) {
  TORCH_CHECK(k_scale > 0.0 && v_scale > 0.0, "KV scales must be positive");
  check_cpu(q, "q");
  TORCH_CHECK(q.dim() == 2 && k.dim() == 2 && v.dim() == 2, "q, k, v must be 2-D");
  TORCH_CHECK(q.stride(1) == 1 && k.stride(1) == 1 && v.stride(1) == 1,
              "q, k, v need unit stride in the last dimension");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "q, k, v must share a dtype");
  TORCH_CHECK(cos_sin.scalar_type() == at::kFloat && cos_sin.is_contiguous(),
              "cos_sin must be a contiguous float32 table");
  TORCH_CHECK(positions.scalar_type() == at::kLong && slots.scalar_type() == at::kLong,
              "positions and slots must be int64");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "KV caches must be contiguous");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "KV caches must share a dtype");
  const int64_t tokens = q.size(0);
  const int64_t heads = q.size(1) / head_dim, kv_heads = k.size(1) / head_dim;
  TORCH_CHECK(k_cache.size(1) == kv_heads && k_cache.size(2) == head_dim,
              "k_cache must be [slots, kv_heads, head_dim]");
  TORCH_CHECK(positions.numel() == tokens && slots.numel() == tokens,
              "positions and slots need one entry per token");
  const int64_t max_pos = cos_sin.size(0);
  const int64_t* pos = positions.contiguous().data_ptr<int64_t>();
  const int64_t* slot = slots.contiguous().data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "position out of the RoPE table");
    TORCH_CHECK(slot[t] >= 0 && slot[t] < k_cache.size(0), "KV slot out of range");
  }
  const float* table = cos_sin.data_ptr<float>();
  const int64_t row = kv_heads * head_dim;
  dispatch_float_bf16(q.scalar_type(), "rope", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    using T = scalar_t;
    dispatch_kv_cache(k_cache.scalar_type(), "rope_store", [&](auto tag_) {
    using scalar_t = decltype(tag_);
          using C = scalar_t;
          T* qp = q.data_ptr<T>();
          T* kp = k.data_ptr<T>();
          const T* vp = v.data_ptr<T>();
          C* kc = k_cache.data_ptr<C>();
          C* vc = v_cache.data_ptr<C>();
          at::parallel_for(0, tokens, grain_for((heads + kv_heads) * head_dim), [&](int64_t b,
                                                                                      int64_t e) {
            for (int64_t t = b; t < e; ++t) {
              rope_store_token(qp + t * q.stride(0), kp + t * k.stride(0), vp + t * v.stride(0),
                               table + pos[t] * rot_dim, heads, kv_heads, head_dim, rot_dim,
                               neox, kc + slot[t] * row, vc + slot[t] * row,
                               static_cast<float>(k_scale), static_cast<float>(v_scale));
            }
          });
        });
  });
}

}  // namespace radixserve
