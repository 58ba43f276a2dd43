// The few-row GGUF integer matmul (Q4_1, Q8_0) on 512-bit vectors: two activation rows share
// each vector, one per 256-bit half (gguf_paired_rows.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "gguf_gemv.h"

namespace radixserve {

// QuantizedRows regrouped by pairs of rows, so one 512-bit load brings the same 16 values of two
// rows: x [pairs][K / 32][64] (row A's values 0..15, row B's 0..15, A's 16..31, B's 16..31),
// scale [pairs][K / 32][16] (A's scale 8 times, then B's), sum [tiles of 16 rows][K / 32][16].
// A missing last row is zeros.
struct PairedRows {
  std::vector<int16_t> x;
  std::vector<float> scale;
  std::vector<float> sum;
  int64_t rows = 0;
  int64_t k = 0;
};

// Whether this build has the kernel (AVX512BW).
bool paired_rows_available();

// Rows [0, m) of xq regrouped into `out` (buffers reused).
void pair_rows(const QuantizedRows& xq, int64_t m, int64_t k, PairedRows& out);

// out[r, col] (row stride n) for every row of xp and columns [begin, end) of GGUF blocks W
// [N, K] (Q4_1 or Q8_0): bitwise the values of the 256-bit per-row kernel in gguf_gemm.cpp, so
// a row's result does not depend on how many rows share its call.
void paired_dot_columns(const uint8_t* w, int64_t row_bytes, int64_t qtype, const PairedRows& xp,
                        float* out, int64_t n, int64_t begin, int64_t end);

}  // namespace radixserve
