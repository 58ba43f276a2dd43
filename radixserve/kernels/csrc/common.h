// Shared helpers for radixserve's CPU kernels: dtype conversion, a vectorisable exp, and work
// handed out from a shared counter.
#pragma once

// ATen only (not torch/extension.h): the kernels compile several times faster.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "single_row.h"

namespace radixserve {

template <typename T>
inline float to_float(T v) {
  return static_cast<float>(v);
}

template <typename T>
inline T from_float(float v) {
  return static_cast<T>(v);
}

// An 8-bit KV cache (--kv-cache-dtype fp8_e4m3 / fp8_e5m2) saturates: c10's conversion turns
// e4m3 values past 448 into NaN (the format has no infinity) and e5m2 ones past 57344 into
// infinity, either of which would poison a whole softmax. NaN inputs stay NaN.
template <>
inline c10::Float8_e4m3fn from_float<c10::Float8_e4m3fn>(float v) {
  constexpr float kMax = 448.0f;
  return static_cast<c10::Float8_e4m3fn>(v > kMax ? kMax : (v < -kMax ? -kMax : v));
}

template <>
inline c10::Float8_e5m2 from_float<c10::Float8_e5m2>(float v) {
  constexpr float kMax = 57344.0f;
  return static_cast<c10::Float8_e5m2>(v > kMax ? kMax : (v < -kMax ? -kMax : v));
}

// exp(x), written branch-free so that loops calling it vectorise: x = k ln2 + r, exp(r) by a
// degree-6 polynomial (Cephes' expf coefficients), 2^k assembled in the exponent bits.
// Relative error ~2 ulp; clamped to [-87, 88] (below -87 the result is ~1e-38, not 0).
inline float fast_exp(float x) {
  x = x > 88.0f ? 88.0f : x;
  x = x < -87.0f ? -87.0f : x;
  const float k = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = x - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

#if defined(__AVX2__)
// fast_exp on 8 lanes with explicit AVX2 intrinsics: GCC does not vectorise the scalar version
// inside `omp simd` loops (floorf and the bit cast stay scalar), which made silu_and_mul 4.5x
// slower than torch's. Same steps and constants as fast_exp.
inline __m256 fast_exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 k = _mm256_floor_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fmadd_ps(k, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

// 8 values as float32: float as is, bfloat16 widened exactly (its bits are a float's high half).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
#endif

// Calls f(T{}) for T = float or c10::BFloat16 (the dtypes the kernels are built for; others
// take the PyTorch path). Fewer instantiations than AT_DISPATCH_* keep the build short.
template <typename F>
inline void dispatch_float_bf16(at::ScalarType type, const char* name, F&& f) {
  if (type == at::kFloat) {
    f(float{});
  } else if (type == at::kBFloat16) {
    f(c10::BFloat16{});
  } else {
    TORCH_CHECK(false, name, ": only float32 and bfloat16 are supported, got ", type);
  }
}

// Calls f(C{}) for the KV cache element types: float, bfloat16 and the two 8-bit formats
// (their values times a per-layer scale; the kernels widen them to float in registers).
template <typename F>
inline void dispatch_kv_cache(at::ScalarType type, const char* name, F&& f) {
  if (type == at::kFloat) {
    f(float{});
  } else if (type == at::kBFloat16) {
    f(c10::BFloat16{});
  } else if (type == at::kFloat8_e4m3fn) {
    f(c10::Float8_e4m3fn{});
  } else if (type == at::kFloat8_e5m2) {
    f(c10::Float8_e5m2{});
  } else {
    TORCH_CHECK(false, name, ": KV caches are float32, bfloat16, float8_e4m3fn or float8_e5m2, got ",
                type);
  }
}

inline void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
}

// f(element{}) for a raw KV cache row of element type `cache` (single_row.h's KvElem): the
// single-row pieces' one switch from the enum to the element type.
template <typename F>
void with_kv_elem(KvElem cache, const F& f) {
  switch (cache) {
    case KvElem::kBFloat16:
      f(c10::BFloat16{});
      return;
    case KvElem::kFp8E4M3:
      f(c10::Float8_e4m3fn{});
      return;
    case KvElem::kFp8E5M2:
      f(c10::Float8_e5m2{});
      return;
    default:
      f(float{});
  }
}

// fn(begin, end) over [0, n) in ranges of `grab`, which the threads take from a shared counter
// until none is left, instead of a fixed contiguous share each: on a shared machine one thread
// is often descheduled for a while, and with fixed shares the others wait for it at the end.
// Ranges are disjoint, so anything fn computes per index does not depend on the thread.
template <typename Fn>
void parallel_grab(int64_t n, int64_t grab, const Fn& fn) {
  const int64_t ranges = (n + grab - 1) / grab;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), ranges));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t b = next.fetch_add(grab); b < n; b = next.fetch_add(grab)) {
      fn(b, std::min(n, b + grab));
    }
  });
}

}  // namespace radixserve
