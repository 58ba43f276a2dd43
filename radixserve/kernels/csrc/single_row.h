// Raw one-row pieces of the element-wise and attention kernels (elementwise.cpp,
// attention.cpp), for single_row_chain.cpp: the same arithmetic as the tensor-level kernels,
// callable inside a parallel region (no tensors, no checks, nothing thrown).
#pragma once

#include <cstdint>

namespace radixserve {

// The KV cache's element type, for the raw single-row pieces (no at::Tensor to ask). The 8-bit
// types store value / scale (per layer, K and V apart); readers widen them in registers.
enum class KvElem : int8_t { kFloat, kBFloat16, kFp8E4M3, kFp8E5M2 };

// residual <- x + residual; x <- rms_norm(residual) * weight.
void add_rms_norm_row_f32(float* x, float* residual, const float* weight, int64_t d, float eps);
// out <- rms_norm(x) * weight.
void rms_norm_row_f32(const float* x, const float* weight, float* out, int64_t d, float eps);
// out[i] = silu(gate[i]) * up[i]; a span starting at a multiple of 8 of its row gives each
// element what silu_and_mul gives it.
// out += y * weight with the product rounded first (moe.cpp: the MoE expert sum).
void add_weighted_f32(float* out, const float* y, float weight, int64_t n);
void silu_mul_span_f32(const float* gate, const float* up, float* out, int64_t n);
// One token: RoPE on q [heads * head_dim] and k [kv_heads * head_dim] in place (cos: the
// token's row of the cos/sin table), then k / k_scale and v / v_scale stored into the KV rows
// given (the scales are 1 for float caches).
void rope_store_token_f32(float* q, float* k, const float* v, const float* cos, int64_t heads,
                          int64_t kv_heads, int64_t head_dim, int64_t rot_dim, bool neox,
                          void* k_cache_row, void* v_cache_row, KvElem cache, float k_scale,
                          float v_scale);
// Attention of one new token (keys [0, prefix], read through token_row) for KV heads [h0, h1):
// writes those heads' slices of out_row. What paged_attention computes for such a token.
void decode_attention_heads(const float* q_row, const void* k_cache, const void* v_cache,
                            KvElem cache, float k_scale, float v_scale, int64_t kv_heads,
                            int64_t head_dim, const int64_t* token_row, int64_t prefix,
                            int64_t heads, int64_t h0, int64_t h1, float scale, float* out_row);

}  // namespace radixserve
