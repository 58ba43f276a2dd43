// K-quant matmuls for many activation rows (prefill, batched decode) on int8 activations per
// 256 (Q8_K), as a row-panel GEMM. The per-row kernels of gguf_q8k.cpp decode every weight
// group again for each tile of 4 activation rows; here a thread decodes a panel of L weight rows
// (L = lanes of a vector: 16 with AVX512, 8 with AVX2) once into codes interleaved by 4 along K
// ([K / 4][L] dwords: one vector holds 4 consecutive codes of each of the L rows), and every
// activation row then runs over the panel with one u8 x s8 multiply-add per 4 K and L rows:
// the panel's vector times x's 4 codes broadcast (AVX512-VNNI / AVX-VNNI vpdpbusd; AVX2 by
// maddubs into int16, summed while no lane can overflow, then madd). The L outputs of a row
// come out as one vector: no horizontal sums.
//
// Arithmetic per super-block, weight row and activation row, as gguf_q8k.cpp's (bit for bit:
// a row's result does not depend on the batch it is in):
//   total = fma(fms(float(sum_t sc_t (u_t . x_t)), d, float(sum_j c_j bsum_j) * cfac), dx, total)
// with the integer sums exact in int32
// with u the codes (unsigned), sc_t the integer scale of the t-th run of kSub weights, and the
// correction the Q4_K/Q5_K mins (cfac = dmin, c_j = the min of 16-run j's group) or the
// Q6_K/Q3_K zero point (cfac = d * zero, c_j = sc_j), from the activations' per-16 sums.
#include <algorithm>
#include <atomic>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "gguf_kquant.h"
#include "gguf_q8k.h"
#include "gguf_q8k_decode.h"
#include "gguf_q8k_panel.h"

namespace radixserve {
namespace {

#if defined(__AVX2__)
using namespace q8k_panel;  // NOLINT: this file's own helpers, split out for gguf_q8k_amx.cpp
using q8k::Q8KQ3_K;
using q8k::Q8KQ4_K;
using q8k::Q8KQ5_K;
using q8k::Q8KQ6_K;
using q8k::SuperBlock;

// A panel of L weight rows, decoded for every super-block of K. Per super-block s:
//   codes[(s * kQuads + q) * L + r]   weight row r's codes 4q..4q+3 (bytes of one dword)
//   meta[(s * kMeta + i) * L + r]     row r's record i (kSc + t: sc of run t of 16 weights;
//                                     kCoef + j: (coef_2j, coef_2j+1) as an int16 pair; kD: d
//                                     and kCfac: cfac, float bits)
constexpr int kMeta = 32, kSc = 0, kCoef = 16, kD = 24, kCfac = 25;
struct Panel {
  std::vector<int32_t> codes, meta;
  alignas(64) int32_t rows[16][kQuads];  // one super-block's codes, row by row
  alignas(64) int32_t raw[16][kQuads / 2];  // or its packed Q4_K nibbles (decode_panel kRaw)
  alignas(64) int32_t records[16][kMeta];  // and its records, row by row
};

// Row by row: the codes and a record of the scales (vector stores of the SuperBlock's int16
// arrays), then both transposed to the panel's layout. Writing each scale into its strided
// place one at a time was ~2/3 of a panel's decoding (the panel's cost at decode batch sizes).

// kRaw (Q4_K): the panel holds the 128 bytes of packed nibbles per super-block and row as they
// are in the file (32 dwords: dword q' has the low-nibble codes 4q'..4q'+3 of group 2(q'/8) and
// the high-nibble ones of group 2(q'/8)+1), split by the kernel: half the bytes to transpose and
// no unpacking per row, for batches too small to amortize decoding (panel_rows_q4k_raw).
template <class Dec, int L, bool kRaw = false>
void decode_panel(const uint8_t* blocks, int64_t row_bytes, int64_t k, int64_t n0, int64_t rows,
                  Panel& p) {
  static_assert(!kRaw || std::is_same_v<Dec, Q8KQ4_K>, "raw nibbles: Q4_K only");
  constexpr int width = kRaw ? kQuads / 2 : kQuads;  // dwords per super-block and row
  const int64_t nsb = k / kSuper;
  p.codes.resize(nsb * width * L);
  p.meta.resize(nsb * kMeta * L);
  if (rows < L) {  // padding rows: zero codes and scales, so they add nothing
    std::memset(p.rows, 0, sizeof(p.rows));
    std::memset(p.raw, 0, sizeof(p.raw));
    std::memset(p.records, 0, sizeof(p.records));
  }
  for (int64_t s = 0; s < nsb; ++s) {
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* blk = blocks + (n0 + r) * row_bytes + s * Dec::kBytes;
      prefetch_blocks_ahead<Dec>(blk);
      SuperBlock sb;
      Dec::prepare(blk, &sb);
      if constexpr (kRaw) {
        std::memcpy(p.raw[r], blk + 16, sizeof(p.raw[r]));
      } else {
        for (int g = 0; g < 8; ++g) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(p.rows[r] + 8 * g), Dec::codes(blk, g));
        }
      }
      int32_t* rec = p.records[r];
      const __m256i sc = _mm256_load_si256(reinterpret_cast<const __m256i*>(sb.sc));
      _mm256_store_si256(reinterpret_cast<__m256i*>(rec + kSc), _mm256_cvtepi16_epi32(_mm256_castsi256_si128(sc)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(rec + kSc + 8), _mm256_cvtepi16_epi32(_mm256_extracti128_si256(sc, 1)));
      std::memcpy(rec + kCoef, sb.coef, sizeof(sb.coef));  // 8 pairs: one dword each
      rec[kD] = float_bits(sb.d);
      rec[kCfac] = float_bits(Dec::kMins ? sb.dmin : sb.d * static_cast<float>(Dec::kZero));
    }
    constexpr std::integral_constant<int, L> lanes{};
    if constexpr (kRaw) {
      interleave_rows(&p.raw[0][0], width, p.codes.data() + s * width * L, lanes);
    } else {
      interleave_rows(&p.rows[0][0], kQuads, p.codes.data() + s * kQuads * L, lanes);
    }
    interleave_rows(&p.records[0][0], kMeta, p.meta.data() + s * kMeta * L, lanes);
  }
}

inline const float* meta_floats(const Panel& p, int64_t s, int i, int L) {
  return reinterpret_cast<const float*>(p.meta.data() + (s * kMeta + i) * L);
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define RS_PANEL_VNNI 1
struct Vnni {
  static constexpr int kLanes = 16;
  static constexpr int kRows = 8;  // activation rows per pass: 3 accumulators each, 24 of 32
  using I = __m512i;
  using F = __m512;
  static I zero() { return _mm512_setzero_si512(); }
  static F fzero() { return _mm512_setzero_ps(); }
  static I load(const int32_t* p) { return _mm512_loadu_si512(p); }
  static F fload(const float* p) { return _mm512_loadu_ps(p); }
  static I dpbusd(I acc, I u, const int8_t* x) {
    return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(load_dword(x)));
  }
  static I dpwssd(I acc, I c, const int16_t* s) {
    return _mm512_dpwssd_epi32(acc, c, _mm512_set1_epi32(load_dword(s)));
  }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fms(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I mullo(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static constexpr int kRawRows = 8;  // panel_rows_q4k_raw: 4 accumulators a row, 24 of 32
  static I low_nibbles(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static I high_nibbles(I v) { return low_nibbles(_mm512_srli_epi16(v, 4)); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static void store(float* out, F v, int cols) {
    _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << cols) - 1), v);
  }
};
#elif defined(__AVXVNNI__)
#define RS_PANEL_VNNI 1
struct Vnni {
  static constexpr int kLanes = 8;
  static constexpr int kRows = 4;  // 12 accumulators of 16 registers
  using I = __m256i;
  using F = __m256;
  static I zero() { return _mm256_setzero_si256(); }
  static F fzero() { return _mm256_setzero_ps(); }
  static I load(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static F fload(const float* p) { return _mm256_loadu_ps(p); }
  static I dpbusd(I acc, I u, const int8_t* x) {
    return _mm256_dpbusd_avx_epi32(acc, u, _mm256_set1_epi32(load_dword(x)));
  }
  static I dpwssd(I acc, I c, const int16_t* s) {
    return _mm256_dpwssd_avx_epi32(acc, c, _mm256_set1_epi32(load_dword(s)));
  }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fms(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I mullo(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static constexpr int kRawRows = 2;  // panel_rows_q4k_raw: 8 accumulators of 16 registers
  static I low_nibbles(I v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
  static I high_nibbles(I v) { return low_nibbles(_mm256_srli_epi16(v, 4)); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static void store(float* out, F v, int cols) {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    std::memcpy(out, tmp, sizeof(float) * cols);
  }
};
#endif

#if defined(RS_PANEL_VNNI)
// A super-block's end: the correction's integer sum (vpdpwssd of the coefficient pairs and the
// activation's per-16 sums), then the float steps, as gguf_q8k.cpp's add_super_block.
template <class V, int R>
inline void finish_super_block(const Panel& p, const XRow* x, int64_t s,
                               const typename V::I* isb, typename V::F* total) {
  constexpr int L = V::kLanes;
  typename V::I corr[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) corr[r] = V::zero();
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const typename V::I c = V::load(p.meta.data() + (s * kMeta + kCoef + j) * L);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) corr[r] = V::dpwssd(corr[r], c, x[r].bsums + s * 16 + 2 * j);
  }
  const typename V::F d = V::fload(meta_floats(p, s, kD, L));
  const typename V::F cf = V::fload(meta_floats(p, s, kCfac, L));
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const typename V::F v = V::fms(V::cvt(isb[r]), d, V::mul(V::cvt(corr[r]), cf));
    total[r] = V::fma(v, V::set1(x[r].d[s]), total[r]);
  }
}

// out[r * ldo + c] for R activation rows and the panel's `cols` rows. Each run of kSub codes'
// dot product is multiplied by its integer scale into the super-block's exact int32 sum; the
// float part is the same operations in the same order as gguf_q8k.cpp's per-row kernel, so a
// row's output has the same bits in any batch.
template <class Dec, class V, int R>
void panel_rows_vnni(const Panel& p, const XRow* x, int64_t k, float* out, int64_t ldo,
                     int cols) {
  constexpr int L = V::kLanes;
  constexpr int nsub = kSuper / Dec::kSub;
  constexpr int quads = Dec::kSub / 4;
  const int64_t nsb = k / kSuper;
  typename V::F total[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) total[r] = V::fzero();
  for (int64_t s = 0; s < nsb; ++s) {
    typename V::I isb[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) isb[r] = V::zero();
    const int32_t* codes = p.codes.data() + s * kQuads * L;
    for (int t = 0; t < nsub; ++t) {
      typename V::I acc[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] = V::zero();
#pragma GCC unroll 8
      for (int q = 0; q < quads; ++q) {
        const typename V::I u = V::load(codes + (t * quads + q) * L);
        const int64_t kx = s * kSuper + t * Dec::kSub + 4 * q;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r] = V::dpbusd(acc[r], u, x[r].q + kx);
      }
      const typename V::I sc = V::load(p.meta.data() + (s * kMeta + kSc + t * Dec::kSub / 16) * L);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isb[r] = V::add(isb[r], V::mullo(acc[r], sc));
    }
    finish_super_block<V, R>(p, x, s, isb, total);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) V::store(out + r * ldo, total[r], cols);
}

// panel_rows_vnni for Q4_K on a raw-nibble panel (decode_panel kRaw): each loaded vector gives
// the codes of two groups (low and high nibbles), so a super-block is 32 loads, 64 vpdpbusd a
// row and two extra operations a load. The integer sums are the same, so the same bits.
template <class V, int R>
void panel_rows_q4k_raw(const Panel& p, const XRow* x, int64_t k, float* out, int64_t ldo,
                        int cols) {
  constexpr int L = V::kLanes;
  const int64_t nsb = k / kSuper;
  typename V::F total[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) total[r] = V::fzero();
  for (int64_t s = 0; s < nsb; ++s) {
    typename V::I isb[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) isb[r] = V::zero();
    const int32_t* codes = p.codes.data() + s * (kQuads / 2) * L;
    for (int j = 0; j < 4; ++j) {  // groups 2j (low nibbles) and 2j + 1 (high)
      typename V::I lo[R], hi[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) lo[r] = hi[r] = V::zero();
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) {
        const typename V::I raw = V::load(codes + (8 * j + q) * L);
        const typename V::I u_lo = V::low_nibbles(raw), u_hi = V::high_nibbles(raw);
        const int64_t kx = s * kSuper + 64 * j + 4 * q;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          lo[r] = V::dpbusd(lo[r], u_lo, x[r].q + kx);
          hi[r] = V::dpbusd(hi[r], u_hi, x[r].q + kx + 32);
        }
      }
      // each group's scale is that of its first run of 16
      const typename V::I sc_lo = V::load(p.meta.data() + (s * kMeta + kSc + 4 * j) * L);
      const typename V::I sc_hi = V::load(p.meta.data() + (s * kMeta + kSc + 4 * j + 2) * L);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        isb[r] = V::add(isb[r], V::add(V::mullo(lo[r], sc_lo), V::mullo(hi[r], sc_hi)));
      }
    }
    finish_super_block<V, R>(p, x, s, isb, total);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) V::store(out + r * ldo, total[r], cols);
}
#endif

// AVX2 without VNNI: maddubs gives int16 sums of code pairs; up to `chunk` of them are added in
// int16 (2 * chunk * kMaxCode * 127 <= 32767), then madd with the run's integer scale takes
// them to int32, so a super-block accumulates exactly in int32 as in gguf_q8k.cpp.
struct Avx2 {
  static constexpr int kLanes = 8;
  static constexpr int kRows = 4;  // 12 accumulators of 16 registers
};

template <class Dec, int R>
void panel_rows_avx2(const Panel& p, const XRow* x, int64_t k, float* out, int64_t ldo,
                     int cols) {
  constexpr int L = 8;
  constexpr int nsub = kSuper / Dec::kSub;
  constexpr int quads = Dec::kSub / 4;
  constexpr int safe = 32767 / (2 * Dec::kMaxCode * 127);
  constexpr int chunk = safe < quads ? safe : quads;
  static_assert(chunk >= 1 && quads % chunk == 0, "chunks must tile a run of codes");
  const int64_t nsb = k / kSuper;
  __m256 total[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    __m256i isb[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) isb[r] = _mm256_setzero_si256();
    const int32_t* codes = p.codes.data() + s * kQuads * L;
    for (int t = 0; t < nsub; ++t) {
      const __m256i sc32 = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(p.meta.data() + (s * kMeta + kSc + t * Dec::kSub / 16) * L));
      // (sc, sc) as an int16 pair in each lane, for madd
      const __m256i sc = _mm256_or_si256(_mm256_and_si256(sc32, _mm256_set1_epi32(0xFFFF)),
                                         _mm256_slli_epi32(sc32, 16));
#pragma GCC unroll 8
      for (int q0 = 0; q0 < quads; q0 += chunk) {
        __m256i part[R];
#pragma GCC unroll 8
        for (int q = q0; q < q0 + chunk; ++q) {
          const __m256i u =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + (t * quads + q) * L));
          const int64_t kx = s * kSuper + t * Dec::kSub + 4 * q;
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const __m256i v = _mm256_maddubs_epi16(u, _mm256_set1_epi32(load_dword(x[r].q + kx)));
            part[r] = q == q0 ? v : _mm256_add_epi16(part[r], v);
          }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) isb[r] = _mm256_add_epi32(isb[r], _mm256_madd_epi16(part[r], sc));
      }
    }
    __m256i corr[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) corr[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m256i c = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(p.meta.data() + (s * kMeta + kCoef + j) * L));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256i b = _mm256_set1_epi32(load_dword(x[r].bsums + s * 16 + 2 * j));
        corr[r] = _mm256_add_epi32(corr[r], _mm256_madd_epi16(c, b));
      }
    }
    const __m256 d = _mm256_loadu_ps(meta_floats(p, s, kD, L));
    const __m256 cf = _mm256_loadu_ps(meta_floats(p, s, kCfac, L));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 v = _mm256_fmsub_ps(_mm256_cvtepi32_ps(isb[r]), d,
                                       _mm256_mul_ps(_mm256_cvtepi32_ps(corr[r]), cf));
      total[r] = _mm256_fmadd_ps(v, _mm256_set1_ps(x[r].d[s]), total[r]);
    }
  }
  alignas(32) float tmp[8];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(tmp, total[r]);
    std::memcpy(out + r * ldo, tmp, sizeof(float) * cols);
  }
}

template <class Dec, int L, bool kRaw = false, class Rows>
void panel_linear(const uint8_t* blocks, int64_t row_bytes, const Q8KRows& xq, int64_t m,
                  int64_t k, int64_t n, float* out, Rows&& run_rows, int max_rows) {
  const int64_t nsb = k / kSuper;
  const int64_t panels = (n + L - 1) / L;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    static thread_local Panel panel;
    std::vector<XRow> xr(max_rows);
    for (int64_t pi = begin; pi < end; ++pi) {
      const int64_t n0 = pi * L;
      const int cols = static_cast<int>(std::min<int64_t>(L, n - n0));
      decode_panel<Dec, L, kRaw>(blocks, row_bytes, k, n0, cols, panel);
      if (pi + 1 < end) {
        // The start of the next panel's rows, asked for before this one's arithmetic: decoding
        // reads its L rows a super-block at a time, more streams than the hardware prefetcher
        // follows, and its own prefetch (kPrefetchBlocks ahead in each row) only starts once
        // decoding does. From memory, 8-row batches ran at ~4 GB/s a thread without this.
        const int64_t next_rows = std::min<int64_t>(L, n - n0 - L);
        const int64_t bytes = std::min<int64_t>(kPrefetchBlocks * Dec::kBytes, row_bytes);
        for (int64_t r = 0; r < next_rows; ++r) {
          const char* row = reinterpret_cast<const char*>(blocks + (n0 + L + r) * row_bytes);
          for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(row + i, _MM_HINT_T0);
        }
      }
      for (int64_t r0 = 0; r0 < m; r0 += max_rows) {
        const int64_t rows = std::min<int64_t>(max_rows, m - r0);
        for (int64_t r = 0; r < rows; ++r) {
          xr[r] = {xq.q.data() + (r0 + r) * k, xq.bsums.data() + (r0 + r) * (k / 16),
                   xq.d.data() + (r0 + r) * nsb};
        }
        run_rows(panel, xr.data(), rows, out + r0 * n + n0, cols);
      }
    }
  });
}

// Up to this many activation rows, Q4_K panels keep their nibbles packed (decode_panel kRaw):
// at 8 rows decoding was 2/3 of a panel's time; with more rows the unpacking in the inner loop
// costs more than it saves.
constexpr int64_t kRawMaxRows = 16;

template <class Dec>
void panel_linear_for(const uint8_t* blocks, int64_t row_bytes, const Q8KRows& xq, int64_t m,
                      int64_t k, int64_t n, float* out, bool vnni) {
#if defined(RS_PANEL_VNNI)
  if constexpr (std::is_same_v<Dec, Q8KQ4_K>) {
    if (vnni && m <= kRawMaxRows) {  // small batches: decoding dominates, so decode less
      panel_linear<Dec, Vnni::kLanes, true>(
          blocks, row_bytes, xq, m, k, n, out,
          [&](const Panel& p, const XRow* x, int64_t rows, float* o, int cols) {
            with_rows<Vnni::kRawRows>(rows, [&](auto tile) {
              panel_rows_q4k_raw<Vnni, decltype(tile)::value>(p, x, k, o, n, cols);
            });
          },
          Vnni::kRawRows);
      return;
    }
  }
  if (vnni) {
    panel_linear<Dec, Vnni::kLanes>(
        blocks, row_bytes, xq, m, k, n, out,
        [&](const Panel& p, const XRow* x, int64_t rows, float* o, int cols) {
          with_rows<Vnni::kRows>(rows, [&](auto tile) {
            panel_rows_vnni<Dec, Vnni, decltype(tile)::value>(p, x, k, o, n, cols);
          });
        },
        Vnni::kRows);
    return;
  }
#endif
  (void)vnni;  // no VNNI in this build: maddubs
  panel_linear<Dec, Avx2::kLanes>(
      blocks, row_bytes, xq, m, k, n, out,
      [&](const Panel& p, const XRow* x, int64_t rows, float* o, int cols) {
        with_rows<Avx2::kRows>(rows, [&](auto tile) {
          panel_rows_avx2<Dec, decltype(tile)::value>(p, x, k, o, n, cols);
        });
      },
      Avx2::kRows);
}
#endif  // __AVX2__

std::atomic<int64_t> g_panel_min_rows{std::numeric_limits<int64_t>::max()};  // off until chosen

}  // namespace

void set_q8k_panel_min_rows(int64_t rows) { g_panel_min_rows.store(std::max<int64_t>(rows, 1)); }
int64_t q8k_panel_min_rows() { return g_panel_min_rows.load(); }

void q8k_panel_linear(const uint8_t* blocks, int64_t row_bytes, int64_t qtype,
                      const Q8KRows& xq, int64_t m, int64_t k, int64_t n, float* out) {
#if defined(__AVX2__)
  if (q8k_amx() && m >= q8k_amx_min_rows()) {
    q8k_amx_linear(blocks, row_bytes, qtype, xq, m, k, n, out);
    return;
  }
  const bool vnni = q8k_wide();
  switch (qtype) {
    case gguf::kQ3_K: panel_linear_for<Q8KQ3_K>(blocks, row_bytes, xq, m, k, n, out, vnni); break;
    case gguf::kQ4_K: panel_linear_for<Q8KQ4_K>(blocks, row_bytes, xq, m, k, n, out, vnni); break;
    case gguf::kQ5_K: panel_linear_for<Q8KQ5_K>(blocks, row_bytes, xq, m, k, n, out, vnni); break;
    case gguf::kQ6_K: panel_linear_for<Q8KQ6_K>(blocks, row_bytes, xq, m, k, n, out, vnni); break;
    default: TORCH_CHECK(false, "GGML type ", qtype, " has no Q8_K kernel");
  }
#else
  (void)blocks, (void)row_bytes, (void)qtype, (void)xq, (void)m, (void)k, (void)n, (void)out;
  TORCH_CHECK(false, "the Q8_K kernels need AVX2");
#endif
}

}  // namespace radixserve
