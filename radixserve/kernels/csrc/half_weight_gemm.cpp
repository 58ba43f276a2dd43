// float32 activations times 16-bit (bfloat16 or float16) weights: a bf16/fp16 checkpoint served
// in float32 keeps its weights at their own size and widens them as it multiplies (exact: every
// 16-bit value is a float32 value), so memory and the bytes read per token are half a float32
// copy's. Small batches: per output column, 8 weights widened at a time and multiplied into up
// to 4 activation rows; many rows: the packed micro-kernel of gemm_micro.h, its panels widened
// while packed.
#include "gemm_micro.h"
#include "gguf_blocks.h"
#include "gguf_kquant.h"
#include "kernels.h"

namespace radixserve {
namespace {

constexpr int64_t kHalfTiledMinRows = 8;  // from here the packed float GEMM over widened panels

#if defined(__AVX2__)
// 8 weights at p as float32.
template <bool kBf16>
inline __m256 widen8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (kBf16) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(h);
  }
}

template <bool kBf16, int R>
void dot_rows(const uint16_t* w, const float* x, int64_t ldx, int64_t k, float* out,
              int64_t out_stride) {
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 8) {
    const __m256 wv = widen8<kBf16>(w + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * ldx + i), acc[r]);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r * out_stride] = gguf::hsum(acc[r]);
}

template <bool kBf16>
void pack_half_panel(const uint16_t* w, int64_t ldw, int64_t k, int64_t cols, float* panel) {
  micro::pack_rows_panel(w, ldw, k, cols, panel,
                         [](const uint16_t* row, int64_t k0) { return widen8<kBf16>(row + k0); });
}

template <bool kBf16>
void half_linear(const float* xp, int64_t ldx, const uint16_t* wp, int64_t m, int64_t n,
                 int64_t k, float* op) {
  if (m >= kHalfTiledMinRows) {
    micro::packed_gemm(xp, ldx, m, n, k, op, [&](int64_t c0, int64_t cols, float* panel) {
      pack_half_panel<kBf16>(wp + c0 * k, k, k, cols, panel);
    });
    return;
  }
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t col = begin; col < end; ++col) {
      const uint16_t* w = wp + col * k;
      for (int64_t r = 0; r < m; r += 4) {
        float* o = op + r * n + col;
        const float* x = xp + r * ldx;
        gguf::with_row_tile(std::min<int64_t>(4, m - r), [&](auto tile) {
          dot_rows<kBf16, decltype(tile)::value>(w, x, ldx, k, o, n);
        });
      }
    }
  });
}
#endif

}  // namespace

bool half_weight_linear_available() {
#if defined(__AVX2__)
  return true;
#else
  return false;
#endif
}

// x: [M, K] float32 (unit stride in K); w: [N, K] contiguous bfloat16 or float16 with K a
// multiple of 8. Returns x @ w^T (+ bias) in float32.
at::Tensor half_weight_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  TORCH_CHECK(half_weight_linear_available(), "half_weight_linear needs AVX2");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1,
              "x must be float32 [M, K] with unit stride");
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  TORCH_CHECK((bf16 || w.scalar_type() == at::kHalf) && w.dim() == 2 && w.is_contiguous(),
              "w must be a contiguous bfloat16 or float16 [N, K]");
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  TORCH_CHECK(w.size(1) == k && k % 8 == 0, "w must be [N, K] with K a multiple of 8");
  auto out = at::empty({m, n}, x.options());
#if defined(__AVX2__)
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  if (bf16) {
    half_linear<true>(x.data_ptr<float>(), x.stride(0), wp, m, n, k, out.data_ptr<float>());
  } else {
    half_linear<false>(x.data_ptr<float>(), x.stride(0), wp, m, n, k, out.data_ptr<float>());
  }
#endif
  return bias.defined() && bias.numel() > 0 ? out.add_(bias) : out;
}

}  // namespace radixserve
