// One Llama-family decoder layer in a single call: the same kernels, in the same order, as the
// layer-by-layer fast path (so the results are bitwise equal to it), without the ~10 Python
// module calls and dispatches per layer that cost a few milliseconds per decode step at small
// batch sizes.
#include "common.h"
#include "kernels.h"

namespace radixserve {
namespace {

constexpr int64_t kFloatWeight = -1;  // qtype of a plain float weight (else a GGML type id)

// A projection made of parts (weights[first, first + count)) whose outputs are laid end to end:
// a fused q|k|v with a Q6_K v and Q4_K q, k (llama.cpp's Q4_K_M) runs part by part.
at::Tensor project_parts(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                         const std::vector<int64_t>& qtypes, int64_t first, int64_t count,
                         const at::Tensor& bias) {
  if (count == 1) return project_weight(x, weights[first], qtypes[first], bias);
  const at::Tensor none = at::empty({0}, x.options());
  std::vector<at::Tensor> outs;
  for (int64_t i = first; i < first + count; ++i) {
    outs.push_back(project_weight(x, weights[i], qtypes[i], none));
  }
  auto out = at::cat(outs, 1);
  return bias.numel() > 0 ? out + bias : out;
}

// Each head's [head_dim] slice normalized (RMSNorm), as LlamaAttention._norm_heads runs it with
// the fast kernels: rows of head_dim, the same rms_norm kernel.
at::Tensor norm_heads(const at::Tensor& x, const at::Tensor& weight, double eps,
                      int64_t head_dim) {
  const int64_t tokens = x.size(0);
  return rms_norm(x.reshape({-1, head_dim}), weight, eps).view({tokens, -1});
}

// One layer (hidden [T, E] contiguous; residual [T, E] or empty for the first layer).
std::vector<at::Tensor> run_layer(const LlamaLayerChain::Layer& l, const at::Tensor& hidden,
                                  const at::Tensor& residual, const at::Tensor& positions,
                                  const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& slots, const at::Tensor& req_to_token,
                                  const std::vector<at::Tensor>& meta) {
  check_cpu(hidden, "hidden");
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous(), "hidden must be contiguous [T, E]");
  TORCH_CHECK(meta.size() == 4, "meta: req_pool_indices, prefix_lens, extend_lens, q_starts");
  auto proj = [&](const at::Tensor& in, int p) {
    return project_parts(in, l.weights, l.qtypes, l.first_part(p), l.part_counts[p],
                         l.biases[p]);
  };
  at::Tensor x, res;
  if (residual.numel() == 0) {
    res = hidden;
    x = rms_norm(hidden, l.norms[0], l.eps);
  } else {
    TORCH_CHECK(residual.sizes() == hidden.sizes() && residual.is_contiguous(),
                "residual must be contiguous and shaped like hidden");
    x = hidden;
    res = residual;
    fused_add_rms_norm(x, res, l.norms[0], l.eps);
  }
  auto qkv = proj(x, 0);
  const int64_t q_size = l.heads * l.head_dim, kv_size = l.kv_heads * l.head_dim;
  TORCH_CHECK(qkv.size(1) == q_size + 2 * kv_size, "qkv width does not match the heads");
  auto q = qkv.narrow(1, 0, q_size);
  auto k = qkv.narrow(1, q_size, kv_size);
  auto v = qkv.narrow(1, q_size + kv_size, kv_size);
  if (l.q_norm.defined()) {
    q = norm_heads(q, l.q_norm, l.qk_eps, l.head_dim);
    k = norm_heads(k, l.k_norm, l.qk_eps, l.head_dim);
  }
  at::Tensor kc = k_cache, vc = v_cache;
  rope_store_kv(q, k, v, positions, l.cos_sin, kc, vc, slots, l.head_dim, l.rot_dim, l.neox,
                l.k_scale, l.v_scale);
  auto attn = paged_attention(q, k_cache, v_cache, req_to_token, meta[0], meta[1], meta[2],
                              meta[3], l.heads, l.scale, l.k_scale, l.v_scale);
  auto o = proj(attn, 1);
  fused_add_rms_norm(o, res, l.norms[1], l.eps);
  if (l.moe) return {moe_block_forward(*l.moe, o), res};
  TORCH_CHECK(l.part_counts[2] >= 1 && l.part_counts[3] >= 1, "a dense layer needs its MLP");
  auto act = silu_and_mul(proj(o, 2));
  return {proj(act, 3), res};
}

// A layer's constants from flat lists (weights/qtypes from `part`, biases four from 4 * i).
LlamaLayerChain::Layer make_layer(const std::vector<at::Tensor>& norms, double eps,
                                  const std::vector<at::Tensor>& weights,
                                  const std::vector<int64_t>& qtypes,
                                  const std::vector<int64_t>& part_counts,
                                  const std::vector<at::Tensor>& biases, size_t i, size_t& part,
                                  const at::Tensor& cos_sin, int64_t rot_dim, bool neox,
                                  int64_t heads, int64_t kv_heads, int64_t head_dim,
                                  double scale) {
  LlamaLayerChain::Layer layer;
  layer.norms.assign(norms.begin() + 2 * i, norms.begin() + 2 * i + 2);
  layer.part_counts.assign(part_counts.begin() + 4 * i, part_counts.begin() + 4 * i + 4);
  size_t count = 0;
  for (int p = 0; p < 4; ++p) {
    const int64_t c = layer.part_counts[p];
    // gate_up and down may have none: the MLP is then a MoE block (set_moe).
    TORCH_CHECK(c >= (p < 2 ? 1 : 0), "qkv and o need a part");
    count += static_cast<size_t>(c);
  }
  TORCH_CHECK(part + count <= weights.size(), "weights, qtypes: one per part");
  layer.weights.assign(weights.begin() + part, weights.begin() + part + count);
  layer.qtypes.assign(qtypes.begin() + part, qtypes.begin() + part + count);
  part += count;
  layer.biases.assign(biases.begin() + 4 * i, biases.begin() + 4 * i + 4);
  layer.eps = eps;
  layer.cos_sin = cos_sin;
  layer.rot_dim = rot_dim;
  layer.neox = neox;
  layer.heads = heads;
  layer.kv_heads = kv_heads;
  layer.head_dim = head_dim;
  layer.scale = scale;
  return layer;
}

}  // namespace

// x @ W^T (+ bias): W is GGUF blocks (qtype >= 0) or a float [N, K] weight. An empty bias
// tensor means no bias.
at::Tensor project_weight(const at::Tensor& x, const at::Tensor& weight, int64_t qtype,
                          const at::Tensor& bias) {
  const bool has_bias = bias.numel() > 0;
  if (qtype == kFloatWeight) {
    if (weight.scalar_type() != x.scalar_type()) {  // 16-bit weights, float32 activations
      return half_weight_linear(x, weight, bias);
    }
    return float_linear(x, weight, bias);  // at::linear, or the packed kernel (float_gemm.cpp)
  }
  // The block count per row fixes N: blocks are [N, bytes].
  auto out = gguf_linear(x, weight, qtype, weight.size(0));
  return has_bias ? out + bias : out;
}

// hidden [T, E] (contiguous), residual [T, E] or empty for the first layer.
// norms: {input_layernorm, post_attention_layernorm} weights.
// part_counts/biases: qkv, o, gate_up, down projections (biases empty where absent); weights and
// qtypes: their parts, part_counts[p] for projection p (one, unless a fused projection's parts
// have different block types).
// meta: {req_pool_indices, prefix_lens, extend_lens, q_starts} as for paged_attention.
// Returns {mlp output, residual}: what LlamaDecoderLayer.forward returns. `hidden` and
// `residual` may be overwritten (as the layer-by-layer fused norms do).
std::vector<at::Tensor> llama_layer(
    const at::Tensor& hidden, const at::Tensor& residual, const std::vector<at::Tensor>& norms,
    double eps, const std::vector<at::Tensor>& weights, const std::vector<int64_t>& qtypes,
    const std::vector<int64_t>& part_counts, const std::vector<at::Tensor>& biases,
    const at::Tensor& positions, const at::Tensor& cos_sin,
    int64_t rot_dim, bool neox, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& slots, const at::Tensor& req_to_token, const std::vector<at::Tensor>& meta,
    int64_t heads, int64_t kv_heads, int64_t head_dim, double scale, double k_scale,
    double v_scale) {
  TORCH_CHECK(norms.size() == 2, "norms: input and post-attention weights");
  TORCH_CHECK(part_counts.size() == 4 && biases.size() == 4,
              "part_counts, biases: qkv, o, gate_up, down");
  size_t part = 0;
  auto layer = make_layer(norms, eps, weights, qtypes, part_counts, biases, 0, part, cos_sin,
                          rot_dim, neox, heads, kv_heads, head_dim, scale);
  layer.k_scale = k_scale;
  layer.v_scale = v_scale;
  TORCH_CHECK(part == weights.size(), "weights, qtypes: one per part");
  return run_layer(layer, hidden, residual, positions, k_cache, v_cache, slots, req_to_token,
                   meta);
}

LlamaLayerChain::LlamaLayerChain(
    const std::vector<at::Tensor>& norms, const std::vector<double>& eps,
    const std::vector<at::Tensor>& weights, const std::vector<int64_t>& qtypes,
    const std::vector<int64_t>& part_counts, const std::vector<at::Tensor>& biases,
    const std::vector<at::Tensor>& cos_sin,
    const std::vector<int64_t>& rot_dim, const std::vector<bool>& neox,
    const std::vector<int64_t>& heads, const std::vector<int64_t>& kv_heads,
    const std::vector<int64_t>& head_dim, const std::vector<double>& scale) {
  const size_t n = eps.size();
  TORCH_CHECK(n > 0, "a layer chain needs at least one layer");
  TORCH_CHECK(norms.size() == 2 * n, "norms: two per layer");
  TORCH_CHECK(part_counts.size() == 4 * n && biases.size() == 4 * n,
              "part_counts, biases: four per layer");
  TORCH_CHECK(weights.size() == qtypes.size(), "weights, qtypes: one per part");
  TORCH_CHECK(cos_sin.size() == n && rot_dim.size() == n && neox.size() == n &&
                  heads.size() == n && kv_heads.size() == n && head_dim.size() == n &&
                  scale.size() == n,
              "per-layer settings: one per layer");
  size_t part = 0;
  for (size_t i = 0; i < n; ++i) {
    layers_.push_back(make_layer(norms, eps[i], weights, qtypes, part_counts, biases, i, part,
                                 cos_sin[i], rot_dim[i], neox[i], heads[i], kv_heads[i],
                                 head_dim[i], scale[i]));
  }
  TORCH_CHECK(part == weights.size(), "weights, qtypes: one per part");
}

std::vector<at::Tensor> LlamaLayerChain::run(const at::Tensor& hidden,
                                             const at::Tensor& positions,
                                             const std::vector<at::Tensor>& k_caches,
                                             const std::vector<at::Tensor>& v_caches,
                                             const at::Tensor& slots,
                                             const at::Tensor& req_to_token,
                                             const std::vector<at::Tensor>& meta) const {
  TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(),
              "one K and one V cache per layer");
  if (single_row_chain_applies(layers_, hidden, k_caches, v_caches, meta)) {
    single_row_runs_.fetch_add(1);
    return run_single_row_chain(layers_, hidden, positions, k_caches, v_caches, slots,
                                req_to_token, meta);
  }
  const at::Tensor no_residual = at::empty({0}, hidden.options());
  std::vector<at::Tensor> state{hidden, no_residual};  // {output, residual} of the last layer
  for (size_t i = 0; i < layers_.size(); ++i) {
    state = run_layer(layers_[i], state[0], state[1], positions, k_caches[i], v_caches[i], slots,
                      req_to_token, meta);
  }
  return state;
}


void LlamaLayerChain::set_qk_norm(int64_t layer, const at::Tensor& q_norm,
                                  const at::Tensor& k_norm, double eps) {
  TORCH_CHECK(layer >= 0 && layer < size(), "no layer ", layer);
  Layer& l = layers_[layer];
  TORCH_CHECK(q_norm.numel() == l.head_dim && k_norm.numel() == l.head_dim,
              "q/k norm weights must have head_dim values");
  l.q_norm = q_norm;
  l.k_norm = k_norm;
  l.qk_eps = eps;
}

void LlamaLayerChain::set_kv_scales(int64_t layer, double k_scale, double v_scale) {
  TORCH_CHECK(layer >= 0 && layer < size(), "no layer ", layer);
  TORCH_CHECK(k_scale > 0.0 && v_scale > 0.0, "KV scales must be positive");
  layers_[layer].k_scale = k_scale;
  layers_[layer].v_scale = v_scale;
}

void LlamaLayerChain::set_moe(int64_t layer, const at::Tensor& router, int64_t router_qtype,
                              int64_t top_k, bool renormalize,
                              const std::vector<at::Tensor>& gate_up,
                              const std::vector<int64_t>& gate_up_qtypes, const at::Tensor& down,
                              int64_t down_qtype) {
  TORCH_CHECK(layer >= 0 && layer < size(), "no layer ", layer);
  Layer& l = layers_[layer];
  TORCH_CHECK(l.part_counts[2] == 0 && l.part_counts[3] == 0,
              "a MoE layer has no dense gate_up/down parts");
  TORCH_CHECK(gate_up.size() == gate_up_qtypes.size() && !gate_up.empty(), "gate|up parts");
  TORCH_CHECK(top_k >= 1 && top_k <= router.size(0), "top_k must be within 1..experts");
  auto moe = std::make_shared<MoEBlock>();
  moe->router = router;
  moe->router_qtype = router_qtype;
  moe->top_k = top_k;
  moe->renormalize = renormalize;
  moe->gate_up = gate_up;
  moe->gate_up_qtypes = gate_up_qtypes;
  moe->down = down;
  moe->down_qtype = down_qtype;
  l.moe = std::move(moe);
}

}  // namespace radixserve
