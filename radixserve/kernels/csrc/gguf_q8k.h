// K-quant matmuls on int8 activations per super-block of 256 (Q8_K), gguf_q8k.cpp.
#pragma once

#include <string>
#include <vector>

#include "common.h"

#if defined(__AMX_INT8__) && defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BW__) && \
    defined(__AVX512VNNI__)
#define RS_Q8K_AMX 1  // this build has the AMX-INT8 panel GEMM (gguf_q8k_amx.cpp)
#endif

namespace radixserve {

// Activation rows quantized per 256 values: int8 codes, one float scale, and the integer sum of
// each 16 codes (for the weights' zero points and mins).
struct Q8KRows {
  std::vector<int8_t> q;        // [M, K]
  std::vector<float> d;         // [M, K / 256]
  std::vector<int16_t> bsums;   // [M, K / 16]
};

// Whether qtype (Q3_K, Q4_K, Q5_K, Q6_K) has a Q8_K kernel in this build (AVX2).
bool q8k_type(int64_t qtype);
// Whether gguf_linear and the batch-1 chain run those types on Q8_K activations (a process-wide
// choice, made at startup by measurement; off: the int16 kernels of gguf_kquant.cpp).
void set_kquant_int8(bool on);
bool kquant_int8();

template <typename T>
void quantize_q8k(const T* x, int64_t m, int64_t k, int64_t stride, Q8KRows& out);
// One row of K values, in pieces (the batch-1 chain quantizes each thread's columns itself):
// size the buffers once, then quantize super-blocks [s0, s1).
void size_q8k_row(int64_t k, Q8KRows& out);
void quantize_q8k_row_blocks(const float* x, int64_t k, int64_t s0, int64_t s1, Q8KRows& out);

// Output columns [begin, end) of activation rows [r0, r0 + rows): out[r * out_stride + col].
void q8k_dot_columns(const uint8_t* blocks, int64_t row_bytes, int64_t qtype, const Q8KRows& xq,
                     int64_t k, int64_t r0, int64_t rows, float* out, int64_t out_stride,
                     int64_t begin, int64_t end);

// The variants of the Q8_K kernels this build has: "avx2" (maddubs, 256-bit), and where the
// CPU has more, the wider one, the default: "avx512_vnni" (512-bit per-row kernel, vpdpbusd
// panel), "avx512" (512-bit per-row kernel, no VNNI) or "avx_vnni" (256-bit vpdpbusd panel);
// last, where the CPU and the OS allow AMX-INT8, "amx_int8": avx512_vnni's kernels with the
// panel GEMM on tiles from q8k_amx_min_rows rows. Tests run each; q8k_wide() says whether a
// wider one than avx2 is in use, q8k_amx() whether amx_int8 is.
std::vector<std::string> q8k_isas();
void set_q8k_isa(const std::string& isa);
std::string q8k_isa();
bool q8k_wide();
bool q8k_amx();
// From this many activation rows amx_int8 runs panels on tiles (fewer: the vpdpbusd panel).
void set_q8k_amx_min_rows(int64_t rows);
int64_t q8k_amx_min_rows();
// Whether the OS grants this process the tile state (asked once; false in a build without AMX).
bool q8k_amx_permitted();
// q8k_panel_linear on AMX-INT8 tiles (gguf_q8k_amx.cpp).
void q8k_amx_linear(const uint8_t* blocks, int64_t row_bytes, int64_t qtype, const Q8KRows& xq,
                    int64_t m, int64_t k, int64_t n, float* out);
// Many activation rows: out[M, N] = x . W^T over panels of weight rows decoded once
// (gguf_q8k_panel.cpp).
void q8k_panel_linear(const uint8_t* blocks, int64_t row_bytes, int64_t qtype, const Q8KRows& xq,
                      int64_t m, int64_t k, int64_t n, float* out);
// From this many activation rows on, gguf_linear takes the panel GEMM for K-quants (Q8_K
// activations, whatever set_kquant_int8 says for fewer rows). Off (int64 max) until set: chosen
// at startup by measurement (layers/kquant_paths.py); tests move it to reach either path.
void set_q8k_panel_min_rows(int64_t rows);
int64_t q8k_panel_min_rows();

}  // namespace radixserve
