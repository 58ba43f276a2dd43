// GGUF matmul for many activation rows (prefill): each weight column block is dequantized once
// to float32 (in a per-thread buffer that stays in L2), and a 4-row x 2-column register tile of
// float FMAs runs over it. At 16+ rows the dequantization is amortised and the FMAs keep both
// vector units busy, where the integer path (int16 activations, one scale multiply per block)
// spends most of its instructions on conversions. Activations stay float32: no rounding of x.
#include <vector>

#include "gguf_blocks.h"

namespace radixserve {
namespace {

using gguf::half_to_float;
using gguf::kQ4_1;
using gguf::kQ4_1Bytes;
using gguf::kQ8_0;
using gguf::kQ8_0Bytes;
constexpr int64_t kBlockW = gguf::kBlock;
constexpr int64_t kColBlock = 32;  // weight columns dequantized at a time, per thread

// One weight row (K values) from its GGUF blocks, as dequantize_blocks computes it.
void dequantize_row(const uint8_t* row, int64_t qtype, int64_t k, float* out) {
  const int64_t nb = k / kBlockW;
  for (int64_t b = 0; b < nb; ++b) {
    float* o = out + b * kBlockW;
    if (qtype == kQ4_1) {
      const uint8_t* blk = row + b * kQ4_1Bytes;
      const float d = half_to_float(blk), m = half_to_float(blk + 2);
      for (int64_t i = 0; i < 16; ++i) {
        o[i] = d * static_cast<float>(blk[4 + i] & 0x0F) + m;
        o[i + 16] = d * static_cast<float>(blk[4 + i] >> 4) + m;
      }
    } else {
      const uint8_t* blk = row + b * kQ8_0Bytes;
      const float d = half_to_float(blk);
      const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
      for (int64_t i = 0; i < kBlockW; ++i) o[i] = d * static_cast<float>(q[i]);
    }
  }
}

#if defined(__AVX2__)
using gguf::hsum;

// out[r, c] = x[r, :] . w_c for R rows and 2 columns; k a multiple of 8.
template <int R>
void tile(const float* x, int64_t ldx, const float* w0, const float* w1, int64_t k, float* out,
          int64_t ldo, bool second) {
  __m256 a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < k; kk += 8) {
    const __m256 v0 = _mm256_loadu_ps(w0 + kk), v1 = _mm256_loadu_ps(w1 + kk);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * ldx + kk);
      a0[r] = _mm256_fmadd_ps(xv, v0, a0[r]);
      a1[r] = _mm256_fmadd_ps(xv, v1, a1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    out[r * ldo] = hsum(a0[r]);
    if (second) out[r * ldo + 1] = hsum(a1[r]);
  }
}

void tile_rows(int64_t rows, const float* x, int64_t ldx, const float* w0, const float* w1,
               int64_t k, float* out, int64_t ldo, bool second) {
  switch (rows) {
    case 1: tile<1>(x, ldx, w0, w1, k, out, ldo, second); break;
    case 2: tile<2>(x, ldx, w0, w1, k, out, ldo, second); break;
    case 3: tile<3>(x, ldx, w0, w1, k, out, ldo, second); break;
    default: tile<4>(x, ldx, w0, w1, k, out, ldo, second); break;
  }
}
#endif

}  // namespace

bool gguf_tiled_available() {
#if defined(__AVX2__)
  return true;
#else
  return false;
#endif
}

// x: [M, K] float32 with unit stride in K; blocks: [N, K / 32 * block bytes]. Returns [M, N].
at::Tensor gguf_linear_tiled(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                             int64_t out_features) {
  TORCH_CHECK(gguf_tiled_available(), "gguf_linear_tiled needs AVX2");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1,
              "x must be float32 [rows, K] with unit stride");
  TORCH_CHECK(qtype == kQ4_1 || qtype == kQ8_0, "only Q4_1 and Q8_0 blocks are supported");
  const int64_t m = x.size(0), k = x.size(1), n = out_features;
  const int64_t block_bytes = qtype == kQ4_1 ? kQ4_1Bytes : kQ8_0Bytes;
  TORCH_CHECK(k % kBlockW == 0 && blocks.is_contiguous() && blocks.size(0) == n &&
                  blocks.size(1) == k / kBlockW * block_bytes,
              "blocks do not match [N, K]");
  auto out = at::empty({m, n}, x.options());
#if defined(__AVX2__)
  const float* xp = x.data_ptr<float>();
  const int64_t ldx = x.stride(0);
  float* op = out.data_ptr<float>();
  const uint8_t* wp = blocks.data_ptr<uint8_t>();
  const int64_t row_bytes = blocks.size(1);
  const int64_t col_blocks = (n + kColBlock - 1) / kColBlock;
  at::parallel_for(0, col_blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(kColBlock * k);
    for (int64_t cb = begin; cb < end; ++cb) {
      const int64_t c0 = cb * kColBlock, cols = std::min(kColBlock, n - c0);
      for (int64_t c = 0; c < cols; ++c) {
        dequantize_row(wp + (c0 + c) * row_bytes, qtype, k, w.data() + c * k);
      }
      for (int64_t r0 = 0; r0 < m; r0 += 4) {
        const int64_t rows = std::min<int64_t>(4, m - r0);
        for (int64_t c = 0; c < cols; c += 2) {
          const bool second = c + 1 < cols;
          const float* w0 = w.data() + c * k;
          tile_rows(rows, xp + r0 * ldx, ldx, w0, second ? w0 + k : w0, k,
                    op + r0 * n + c0 + c, n, second);
        }
      }
    }
  });
#endif
  return out;
}

}  // namespace radixserve
