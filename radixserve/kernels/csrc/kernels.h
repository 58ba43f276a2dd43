// Declarations of radixserve's CPU kernels, shared by the bindings and the fused layer.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <memory>
#include <vector>

namespace radixserve {
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& x);
// torch.argmax(logits, dim=-1) for float32 or bfloat16 [rows, vocab] logits (greedy sampling).
at::Tensor argmax_rows(const at::Tensor& logits);
void rope_store_kv(at::Tensor& q, at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                   const at::Tensor& cos_sin, at::Tensor& k_cache, at::Tensor& v_cache,
                   const at::Tensor& slots, int64_t head_dim, int64_t rot_dim, bool neox,
                   double k_scale, double v_scale);
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& req_to_token,
                           const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens,
                           const at::Tensor& extend_lens, const at::Tensor& q_starts,
                           int64_t heads, double scale, double k_scale, double v_scale);
at::Tensor paged_attention_sinks(const at::Tensor& q, const at::Tensor& k_cache,
                                 const at::Tensor& v_cache, const at::Tensor& req_to_token,
                                 const at::Tensor& req_pool_indices,
                                 const at::Tensor& prefix_lens, const at::Tensor& extend_lens,
                                 const at::Tensor& q_starts, int64_t heads, double scale,
                                 const at::Tensor& sinks, double k_scale, double v_scale);
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                       int64_t out_features);
std::vector<at::Tensor> llama_layer(
    const at::Tensor& hidden, const at::Tensor& residual, const std::vector<at::Tensor>& norms,
    double eps, const std::vector<at::Tensor>& weights, const std::vector<int64_t>& qtypes,
    const std::vector<int64_t>& part_counts, const std::vector<at::Tensor>& biases,
    const at::Tensor& positions, const at::Tensor& cos_sin,
    int64_t rot_dim, bool neox, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& slots, const at::Tensor& req_to_token, const std::vector<at::Tensor>& meta,
    int64_t heads, int64_t kv_heads, int64_t head_dim, double scale, double k_scale,
    double v_scale);
at::Tensor gguf_linear_tiled(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                             int64_t out_features);
bool gguf_tiled_available();
// The same matmul for bfloat16 x on AMX-BF16 tiles (gguf_gemm_amx.cpp), Q4_1 and Q8_0: [M, N]
// float32. Compiled where the compiler has AMX-BF16; available where the OS also grants the tile
// state; enabled (the default) unless set_gguf_tiled_amx_enabled(false).
at::Tensor gguf_linear_tiled_amx(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                                 int64_t out_features);
// The same rounded to bfloat16 while the results are written (what gguf_linear returns for
// bfloat16 x): the bits of gguf_linear_tiled_amx(...).to(kBFloat16) without the extra pass.
at::Tensor gguf_linear_tiled_amx_bf16(const at::Tensor& x, const at::Tensor& blocks,
                                      int64_t qtype, int64_t out_features);
// Each row's argmax over the first `columns` of those bfloat16 results, never written.
at::Tensor gguf_argmax_tiled_amx_bf16(const at::Tensor& x, const at::Tensor& blocks,
                                      int64_t qtype, int64_t out_features, int64_t columns);
// argmax_rows(gguf_linear(x, ...)[:, :columns]): fused where gguf_linear takes the AMX tiles.
at::Tensor gguf_linear_argmax(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                              int64_t out_features, int64_t columns);
bool gguf_tiled_amx_compiled();
bool gguf_tiled_amx_available();
void set_gguf_tiled_amx_enabled(bool enabled);
bool gguf_tiled_amx_enabled();  // enabled and available
at::Tensor float_linear_packed(const at::Tensor& x, const at::Tensor& w);
at::Tensor float_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);
void set_float_packed_min_rows(int64_t rows);
// Tokens through their chosen experts (moe.cpp): the grouped path's sums in two parallel
// regions; x [T, H] float32, experts/weights [T, k]. Used (by FusedMoE and moe_layer.cpp
// alike) up to kMoERowsMaxTokens tokens: beyond, each expert has enough rows for the
// many-row GEMM kernels (panels, AMX) of gguf_linear.
constexpr int64_t kMoERowsMaxTokens = 32;
at::Tensor moe_rows_gguf(const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weights,
                         const std::vector<at::Tensor>& gate_up,
                         const std::vector<int64_t>& gate_up_qtypes, const at::Tensor& down,
                         int64_t down_qtype);
void set_attention_query_rows(int64_t rows);  // 1: batch-invariant attention
void set_gguf_tiled_enabled(bool enabled);  // false: batch-invariant GGUF matmuls
bool gguf_tiled_enabled();
int64_t attention_query_rows();
int64_t float_packed_min_rows();
bool float_packed_available();
at::Tensor half_weight_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);
bool half_weight_linear_available();
int64_t bind_threads(const std::vector<int64_t>& cpus);

// A mixture-of-experts MLP on GGUF expert blocks (moe_layer.cpp): the router (float or GGUF
// weight [E, H]), softmax top-k routing and the chosen experts, as layers/moe/FusedMoE runs
// it with the C++ kernels on (the same ATen and kernel calls in the same order: the same bits).
struct MoEBlock {
  at::Tensor router;
  int64_t router_qtype = -1;  // -1: a float weight
  int64_t top_k = 0;
  bool renormalize = false;
  std::vector<at::Tensor> gate_up;  // parts [E, rows, bytes], gate rows first
  std::vector<int64_t> gate_up_qtypes;
  at::Tensor down;  // [E, H, bytes]
  int64_t down_qtype = 0;
};
// x [T, H] (the post-attention normed hidden) -> [T, H].
at::Tensor moe_block_forward(const MoEBlock& moe, const at::Tensor& x);
// One float32 token's chosen experts in ascending id and their weights (the order the experts'
// outputs are added in), from the same router and routing calls as moe_block_forward.
struct TokenRoute {
  std::vector<int64_t> experts;
  std::vector<double> weights;
};
TokenRoute route_token(const MoEBlock& moe, const at::Tensor& x);
// x @ W^T (+ bias) for a float (qtype -1) or GGUF-block weight, as llama_layer projects.
at::Tensor project_weight(const at::Tensor& x, const at::Tensor& weight, int64_t qtype,
                          const at::Tensor& bias);

// llama_layer's per-layer constants (norms, weights, rotary table, head shapes) for every
// decoder layer of a model, held on the C++ side so a forward pass is one call from Python
// (run) instead of one per layer with ~20 arguments each. run calls llama_layer layer by layer:
// the same results.
class LlamaLayerChain {
 public:
  // Flat lists, layer after layer: norms two per layer (input, post-attention), part_counts
  // and biases four (qkv, o, gate_up, down), weights and qtypes one per part (part_counts[p]
  // for projection p: a fused q|k|v whose parts have different block types runs part by part),
  // the rest one.
  LlamaLayerChain(const std::vector<at::Tensor>& norms, const std::vector<double>& eps,
                  const std::vector<at::Tensor>& weights, const std::vector<int64_t>& qtypes,
                  const std::vector<int64_t>& part_counts, const std::vector<at::Tensor>& biases, const std::vector<at::Tensor>& cos_sin,
                  const std::vector<int64_t>& rot_dim, const std::vector<bool>& neox,
                  const std::vector<int64_t>& heads, const std::vector<int64_t>& kv_heads,
                  const std::vector<int64_t>& head_dim, const std::vector<double>& scale);
  // All layers from the embeddings; {output, residual} of the last layer, as llama_layer.
  std::vector<at::Tensor> run(const at::Tensor& hidden, const at::Tensor& positions,
                              const std::vector<at::Tensor>& k_caches,
                              const std::vector<at::Tensor>& v_caches, const at::Tensor& slots,
                              const at::Tensor& req_to_token,
                              const std::vector<at::Tensor>& meta) const;
  int64_t size() const { return static_cast<int64_t>(layers_.size()); }
  // Layer i normalizes each query and key head (Qwen3's q_norm/k_norm, RMSNorm over head_dim)
  // before RoPE.
  void set_qk_norm(int64_t layer, const at::Tensor& q_norm, const at::Tensor& k_norm,
                   double eps);
  // Layer i's KV cache holds 8-bit codes of K / k_scale and V / v_scale (1 and 1 otherwise).
  void set_kv_scales(int64_t layer, double k_scale, double v_scale);
  // Layer i's MLP is a mixture of experts (its gate_up/down part counts are 0).
  void set_moe(int64_t layer, const at::Tensor& router, int64_t router_qtype, int64_t top_k,
               bool renormalize, const std::vector<at::Tensor>& gate_up,
               const std::vector<int64_t>& gate_up_qtypes, const at::Tensor& down,
               int64_t down_qtype);
  // How many runs took the single-token path (run_single_row_chain): for tests and profiling.
  int64_t single_row_runs() const { return single_row_runs_.load(); }

  struct Layer {
    std::vector<at::Tensor> norms, weights, biases;
    std::vector<int64_t> qtypes;
    std::vector<int64_t> part_counts;  // 4: weights/qtypes entries of each projection
    // The index in weights/qtypes of projection p's first part.
    int64_t first_part(int p) const {
      int64_t i = 0;
      for (int j = 0; j < p; ++j) i += part_counts[j];
      return i;
    }
    double eps = 0.0, scale = 0.0;
    double k_scale = 1.0, v_scale = 1.0;  // an 8-bit KV cache's per-layer scales
    at::Tensor cos_sin;
    int64_t rot_dim = 0, heads = 0, kv_heads = 0, head_dim = 0;
    bool neox = false;
    at::Tensor q_norm, k_norm;  // undefined: no per-head q/k norm
    double qk_eps = 0.0;
    std::shared_ptr<const MoEBlock> moe;  // null: the dense MLP of parts 2 and 3
  };

 private:
  std::vector<Layer> layers_;
  mutable std::atomic<int64_t> single_row_runs_{0};
};

// single_row_chain.cpp: the whole chain for one token in one parallel region, where it applies
// (float32 activations, GGUF-block projections without biases, one request's single new token).
bool single_row_chain_applies(const std::vector<LlamaLayerChain::Layer>& layers,
                              const at::Tensor& hidden, const std::vector<at::Tensor>& k_caches,
                              const std::vector<at::Tensor>& v_caches,
                              const std::vector<at::Tensor>& meta);
std::vector<at::Tensor> run_single_row_chain(const std::vector<LlamaLayerChain::Layer>& layers,
                                             const at::Tensor& hidden,
                                             const at::Tensor& positions,
                                             const std::vector<at::Tensor>& k_caches,
                                             const std::vector<at::Tensor>& v_caches,
                                             const at::Tensor& slots,
                                             const at::Tensor& req_to_token,
                                             const std::vector<at::Tensor>& meta);
}  // namespace radixserve
