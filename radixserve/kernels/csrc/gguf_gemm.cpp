// Matmuls straight from GGUF's quantized blocks (Q4_1 and Q8_0). The activations are quantized
// per block of 32 to int16 with one float scale (llama.cpp uses int8; int16 keeps the relative
// error near 1e-5, so greedy output rarely leaves the float reference), and each weight-block x
// activation-block product is an integer dot product (AVX2: two madd_epi16), scaled by the two
// block scales. Q4_1's offset term m * sum(x) uses the exact float sum.
// Weights stay in the file's layout: row n of the [N, K] weight is K / 32 consecutive blocks.
// With many activation rows (prefill) gguf_linear hands over to gguf_gemm_tiled.cpp instead.
#include <atomic>
#include <vector>

#include "gguf_blocks.h"
#include "gguf_gemv.h"
#include "gguf_kquant.h"
#include "gguf_paired_rows.h"
#include "gguf_q8k.h"
#include "kernels.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace radixserve {
namespace {

using gguf::half_to_float;
using gguf::kBlock;
using gguf::kQ4_1;
using gguf::kQ4_1Bytes;
using gguf::kQ8_0;
using gguf::kQ8_0Bytes;

constexpr int64_t kRowTile = 4;     // activation rows sharing one unpacked weight block
// From this many rows on, the packed float kernel (gguf_gemm_tiled.cpp) is at least as fast and
// exact in x; the integer path serves small batches (decode). One core, AMD Zen 3: Q4_1 decoder
// shapes 1.2-1.3x at 12 rows, 0.9-1.0x at 8 (its nibble unpacking makes the integer path slow);
// Q8_0 is even at 32 and 48 rows and the integer path wins below (the LM head's 49k-column pack
// costs 14 ms at any row count: 0.3x at 4 rows).
constexpr int64_t kTiledMinRowsQ4_1 = 12;
constexpr int64_t kTiledMinRowsQ8_0 = 32;
// bfloat16 rows on AMX-BF16 tiles (gguf_gemm_amx.cpp) pass the integer path from 5 rows: its
// cost is dequantizing the weights, flat in the rows up to 16 (a decode batch, a speculative
// verify), where the integer path grows with them. 30 layers of SmolLM2's Q4_1/Q8_0 shapes
// streamed from memory, 2 threads, Xeon with AMX: 4 rows 0.89x, 5 rows 1.13x, 9 rows 1.66x,
// one row 0.49x (2026-12-06, best of 8 interleaved).
constexpr int64_t kAmxMinRows = 5;
// Off under --enable-deterministic-inference: the float tiles and the integer path round
// differently, so a row's result would depend on how many rows share its call.
std::atomic<bool> g_tiled_enabled{true};

// One block of 32 activations: int16 values, their scale and their exact float sum.
template <typename T>
inline void quantize_block(const T* src, int16_t* dst, float* scale, float* sum_out) {
  float amax = 0.0f, sum = 0.0f;
  for (int64_t i = 0; i < kBlock; ++i) {
    const float v = to_float(src[i]);
    amax = std::max(amax, std::abs(v));
    sum += v;
  }
  const float d = amax / 32767.0f;
  const float id = d > 0.0f ? 1.0f / d : 0.0f;
  for (int64_t i = 0; i < kBlock; ++i) {
    dst[i] = static_cast<int16_t>(__builtin_nearbyintf(to_float(src[i]) * id));
  }
  *scale = d;
  *sum_out = sum;
}

// Fills `out` (resized: every element is written below). Callers pass a buffer kept per
// thread: at batch 1 a fresh set of vectors for each of a step's ~120 matmuls (allocated and
// zero-filled) was a measurable share of the single-threaded time between parallel regions.
template <typename T>
void quantize_rows(const T* x, int64_t m, int64_t k, int64_t stride, QuantizedRows& out) {
  const int64_t nb = k / kBlock;
  out.q.resize(m * k);
  out.scale.resize(m * nb);
  out.sum.resize(m * nb);
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        quantize_block(x + r * stride + b * kBlock, out.q.data() + r * k + b * kBlock,
                       &out.scale[r * nb + b], &out.sum[r * nb + b]);
      }
    }
  });
}

#if defined(__AVX2__)
using gguf::hsum;

// The 32 nibbles of a Q4_1 block as two vectors of 16 int16 (weights 0..15 and 16..31). The
// 16 bytes are broadcast to both 128-bit lanes by the load and spread in-lane (bytes 0..7 to
// lane 0, 8..15 to lane 1, each zero-extended to 16 bits) by one shuffle; the low nibble is then
// a mask and the high nibble a shift. Two lane-crossing zero-extensions made this ~1.15x slower.
inline void unpack_q4(const uint8_t* qs, __m256i* lo16, __m256i* hi16) {
  const __m256i spread = _mm256_setr_epi8(0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1, 7, -1,
                                          8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1,
                                          15, -1);
  const __m256i bytes = _mm256_shuffle_epi8(
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))), spread);
  *lo16 = _mm256_and_si256(bytes, _mm256_set1_epi16(0x0F));
  *hi16 = _mm256_srli_epi16(bytes, 4);
}

inline void unpack_q8(const uint8_t* qs, __m256i* lo16, __m256i* hi16) {
  *lo16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  *hi16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16)));
}

// sum over the block of w * x as 8 float lanes (int32 partial sums, exact).
inline __m256 dot_block(__m256i w_lo, __m256i w_hi, const int16_t* x) {
  const __m256i x_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i x_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
  const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(w_lo, x_lo), _mm256_madd_epi16(w_hi, x_hi));
  return _mm256_cvtepi32_ps(sum);
}
#endif

// out[r, n] for activation rows r in [r0, r0 + R) and one weight row n. R is a template
// parameter and the accumulators are named variables (RS_ACC): with a run-time row count, or
// with an array of __m256 even at a fixed R, GCC keeps them on the stack and stores every one
// on every block (seen in the disassembly of the R = 4 loop).
#if defined(__AVX2__)
#define RS_Q_ROW(i, EXTRA)                                                                   \
  if constexpr (R > i) {                                                                     \
    const __m256 p = dot_block(w_lo, w_hi, xq_base + i * k + b * kBlock);                   \
    acc##i = _mm256_fmadd_ps(p, _mm256_mul_ps(d, _mm256_broadcast_ss(scale_base + i * nb + b)), \
                             acc##i);                                                        \
    EXTRA                                                                                    \
  }
#define RS_Q4_OFFSET(i) \
  off##i = _mm256_fmadd_ps(m, _mm256_broadcast_ss(sum_base + i * nb + b), off##i);

// The weights stream from memory once per column and the hardware prefetcher alone did not keep
// up with a few rows (2 rows ran ~2.7x slower from memory than from cache): each block asks for
// the bytes 8 KiB ahead.
constexpr int64_t kRowsPrefetchBytes = 8192;

template <int R>
void dot_rows_q4_1(const uint8_t* wrow, const QuantizedRows& xq, int64_t r0, int64_t k,
                   float* out_col, int64_t out_stride) {
  const int64_t nb = k / kBlock;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  // m * sum(x) per block, in lane 0 (kept in vectors: no scalar dependency chain)
  __m256 off0 = acc0, off1 = acc0, off2 = acc0, off3 = acc0;
  const int16_t* xq_base = xq.q.data() + r0 * k;
  const float* scale_base = xq.scale.data() + r0 * nb;
  const float* sum_base = xq.sum.data() + r0 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = wrow + b * kQ4_1Bytes;
    _mm_prefetch(reinterpret_cast<const char*>(blk) + kRowsPrefetchBytes, _MM_HINT_T0);
    const __m256 d = _mm256_set1_ps(half_to_float(blk));
    const __m256 m = _mm256_set1_ps(half_to_float(blk + 2));
    __m256i w_lo, w_hi;
    unpack_q4(blk + 4, &w_lo, &w_hi);
    RS_Q_ROW(0, RS_Q4_OFFSET(0))
    RS_Q_ROW(1, RS_Q4_OFFSET(1))
    RS_Q_ROW(2, RS_Q4_OFFSET(2))
    RS_Q_ROW(3, RS_Q4_OFFSET(3))
  }
  const __m256 accs[4] = {acc0, acc1, acc2, acc3}, offs[4] = {off0, off1, off2, off3};
  for (int r = 0; r < R; ++r) {
    out_col[r * out_stride] = hsum(accs[r]) + _mm256_cvtss_f32(offs[r]);
  }
}

template <int R>
void dot_rows_q8_0(const uint8_t* wrow, const QuantizedRows& xq, int64_t r0, int64_t k,
                   float* out_col, int64_t out_stride) {
  const int64_t nb = k / kBlock;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  const int16_t* xq_base = xq.q.data() + r0 * k;
  const float* scale_base = xq.scale.data() + r0 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = wrow + b * kQ8_0Bytes;
    _mm_prefetch(reinterpret_cast<const char*>(blk) + kRowsPrefetchBytes, _MM_HINT_T0);
    const __m256 d = _mm256_set1_ps(half_to_float(blk));
    __m256i w_lo, w_hi;
    unpack_q8(blk + 2, &w_lo, &w_hi);
    RS_Q_ROW(0, ) RS_Q_ROW(1, ) RS_Q_ROW(2, ) RS_Q_ROW(3, )
  }
  const __m256 accs[4] = {acc0, acc1, acc2, acc3};
  for (int r = 0; r < R; ++r) out_col[r * out_stride] = hsum(accs[r]);
}
#undef RS_Q_ROW
#undef RS_Q4_OFFSET

// One activation row against 4 consecutive Q4_1 weight rows (decode at batch 1). With one row
// the per-weight-row kernel above is latency-bound: one FMA chain per output, and the fp16
// scales converted one at a time, then ~100 cycles of hsum, call and store around every 18-block
// row (K = 576). Here four chains share each activation block's loads, the four rows' d and m
// are converted by one instruction, and the rows one tile ahead are prefetched: interleaving
// four rows defeats the hardware prefetcher (two interleaved rows ran 2x slower without it).
// Per output the arithmetic is that of dot_rows_q4_1<1> (d * sx and fma(m, sum, off) in the same
// order), so the result is bitwise equal. One core, K = 576, weights from memory: ~1.5x.
void dot_cols4_q4_1(const uint8_t* w, int64_t row_bytes, const QuantizedRows& xq, int64_t k,
                    float* out) {
  const int64_t nb = k / kBlock;
  const uint8_t* w0 = w;
  const uint8_t* w1 = w + row_bytes;
  const uint8_t* w2 = w + 2 * row_bytes;
  const uint8_t* w3 = w + 3 * row_bytes;
  const int64_t ahead = 4 * row_bytes;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, offs = acc0;
  alignas(32) float ds_lanes[8];
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t o = b * kQ4_1Bytes;
    int32_t dm0, dm1, dm2, dm3;
    std::memcpy(&dm0, w0 + o, 4);
    std::memcpy(&dm1, w1 + o, 4);
    std::memcpy(&dm2, w2 + o, 4);
    std::memcpy(&dm3, w3 + o, 4);
    _mm_prefetch(reinterpret_cast<const char*>(w0 + ahead + o), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w1 + ahead + o), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w2 + ahead + o), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w3 + ahead + o), _MM_HINT_T0);
    // [d0, m0, d1, m1, d2, m2, d3, m3]
    const __m256 dm = _mm256_cvtph_ps(
        _mm_unpacklo_epi64(_mm_unpacklo_epi32(_mm_cvtsi32_si128(dm0), _mm_cvtsi32_si128(dm1)),
                           _mm_unpacklo_epi32(_mm_cvtsi32_si128(dm2), _mm_cvtsi32_si128(dm3))));
    // [sx, sum, sx, sum, ...]: even lanes of dm * xs are d_c * sx, odd lanes accumulate m_c * sum
    const __m256 xs = _mm256_blend_ps(_mm256_broadcast_ss(&xq.scale[b]),
                                      _mm256_broadcast_ss(&xq.sum[b]), 0xAA);
    const __m256 ds = _mm256_mul_ps(dm, xs);
    offs = _mm256_fmadd_ps(dm, xs, offs);
    const int16_t* x = xq.q.data() + b * kBlock;
    // Each row's d * sx broadcast from memory: a store and four broadcast loads ran ~1.1x
    // faster than four lane-crossing permutes (vpermps) in an interleaved A/B on this CPU.
    _mm256_store_ps(ds_lanes, ds);
#define RS_COL(c)                                                                               \
  {                                                                                             \
    __m256i w_lo, w_hi;                                                                         \
    unpack_q4(w##c + o + 4, &w_lo, &w_hi);                                                      \
    acc##c = _mm256_fmadd_ps(dot_block(w_lo, w_hi, x), _mm256_broadcast_ss(ds_lanes + 2 * c),    \
                             acc##c);                                                           \
  }
    RS_COL(0) RS_COL(1) RS_COL(2) RS_COL(3)
#undef RS_COL
  }
  alignas(32) float off[8];
  _mm256_store_ps(off, offs);
  out[0] = hsum(acc0) + off[1];
  out[1] = hsum(acc1) + off[3];
  out[2] = hsum(acc2) + off[5];
  out[3] = hsum(acc3) + off[7];
}
constexpr int64_t kColTile = 4;

template <template <int> class Kernel>
void dispatch_rows(int64_t rows, const uint8_t* wrow, const QuantizedRows& xq, int64_t r0,
                   int64_t k, float* out_col, int64_t out_stride) {
  switch (rows) {
    case 1: Kernel<1>::run(wrow, xq, r0, k, out_col, out_stride); break;
    case 2: Kernel<2>::run(wrow, xq, r0, k, out_col, out_stride); break;
    case 3: Kernel<3>::run(wrow, xq, r0, k, out_col, out_stride); break;
    default: Kernel<4>::run(wrow, xq, r0, k, out_col, out_stride); break;
  }
}

template <int R>
struct Q4_1Kernel {
  static void run(const uint8_t* w, const QuantizedRows& xq, int64_t r0, int64_t k, float* o,
                  int64_t s) {
    dot_rows_q4_1<R>(w, xq, r0, k, o, s);
  }
};

template <int R>
struct Q8_0Kernel {
  static void run(const uint8_t* w, const QuantizedRows& xq, int64_t r0, int64_t k, float* o,
                  int64_t s) {
    dot_rows_q8_0<R>(w, xq, r0, k, o, s);
  }
};
static_assert(kRowTile == 4, "dispatch_rows covers tiles of up to 4 rows");
#endif

void dot_row_q4_1(const uint8_t* wrow, const QuantizedRows& xq, int64_t r0, int64_t rows,
                  int64_t k, float* out_col, int64_t out_stride) {
#if defined(__AVX2__)
  dispatch_rows<Q4_1Kernel>(rows, wrow, xq, r0, k, out_col, out_stride);
#else
  const int64_t nb = k / kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = r0 + r;
    float total = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = wrow + b * kQ4_1Bytes;
      const float d = half_to_float(blk), m = half_to_float(blk + 2);
      const int16_t* x = xq.q.data() + row * k + b * kBlock;
      int32_t isum = 0;
      for (int64_t i = 0; i < 16; ++i) {
        isum += (blk[4 + i] & 0x0F) * x[i] + (blk[4 + i] >> 4) * x[i + 16];
      }
      total += d * xq.scale[row * nb + b] * static_cast<float>(isum) + m * xq.sum[row * nb + b];
    }
    out_col[r * out_stride] = total;
  }
#endif
}

void dot_row_q8_0(const uint8_t* wrow, const QuantizedRows& xq, int64_t r0, int64_t rows,
                  int64_t k, float* out_col, int64_t out_stride) {
#if defined(__AVX2__)
  dispatch_rows<Q8_0Kernel>(rows, wrow, xq, r0, k, out_col, out_stride);
#else
  const int64_t nb = k / kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = r0 + r;
    float total = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = wrow + b * kQ8_0Bytes;
      const int8_t* w = reinterpret_cast<const int8_t*>(blk + 2);
      const int16_t* x = xq.q.data() + row * k + b * kBlock;
      int32_t isum = 0;
      for (int64_t i = 0; i < kBlock; ++i) isum += w[i] * x[i];
      total += half_to_float(blk) * xq.scale[row * nb + b] * static_cast<float>(isum);
    }
    out_col[r * out_stride] = total;
  }
#endif
}

}  // namespace

void size_quantized_row(int64_t k, QuantizedRows& out) {
  out.q.resize(k);
  out.scale.resize(k / kBlock);
  out.sum.resize(k / kBlock);
}

void quantize_row_blocks(const float* x, int64_t k, int64_t b0, int64_t b1,
                         QuantizedRows& out) {
  (void)k;
  for (int64_t b = b0; b < b1; ++b) {
    quantize_block(x + b * kBlock, out.q.data() + b * kBlock, &out.scale[b], &out.sum[b]);
  }
}

void gguf_gemv_columns(const uint8_t* blocks, int64_t row_bytes, int64_t qtype,
                       const QuantizedRows& xq, int64_t k, float* out, int64_t begin,
                       int64_t end) {
  if (gguf::kquant_type(qtype)) {
    kquant_dot_columns(blocks, row_bytes, qtype, xq, k, 0, 1, out, 0, begin, end);
    return;
  }
  int64_t col = begin;
#if defined(__AVX2__)
  if (qtype == kQ4_1) {  // Q8_0 GEMVs already run at memory bandwidth
    for (; col + kColTile <= end; col += kColTile) {
      dot_cols4_q4_1(blocks + col * row_bytes, row_bytes, xq, k, out + col);
    }
  }
#endif
  auto dot = qtype == kQ4_1 ? dot_row_q4_1 : dot_row_q8_0;
  for (; col < end; ++col) dot(blocks + col * row_bytes, xq, 0, 1, k, out + col, 1);
}

namespace {

// The small-batch matmul both activation formats share: x's rows quantized into the caller's
// reused buffer (QuantizedRows or Q8KRows), the output columns split over the threads
// (columns(out, begin, end)), a large buffer dropped afterwards.
template <class Rows, class Quantize, class Columns>
at::Tensor quantized_linear(const at::Tensor& x, int64_t n, Rows& xq, Quantize&& quantize,
                            Columns&& columns) {
  const int64_t m = x.size(0), k = x.size(1);
  dispatch_float_bf16(x.scalar_type(), "quantize", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    quantize(x.data_ptr<scalar_t>(), m, k, x.stride(0), xq);
  });
  auto out32 = at::empty({m, n}, x.options().dtype(at::kFloat));
  float* op = out32.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) { columns(op, begin, end); });
  if (xq.q.size() > (size_t{1} << 20)) xq = Rows{};  // keep only small buffers
  return x.scalar_type() == at::kFloat ? out32 : out32.to(x.scalar_type());
}

}  // namespace

void set_gguf_tiled_enabled(bool enabled) { g_tiled_enabled.store(enabled); }
bool gguf_tiled_enabled() { return g_tiled_enabled.load(); }

// x: [M, K] (rows may be strided); blocks: [N, K / 32 * block_bytes] uint8 in GGUF's layout.
// Returns x @ W^T as [M, N] in x's dtype.
namespace {

// Whether gguf_linear runs x on the AMX-BF16 tiles (gguf_gemm_amx.cpp).
bool takes_amx_tiles(const at::Tensor& x, int64_t qtype) {
  return g_tiled_enabled.load(std::memory_order_relaxed) && x.size(0) >= kAmxMinRows &&
         x.scalar_type() == at::kBFloat16 && (qtype == kQ4_1 || qtype == kQ8_0) &&
         gguf_tiled_amx_enabled();
}

}  // namespace

at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                       int64_t out_features) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [rows, K] with unit stride");
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous() && blocks.dim() == 2,
              "blocks must be a contiguous uint8 [N, bytes] tensor");
  const bool kquant = gguf::kquant_type(qtype);
  TORCH_CHECK(gguf::linear_type(qtype), "GGML type ", qtype, " has no kernel in this build");
  const int64_t m = x.size(0), k = x.size(1), n = out_features;
  TORCH_CHECK(k % kBlock == 0, "K must be a multiple of 32");
  const int64_t expected_bytes = gguf::linear_row_bytes(qtype, k);
  TORCH_CHECK(blocks.size(0) == n && blocks.size(1) == expected_bytes,
              "blocks do not match [N, K]");
  if (q8k_type(qtype) && m >= q8k_panel_min_rows()) {
    // Many rows: panels of weight rows decoded once for all of them (gguf_q8k_panel.cpp).
    static thread_local Q8KRows panel_rows8;
    Q8KRows& xq8 = panel_rows8;
    dispatch_float_bf16(x.scalar_type(), "quantize", [&](auto tag_) {
      using scalar_t = decltype(tag_);
      quantize_q8k(x.data_ptr<scalar_t>(), m, k, x.stride(0), xq8);
    });
    auto out32 = at::empty({m, n}, x.options().dtype(at::kFloat));
    q8k_panel_linear(blocks.data_ptr<uint8_t>(), blocks.size(1), qtype, xq8, m, k, n,
                     out32.data_ptr<float>());
    if (xq8.q.size() > (size_t{1} << 20)) xq8 = Q8KRows{};  // keep only small buffers
    return x.scalar_type() == at::kFloat ? out32 : out32.to(x.scalar_type());
  }
  const bool tiled = g_tiled_enabled.load(std::memory_order_relaxed);
  if (takes_amx_tiles(x, qtype)) {
    // bfloat16 rows as they are, on AMX-BF16 tiles over bf16 weight panels (gguf_gemm_amx.cpp)
    return gguf_linear_tiled_amx_bf16(x, blocks, qtype, n);
  }
  const int64_t tiled_min_rows = qtype == kQ8_0 ? kTiledMinRowsQ8_0 : kTiledMinRowsQ4_1;
  if (tiled && m >= tiled_min_rows && gguf_tiled_available()) {
    // Many rows (prefill): float tiles over dequantized weights (gguf_gemm_tiled.cpp).
    const bool is_float = x.scalar_type() == at::kFloat;
    auto out = gguf_linear_tiled(is_float ? x : x.to(at::kFloat), blocks, qtype, n);
    return is_float ? out : out.to(x.scalar_type());
  }
  const uint8_t* wp = blocks.data_ptr<uint8_t>();
  const int64_t row_bytes = blocks.size(1);
  // The activation buffers are reused (see quantize_rows). Bound to plain references, which
  // the lambdas below capture: a thread_local named inside them would be each OpenMP thread's
  // own (empty) instance.
  if (kquant_int8() && q8k_type(qtype)) {  // K-quants on Q8_K activations (gguf_q8k.cpp)
    static thread_local Q8KRows caller_rows8;
    Q8KRows& xq8 = caller_rows8;
    return quantized_linear(
        x, n, xq8,
        [](const auto* p, int64_t rows, int64_t kk, int64_t s, Q8KRows& out) {
          quantize_q8k(p, rows, kk, s, out);
        },
        [&](float* op, int64_t begin, int64_t end) {
          q8k_dot_columns(wp, row_bytes, qtype, xq8, k, 0, m, op, n, begin, end);
        });
  }
  static thread_local QuantizedRows caller_rows;
  QuantizedRows& xq = caller_rows;
  if (!kquant && m > 1 && paired_rows_available()) {
    // A few rows on 512-bit vectors, two rows a vector (gguf_paired_rows.cpp): the same bits.
    static thread_local PairedRows caller_pairs;
    PairedRows& xp = caller_pairs;
    auto out = quantized_linear(
        x, n, xq,
        [&](const auto* p, int64_t rows, int64_t kk, int64_t s, QuantizedRows& q) {
          quantize_rows(p, rows, kk, s, q);
          pair_rows(q, rows, kk, xp);
        },
        [&](float* op, int64_t begin, int64_t end) {
          paired_dot_columns(wp, row_bytes, qtype, xp, op, n, begin, end);
        });
    if (xp.x.size() > (size_t{1} << 20)) xp = PairedRows{};  // keep only small buffers
    return out;
  }
  auto dot = qtype == kQ4_1 ? dot_row_q4_1 : dot_row_q8_0;
  return quantized_linear(
      x, n, xq,
      [](const auto* p, int64_t rows, int64_t kk, int64_t s, QuantizedRows& out) {
        quantize_rows(p, rows, kk, s, out);
      },
      // Each thread owns a range of output columns. A weight row is read from memory once and
      // stays in L1 while every tile of activation rows (quantized, re-read from L2) passes
      // over it; with the tiles outside, the weights would stream from memory once per 4 rows.
      [&](float* op, int64_t begin, int64_t end) {
        if (kquant) {
          kquant_dot_columns(wp, row_bytes, qtype, xq, k, 0, m, op, n, begin, end);
          return;
        }
        if (m == 1) {
          gguf_gemv_columns(wp, row_bytes, qtype, xq, k, op, begin, end);
          return;
        }
        for (int64_t col = begin; col < end; ++col) {
          for (int64_t r0 = 0; r0 < m; r0 += kRowTile) {
            const int64_t rows = std::min(kRowTile, m - r0);
            dot(wp + col * row_bytes, xq, r0, rows, k, op + r0 * n + col, n);
          }
        }
      });
}

// Greedy sampling's LM head: argmax_rows(gguf_linear(x, ...)[:, :columns]). Where gguf_linear
// takes the AMX tiles the argmax is kept while the tiles are written (the [rows, N] logits never
// are: for a batch-64 step of a 49,152-word vocabulary, 6 MB written and read back from the
// other core's cache, ~0.3 ms); elsewhere the logits are made and then reduced.
at::Tensor gguf_linear_argmax(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                              int64_t out_features, int64_t columns) {
  TORCH_CHECK(columns > 0 && columns <= out_features, "columns must be in [1, out_features]");
  if (x.dim() == 2 && x.size(1) % kBlock == 0 && takes_amx_tiles(x, qtype)) {
    return gguf_argmax_tiled_amx_bf16(x, blocks, qtype, out_features, columns);
  }
  return argmax_rows(gguf_linear(x, blocks, qtype, out_features).narrow(1, 0, columns));
}

}  // namespace radixserve
