// The single-row (batch-1) pieces of the GGUF integer matmul (gguf_gemm.cpp), for callers that
// split a matmul's columns over threads themselves (single_row_chain.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace radixserve {

// Activation rows quantized per block of 32 to int16 with one float scale per block.
struct QuantizedRows {
  std::vector<int16_t> q;    // [M, K]
  std::vector<float> scale;  // [M, K / 32]
  std::vector<float> sum;    // [M, K / 32], exact float sums of each block
};

// Sizes `out` for one row of K values (K a multiple of 32).
void size_quantized_row(int64_t k, QuantizedRows& out);

// Blocks [b0, b1) of the float row x (K values) quantized into row 0 of `out` (already sized):
// the same values gguf_linear's quantization gives them.
void quantize_row_blocks(const float* x, int64_t k, int64_t b0, int64_t b1, QuantizedRows& out);

// Output columns [begin, end) of row 0 of xq times GGUF blocks W [N, K] (Q4_1 or Q8_0): the same
// values gguf_linear computes for a single activation row.
void gguf_gemv_columns(const uint8_t* blocks, int64_t row_bytes, int64_t qtype,
                       const QuantizedRows& xq, int64_t k, float* out, int64_t begin,
                       int64_t end);

}  // namespace radixserve
