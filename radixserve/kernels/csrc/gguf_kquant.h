// GGUF block types beyond Q4_1/Q8_0 (gguf_kquant.cpp): Q4_0, Q5_0, Q5_1, IQ4_NL, MXFP4 and the
// K-quants Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, run on AVX2 by the same int16 activation blocks
// (QuantizedRows) as Q4_1. Every type is decoded one group of 32 weights at a time into int16
// codes c and two floats (a, o) with weight = a * c + o for the group: sub-block scales that
// vary inside a group (Q6_K, Q3_K: one per 16) are folded into the codes, which stay small
// enough for exact int32 sums.
#pragma once

#include <type_traits>
#include <vector>

#include "common.h"
#include "gguf_blocks.h"
#include "gguf_gemv.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace radixserve {
namespace gguf {

// GGML type ids of the types gguf_kquant.cpp runs.
constexpr int64_t kQ4_0 = 2, kQ5_0 = 6, kQ5_1 = 7, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13,
                  kQ6_K = 14, kIQ4_NL = 20, kIQ4_XS = 23, kMXFP4 = 39;

// True for the types above, in builds with AVX2 (the only ISA they are written for).
bool kquant_type(int64_t qtype);
// Bytes of one row of K weights of a kquant_type.
int64_t kquant_row_bytes(int64_t qtype, int64_t k);

// The types gguf_linear multiplies natively (Q4_1, Q8_0 and the kquant_types), and the bytes
// of one row of K weights of one of them: the checks every entry point on block weights makes.
inline bool linear_type(int64_t qtype) {
  return qtype == kQ4_1 || qtype == kQ8_0 || kquant_type(qtype);
}
inline int64_t linear_row_bytes(int64_t qtype, int64_t k) {
  return kquant_type(qtype) ? kquant_row_bytes(qtype, k)
                            : k / kBlock * (qtype == kQ4_1 ? kQ4_1Bytes : kQ8_0Bytes);
}

// A super-block's decoded group scales, kept between calls for its groups (one per column of
// a panel being packed): K-quant scales are packed in bits, and decoding them for each of a
// super-block's 8 groups made panel packing ~2x slower.
struct GroupScales {
  const uint8_t* block = nullptr;
  float a[8], o[8];
};

#if defined(__AVX2__)
// The 32 float weights of group b (weights 32b..32b+31) of one row, as 4 vectors of 8.
void kquant_dequantize_group(const uint8_t* row, int64_t qtype, int64_t b, __m256 v[4],
                             GroupScales* cache);
#endif

// Calls f(std::integral_constant<int, R>{}) for R = rows (1 to 4): the dot kernels take their
// activation-row count as a template parameter, so their accumulators stay in registers.
template <class F>
inline void with_row_tile(int64_t rows, F&& f) {
  switch (rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

}  // namespace gguf

// Output columns [begin, end) of the activation rows [r0, r0 + rows) of xq against a
// kquant_type weight [N, K]: out[r * out_stride + col].
void kquant_dot_columns(const uint8_t* blocks, int64_t row_bytes, int64_t qtype,
                        const QuantizedRows& xq, int64_t k, int64_t r0, int64_t rows, float* out,
                        int64_t out_stride, int64_t begin, int64_t end);

}  // namespace radixserve
