// float32 x @ W^T for many rows with the packed micro-kernel of gemm_micro.h, for CPUs whose
// BLAS is slow: torch's CPU build uses MKL, which on AMD CPUs runs 27-50 GFLOP/s on one core
// where this kernel reaches ~67 (the core's FMA peak is ~93). Each thread packs 16 weight rows
// at a time into a k-major panel (8x8 transposes) and runs 6x16 register tiles over it.
// Whether it is used is decided once per process by a measurement (set_float_packed_min_rows,
// see kernels/ops.py): on CPUs where the BLAS is faster, at::linear stays.
#include <atomic>
#include <vector>

#include "gemm_micro.h"
#include "kernels.h"

namespace radixserve {
namespace {

std::atomic<int64_t> g_packed_min_rows{0};  // 0: never use the packed kernel

#if defined(__AVX2__)
// panel[kk * 16 + c] = W[c0 + c, kk] (zero for the padding columns); k a multiple of 8.
void pack_float_panel(const float* w, int64_t ldw, int64_t k, int64_t cols, float* panel) {
  micro::pack_rows_panel(w, ldw, k, cols, panel,
                         [](const float* row, int64_t k0) { return _mm256_loadu_ps(row + k0); });
}
#endif

}  // namespace

void set_float_packed_min_rows(int64_t rows) { g_packed_min_rows.store(rows); }

int64_t float_packed_min_rows() { return g_packed_min_rows.load(); }

bool float_packed_available() {
#if defined(__AVX2__)
  return true;
#else
  return false;
#endif
}

// x: [M, K] float32, unit stride in K; w: [N, K] contiguous float32. Returns x @ w^T.
at::Tensor float_linear_packed(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(float_packed_available(), "float_linear_packed needs AVX2");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "float_linear_packed takes float32");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && w.dim() == 2 && w.is_contiguous(),
              "x must be [M, K] with unit stride, w contiguous [N, K]");
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  TORCH_CHECK(w.size(1) == k && k % 8 == 0, "w must be [N, K] with K a multiple of 8");
  auto out = at::empty({m, n}, x.options());
#if defined(__AVX2__)
  const float* xp = x.data_ptr<float>();
  const int64_t ldx = x.stride(0);
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  micro::packed_gemm(xp, ldx, m, n, k, op, [&](int64_t c0, int64_t cols, float* panel) {
    pack_float_panel(wp + c0 * k, k, k, cols, panel);
  });
#endif
  return out;
}

// x @ w^T (+ bias; an empty bias tensor means none) for a float weight on the fast path: the
// packed kernel from the measured row count on (where it applies), else at::linear. The fused
// layer and the module path both call this, so they stay bitwise equal.
at::Tensor float_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  const bool has_bias = bias.defined() && bias.numel() > 0;
  const int64_t min_rows = g_packed_min_rows.load();
  if (min_rows > 0 && x.dim() == 2 && x.size(0) >= min_rows && x.stride(1) == 1 &&
      x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && w.dim() == 2 &&
      w.is_contiguous() && x.size(1) % 8 == 0 && float_packed_available()) {
    auto out = float_linear_packed(x, w);
    return has_bias ? out.add_(bias) : out;
  }
  return has_bias ? at::linear(x, w, bias) : at::linear(x, w);
}

}  // namespace radixserve
