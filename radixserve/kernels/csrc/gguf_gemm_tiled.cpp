// GGUF matmul for many activation rows (prefill, large decode batches), as a packed GEMM.
// Each thread takes panels of 16 weight rows (output columns), dequantizes a panel once into a
// k-major float32 layout ([K][16], 8x8 AVX2 transposes), then runs a 6-row x 16-column
// outer-product micro-kernel over it: per k, two panel loads, six broadcasts of x and twelve
// FMAs into accumulators that stay in registers. K is blocked (kKC) so the panel slice being
// multiplied stays in L1 across every row tile. This is the BLIS-style register blocking that
// keeps both FMA units busy; the earlier dot-product tile (reduce along K, then a horizontal sum
// per output) spent half its issue slots on loads and reached ~40% of peak.
// Activations stay float32: no rounding of x.
#include <vector>

#include "gemm_micro.h"
#include "gguf_blocks.h"
#include "gguf_kquant.h"

namespace radixserve {
namespace {

using gguf::half_to_float;
using gguf::kQ4_1;
using gguf::kQ4_1Bytes;
using gguf::kQ8_0;
using gguf::kQ8_0Bytes;
constexpr int64_t kBlockW = gguf::kBlock;

#if defined(__AVX2__)
using micro::kNR;

// The 32 values of one GGUF block of weight row `row` starting at block b, as 4 vectors of 8.
inline void dequantize_block(const uint8_t* row, int64_t qtype, int64_t b, __m256 v[4],
                             gguf::GroupScales* cache) {
  if (qtype == kQ4_1) {
    const uint8_t* blk = row + b * kQ4_1Bytes;
    const __m256 d = _mm256_set1_ps(half_to_float(blk)), m = _mm256_set1_ps(half_to_float(blk + 2));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i])), m);
    }
  } else if (qtype != kQ8_0) {
    gguf::kquant_dequantize_group(row, qtype, b, v, cache);
  } else {
    const uint8_t* blk = row + b * kQ8_0Bytes;
    const __m256 d = _mm256_set1_ps(half_to_float(blk));
    for (int i = 0; i < 4; ++i) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * i));
      v[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
  }
}

// panel[kk * 16 + c] = W[c0 + c, kk] for c < cols, 0 for the padding columns.
void pack_panel(const uint8_t* wp, int64_t row_bytes, int64_t qtype, int64_t k, int64_t c0,
                int64_t cols, float* panel) {
  const int64_t nb = k / kBlockW;
  for (int64_t half = 0; half < 2; ++half) {
    const uint8_t* rows[8];
    bool live[8];
    gguf::GroupScales scales[8];
    for (int c = 0; c < 8; ++c) {
      const int64_t col = half * 8 + c;
      live[c] = col < cols;
      rows[c] = wp + (c0 + (live[c] ? col : 0)) * row_bytes;
    }
    for (int64_t b = 0; b < nb; ++b) {
      __m256 v[8][4];
      for (int c = 0; c < 8; ++c) {
        if (live[c]) {
          dequantize_block(rows[c], qtype, b, v[c], &scales[c]);
        } else {
          for (int i = 0; i < 4; ++i) v[c][i] = _mm256_setzero_ps();
        }
      }
      for (int i = 0; i < 4; ++i) {  // k group i of the block: 8 columns x 8 k
        __m256 r[8];
        for (int c = 0; c < 8; ++c) r[c] = v[c][i];
        micro::transpose8(r);
        float* dst = panel + (b * kBlockW + i * 8) * kNR + half * 8;
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + j * kNR, r[j]);
      }
    }
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
  TORCH_CHECK(gguf::linear_type(qtype), "GGML type ", qtype, " has no kernel in this build");
  const int64_t m = x.size(0), k = x.size(1), n = out_features;
  TORCH_CHECK(k % kBlockW == 0, "K must be a multiple of 32");
  const int64_t expected_bytes = gguf::linear_row_bytes(qtype, k);
  TORCH_CHECK(blocks.is_contiguous() && blocks.size(0) == n && blocks.size(1) == expected_bytes,
              "blocks do not match [N, K]");
  auto out = at::empty({m, n}, x.options());
#if defined(__AVX2__)
  const float* xp = x.data_ptr<float>();
  const int64_t ldx = x.stride(0);
  float* op = out.data_ptr<float>();
  const uint8_t* wp = blocks.data_ptr<uint8_t>();
  const int64_t row_bytes = blocks.size(1);
  micro::packed_gemm(xp, ldx, m, n, k, op, [&](int64_t c0, int64_t cols, float* panel) {
    pack_panel(wp, row_bytes, qtype, k, c0, cols, panel);
  });
#endif
  return out;
}

}  // namespace radixserve
