// The float32 register-blocked micro-kernel shared by the packed GGUF matmul
// (gguf_gemm_tiled.cpp) and prefill attention (attention.cpp): c[0:R, 0:16] (+)= x[0:R, 0:kc] .
// p[0:kc, 0:16], with x rows ldx apart and panel rows ldp apart. Per k: two panel loads, R
// broadcasts of x and 2R FMAs into accumulators held in registers (R <= 6: 12 accumulators plus
// the three live operands fill 15 of AVX2's 16 vector registers).
#pragma once

#include <algorithm>
#include <vector>

#include "common.h"

#if defined(__AVX2__)
namespace radixserve {
namespace micro {

constexpr int64_t kNR = 16;  // columns per micro tile (two vectors)
constexpr int64_t kMR = 6;   // rows per micro tile

inline void store_row(__m256 lo, __m256 hi, float* out, int64_t cols, bool accumulate) {
  if (cols == kNR) {
    if (accumulate) {
      lo = _mm256_add_ps(lo, _mm256_loadu_ps(out));
      hi = _mm256_add_ps(hi, _mm256_loadu_ps(out + 8));
    }
    _mm256_storeu_ps(out, lo);
    _mm256_storeu_ps(out + 8, hi);
    return;
  }
  alignas(32) float tmp[kNR];
  _mm256_store_ps(tmp, lo);
  _mm256_store_ps(tmp + 8, hi);
  for (int64_t j = 0; j < cols; ++j) out[j] = accumulate ? out[j] + tmp[j] : tmp[j];
}

// The accumulators are named variables, not an array: GCC keeps an array of __m256 in memory
// and stores it on every k (measured 33 GFLOP/s on one core); named ones stay in registers
// (50-88 GFLOP/s, up to ~95% of the core's FMA peak).
#define RS_ROW_FMA(i)                                         \
  if constexpr (R > i) {                                      \
    const __m256 xv = _mm256_broadcast_ss(x + i * ldx + kk); \
    c##i##0 = _mm256_fmadd_ps(xv, b0, c##i##0);               \
    c##i##1 = _mm256_fmadd_ps(xv, b1, c##i##1);               \
  }
#define RS_ROW_STORE(i) \
  if constexpr (R > i) store_row(c##i##0, c##i##1, c + i * ldc, cols, accumulate);

// Only the first `cols` (<= 16) output columns are written; the panel must still hold 16
// readable (finite) columns per row.
template <int R>
inline void tile(const float* x, int64_t ldx, const float* p, int64_t ldp, int64_t kc, float* c,
                 int64_t ldc, int64_t cols, bool accumulate) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(p + kk * ldp), b1 = _mm256_loadu_ps(p + kk * ldp + 8);
    RS_ROW_FMA(0) RS_ROW_FMA(1) RS_ROW_FMA(2) RS_ROW_FMA(3) RS_ROW_FMA(4) RS_ROW_FMA(5)
  }
  RS_ROW_STORE(0) RS_ROW_STORE(1) RS_ROW_STORE(2) RS_ROW_STORE(3) RS_ROW_STORE(4) RS_ROW_STORE(5)
}
#undef RS_ROW_FMA
#undef RS_ROW_STORE

// In-register transpose of an 8x8 float block.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    s[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

// tile<R> for a run-time row count 1..6.
inline void tile_rows(int64_t rows, const float* x, int64_t ldx, const float* p, int64_t ldp,
                      int64_t kc, float* c, int64_t ldc, int64_t cols, bool accumulate) {
  switch (rows) {
    case 1: tile<1>(x, ldx, p, ldp, kc, c, ldc, cols, accumulate); break;
    case 2: tile<2>(x, ldx, p, ldp, kc, c, ldc, cols, accumulate); break;
    case 3: tile<3>(x, ldx, p, ldp, kc, c, ldc, cols, accumulate); break;
    case 4: tile<4>(x, ldx, p, ldp, kc, c, ldc, cols, accumulate); break;
    case 5: tile<5>(x, ldx, p, ldp, kc, c, ldc, cols, accumulate); break;
    default: tile<6>(x, ldx, p, ldp, kc, c, ldc, cols, accumulate); break;
  }
}


constexpr int64_t kKC = 256;  // k per block: the panel slice (kKC x 16 floats, 16 KiB) sits in L1
// Rows of x per M block: its rows (all of K) stay in L2 while every panel of a group passes
// over them. Without M blocks a long prefill re-streamed all of x from memory for every
// 16-column panel: a 64 x 128-token prefill batch (8,192 rows) ran at 41% of the FMA peak
// where 128 rows ran at 75%.
constexpr int64_t kXBlockBytes = 192 * 1024;
// Packed panels per thread and group: packed once, reused by every M block.
constexpr int64_t kPanelGroupBytes = 2 * 1024 * 1024;
// Up to this many rows one block: each panel is packed right before its use, still in cache
// (blocking a decode batch of 32-64 rows measured up to 11% slower, a 2,048-row prefill 1.2-1.7x
// faster, 8,192 rows 1.6-2.5x).
constexpr int64_t kMaxUnblockedRows = 256;

// out[M, N] = x[M, K] . W^T with W supplied 16 rows at a time by pack(c0, cols, panel), which
// writes the k-major panel panel[kk * 16 + c] (zero-padded columns). Every output element sums
// its k blocks in the same order whatever the blocking or the thread that computes it, so
// results do not depend on M, the group size or the threads.
//
// Up to kMaxUnblockedRows rows (decode batches) threads take a few panels at a time from a
// shared counter (parallel_grab): with a fixed half each, a descheduled thread made the other
// wait at the end of every matmul (batch 16-64 decode steps 1.00-1.075x, mean ~1.04x, over 7
// runs interleaved in one process). Blocked (long prefills) each thread keeps a fixed
// contiguous share: its groups must stay large, as x is re-read once per group (smaller grabs
// measured up to 1.3x slower at 4,096 rows).
template <typename Pack>
void packed_gemm(const float* x, int64_t ldx, int64_t m, int64_t n, int64_t k, float* out,
                 const Pack& pack) {
  const int64_t panels = (n + kNR - 1) / kNR;
  const int64_t panel_floats = k * kNR;
  // One panel through every K block and row tile of rows [m0, m1).
  auto run_panel = [&](const float* panel, int64_t pi, int64_t m0, int64_t m1) {
    const int64_t c0 = pi * kNR, cols = std::min(kNR, n - c0);
    for (int64_t k0 = 0; k0 < k; k0 += kKC) {
      const int64_t kc = std::min(kKC, k - k0);
      for (int64_t r0 = m0; r0 < m1; r0 += kMR) {
        tile_rows(std::min(kMR, m1 - r0), x + r0 * ldx + k0, ldx, panel + k0 * kNR, kNR, kc,
                  out + r0 * n + c0, n, cols, k0 > 0);
      }
    }
  };
  if (m <= kMaxUnblockedRows) {
    const int64_t threads =
        std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), panels));
    parallel_grab(panels, std::max<int64_t>(1, panels / (threads * 16)),
                  [&](int64_t begin, int64_t end) {
                    // One panel buffer per thread, kept across grabs and calls (pack writes
                    // every element, padding included).
                    thread_local std::vector<float> buffer;
                    buffer.resize(panel_floats);
                    for (int64_t pi = begin; pi < end; ++pi) {
                      pack(pi * kNR, std::min(kNR, n - pi * kNR), buffer.data());
                      run_panel(buffer.data(), pi, 0, m);
                    }
                  });
    return;
  }
  const int64_t mc = std::max<int64_t>(kMR, kXBlockBytes / (k * 4) / kMR * kMR);
  const int64_t group =
      std::max<int64_t>(1, kPanelGroupBytes / (panel_floats * int64_t(sizeof(float))));
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(std::min(group, end - begin) * panel_floats);
    for (int64_t g0 = begin; g0 < end; g0 += group) {
      const int64_t g1 = std::min(end, g0 + group);
      for (int64_t pi = g0; pi < g1; ++pi) {
        const int64_t c0 = pi * kNR;
        pack(c0, std::min(kNR, n - c0), buffer.data() + (pi - g0) * panel_floats);
      }
      for (int64_t m0 = 0; m0 < m; m0 += mc) {
        const int64_t m1 = std::min(m, m0 + mc);
        for (int64_t pi = g0; pi < g1; ++pi) {
          run_panel(buffer.data() + (pi - g0) * panel_floats, pi, m0, m1);
        }
      }
    }
  });
}

// panel[kk * 16 + c] = W[c, kk] for the `cols` rows of W starting at w (ldw elements apart;
// zero for the padding columns), K a multiple of 8: load(row, k0) gives W[row][k0..k0+8) as
// float32 (float weights are loaded as they are, 16-bit ones widened).
template <class T, class Load>
void pack_rows_panel(const T* w, int64_t ldw, int64_t k, int64_t cols, float* panel, Load load) {
  for (int64_t half = 0; half < 2; ++half) {
    const T* rows[8];
    bool live[8];
    for (int c = 0; c < 8; ++c) {
      const int64_t col = half * 8 + c;
      live[c] = col < cols;
      rows[c] = w + (live[c] ? col : 0) * ldw;
    }
    for (int64_t k0 = 0; k0 < k; k0 += 8) {
      __m256 r[8];
      for (int c = 0; c < 8; ++c) r[c] = live[c] ? load(rows[c], k0) : _mm256_setzero_ps();
      transpose8(r);
      float* dst = panel + k0 * kNR + half * 8;
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + j * kNR, r[j]);
    }
  }
}

}  // namespace micro
}  // namespace radixserve
#endif
