// Greedy sampling's row-wise argmax over float32 or bfloat16 logits (a bf16 model's greedy
// batch skips the float32 copy: widening is exact, so the answer is the same). Same answer as
// torch.argmax(dim=-1): the first index of the largest value, and the first NaN's index where a
// row holds one (torch treats NaN as the largest).
//
// Two passes over the row: its largest value (and whether it holds a NaN) through four
// independent max chains, then the first index holding that value, which stops there. torch's
// arg-reductions ran ~1.6 GB/s here; one pass that blended the best value and its index in a
// single chain was bound by that chain's latency (0.49 ms for a batch-64 step's 64 x 49,152
// bf16 logits on 2 cores, ~40% of the step's host time); max chains need no index at all.
#include <cmath>
#include <limits>

#include "common.h"
#include "kernels.h"

namespace radixserve {
namespace {

template <typename T>
int64_t first_nan(const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(to_float(x[i]))) return i;
  }
  return -1;
}

template <typename T>
int64_t argmax_scalar(const T* x, int64_t n) {
  if (n == 0) return 0;
  float best = to_float(x[0]);
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = to_float(x[i]);
    if (std::isnan(v)) return i;
    if (v > best) best = v, at = i;  // strictly greater: ties keep the earlier index
  }
  return at;
}

#if defined(__AVX512F__)
// One register of lanes: 16 float32 values.
struct Lanes {
  using Vec = __m512;
  static constexpr int64_t kWidth = 16;
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load(const c10::BFloat16* p) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
  static Vec fill(float v) { return _mm512_set1_ps(v); }
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static uint32_t nan_bits(Vec v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }
  static uint32_t equal_bits(Vec v, Vec t) { return _mm512_cmp_ps_mask(v, t, _CMP_EQ_OQ); }
  static float largest(Vec v) { return _mm512_reduce_max_ps(v); }
};
#elif defined(__AVX2__)
// One register of lanes: 8 float32 values.
struct Lanes {
  using Vec = __m256;
  static constexpr int64_t kWidth = 8;
  template <typename T>
  static Vec load(const T* p) {
    return load8(p);
  }
  static Vec fill(float v) { return _mm256_set1_ps(v); }
  static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static uint32_t nan_bits(Vec v) { return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)); }
  static uint32_t equal_bits(Vec v, Vec t) {
    return _mm256_movemask_ps(_mm256_cmp_ps(v, t, _CMP_EQ_OQ));
  }
  static float largest(Vec v) {
    alignas(32) float values[8];
    _mm256_store_ps(values, v);
    return *std::max_element(values, values + 8);
  }
};
#endif

#if defined(__AVX2__)
template <typename T>
int64_t argmax_row(const T* x, int64_t n) {
  using L = Lanes;
  constexpr int64_t kStep = 4 * L::kWidth;
  if (n < kStep) return argmax_scalar(x, n);
  const float lowest = -std::numeric_limits<float>::infinity();
  typename L::Vec m0 = L::fill(lowest), m1 = m0, m2 = m0, m3 = m0;
  uint32_t nan = 0;
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    const auto v0 = L::load(x + i), v1 = L::load(x + i + L::kWidth);
    const auto v2 = L::load(x + i + 2 * L::kWidth), v3 = L::load(x + i + 3 * L::kWidth);
    nan |= L::nan_bits(v0) | L::nan_bits(v1) | L::nan_bits(v2) | L::nan_bits(v3);
    m0 = L::max(m0, v0), m1 = L::max(m1, v1), m2 = L::max(m2, v2), m3 = L::max(m3, v3);
  }
  float top = L::largest(L::max(L::max(m0, m1), L::max(m2, m3)));
  for (int64_t k = i; k < n; ++k) {
    const float v = to_float(x[k]);
    nan |= std::isnan(v);
    top = v > top ? v : top;
  }
  if (nan != 0) return first_nan(x, n);
  // The first index holding `top` (-0.0 and 0.0 compare equal, as torch's > does).
  const auto target = L::fill(top);
  int64_t j = 0;
  for (; j + L::kWidth <= n; j += L::kWidth) {
    const uint32_t hits = L::equal_bits(L::load(x + j), target);
    if (hits != 0) return j + __builtin_ctz(hits);
  }
  for (; j < n; ++j) {
    if (to_float(x[j]) == top) return j;
  }
  return 0;  // unreachable: `top` is one of the row's values
}
#else
template <typename T>
int64_t argmax_row(const T* x, int64_t n) {
  return argmax_scalar(x, n);
}
#endif

}  // namespace

at::Tensor argmax_rows(const at::Tensor& logits) {
  check_cpu(logits, "logits");
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1 &&
                  (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16),
              "logits must be float32 or bfloat16 [rows, vocab] with unit stride in the "
              "vocabulary");
  TORCH_CHECK(logits.size(1) > 0 && logits.size(1) < (int64_t{1} << 31),
              "argmax_rows takes 1 to 2^31 - 1 columns");
  const int64_t rows = logits.size(0), n = logits.size(1), stride = logits.stride(0);
  auto out = at::empty({rows}, logits.options().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  dispatch_float_bf16(logits.scalar_type(), "argmax_rows", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    const scalar_t* x = logits.data_ptr<scalar_t>();
    parallel_grab(rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) o[r] = argmax_row(x + r * stride, n);
    });
  });
  return out;
}

}  // namespace radixserve
