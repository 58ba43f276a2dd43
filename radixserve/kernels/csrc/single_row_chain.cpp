// Every decoder layer for one token (batch-1 decode) in one OpenMP parallel region.
//
// At batch 1 a layer is four GEMVs, one token's attention and a few small row operations. Run
// as separate kernels (llama_layer), each GEMV and the attention is a parallel region of its
// own, and everything between them (norms, activation quantization, RoPE, SiLU, tensor
// allocation) runs on one thread while the others wait: ~17% of a step on two cores (perf,
// 2026-12-02). Here the threads stay in one region for the whole stack: each GEMV's columns are
// split over them, the attention's KV heads are handed out from a counter, SiLU and the
// quantization of its output are done by each thread for its own columns, and only the row
// operations of hidden-size length run on thread 0, between barriers.
// Per output element the arithmetic is that of the kernels llama_layer calls (the same
// functions), so the results are bitwise equal to its. A GEMV input is quantized in the formats
// its weights take (int16 blocks per 32, or Q8_K per 256 for K-quants when set_kquant_int8 chose
// it), and a projection made of parts of different types (Q4_K_M's q|k|v with a Q6_K v) runs
// them as one range of output columns split over the threads.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include "common.h"
#include "gguf_blocks.h"
#include "gguf_gemv.h"
#include "gguf_kquant.h"
#include "gguf_q8k.h"
#include "kernels.h"
#include "single_row.h"

namespace radixserve {
namespace {

constexpr int64_t kQKV = 0, kO = 1, kGateUp = 2, kDown = 3;

// The block types the chain's GEMV runs.
bool is_block_type(int64_t qtype) {
  return qtype == gguf::kQ4_1 || qtype == gguf::kQ8_0 || gguf::kquant_type(qtype);
}

// Whether gguf_linear runs qtype on Q8_K activations at one row (gguf_q8k.cpp).
bool on_q8k(int64_t qtype) { return kquant_int8() && q8k_type(qtype); }

// K of GGUF blocks [N, row_bytes] (0 when the bytes are not a whole number of blocks).
int64_t block_k(const at::Tensor& blocks, int64_t qtype) {
  if (gguf::kquant_type(qtype)) {
    const int64_t per_256 = gguf::kquant_row_bytes(qtype, 256);  // bytes per 256 weights
    return blocks.size(1) % per_256 == 0 ? blocks.size(1) / per_256 * 256 : 0;
  }
  const int64_t bytes = qtype == gguf::kQ4_1 ? gguf::kQ4_1Bytes : gguf::kQ8_0Bytes;
  return blocks.size(1) / bytes * gguf::kBlock;
}

// Thread t's share [begin, end) of n columns; inner edges are multiples of `align`.
std::pair<int64_t, int64_t> share(int64_t n, int64_t t, int64_t threads, int64_t align) {
  auto edge = [&](int64_t i) { return i >= threads ? n : n * i / threads / align * align; };
  return {edge(t), edge(t + 1)};
}

bool is_float_vector(const at::Tensor& t, int64_t n) {
  return t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n;
}

int64_t first_value(const at::Tensor& t) {
  return t.scalar_type() == at::kLong && t.numel() == 1 ? t.contiguous().data_ptr<int64_t>()[0]
                                                        : -1;
}

// One part of a projection: GGUF blocks of `rows` output rows.
struct Part {
  const uint8_t* weights;
  int64_t row_bytes, qtype, rows;
};

// A GEMV input row in the formats its weights need.
struct ChainInput {
  QuantizedRows int16;
  Q8KRows int8;
  bool need_int16 = false, need_int8 = false;

  void size_for(const std::vector<Part>& parts, int64_t k) {
    for (const Part& p : parts) (on_q8k(p.qtype) ? need_int8 : need_int16) = true;
    if (need_int16) size_quantized_row(k, int16);
    if (need_int8) size_q8k_row(k, int8);
  }
  // Values [c0, c1) of x (c0, c1 multiples of align()).
  void quantize(const float* x, int64_t k, int64_t c0, int64_t c1) {
    if (need_int16) quantize_row_blocks(x, k, c0 / gguf::kBlock, c1 / gguf::kBlock, int16);
    if (need_int8) quantize_q8k_row_blocks(x, k, c0 / 256, c1 / 256, int8);
  }
  int64_t align() const { return need_int8 ? 256 : gguf::kBlock; }
};

// Output columns [b, e) of the parts laid end to end, for input `in` of length k.
void gemv_parts(const std::vector<Part>& parts, const ChainInput& in, int64_t k, float* out,
                int64_t b, int64_t e) {
  int64_t offset = 0;
  for (const Part& p : parts) {
    const int64_t lo = std::max(b, offset) - offset, hi = std::min(e, offset + p.rows) - offset;
    if (lo < hi) {
      if (on_q8k(p.qtype)) {
        q8k_dot_columns(p.weights, p.row_bytes, p.qtype, in.int8, k, 0, 1, out + offset, 0, lo,
                        hi);
      } else {
        gguf_gemv_columns(p.weights, p.row_bytes, p.qtype, in.int16, k, out + offset, lo, hi);
      }
    }
    offset += p.rows;
  }
}


// Whether the region can run this MoE block's experts: GGUF block stacks of the chain's types,
// gate|up [E, 2I, bytes of K = e], down [E, e, bytes of K = I], I a whole number of the down
// input's blocks. (The router runs between regions, on any weight project_weight takes.)
bool moe_applies(const MoEBlock& moe, int64_t e) {
  const int64_t experts = moe.down.size(0);
  int64_t rows = 0;
  for (size_t p = 0; p < moe.gate_up.size(); ++p) {
    const at::Tensor& w = moe.gate_up[p];
    if (!is_block_type(moe.gate_up_qtypes[p]) || w.scalar_type() != at::kByte ||
        !w.is_contiguous() || w.dim() != 3 || w.size(0) != experts ||
        block_k(w.select(0, 0), moe.gate_up_qtypes[p]) != e) {
      return false;
    }
    rows += w.size(1);
  }
  const at::Tensor& d = moe.down;
  const int64_t inter = rows / 2;
  const int64_t align = on_q8k(moe.down_qtype) ? 256 : gguf::kBlock;
  return rows % 2 == 0 && inter > 0 && inter % align == 0 && is_block_type(moe.down_qtype) &&
         d.scalar_type() == at::kByte && d.is_contiguous() && d.dim() == 3 && d.size(1) == e &&
         block_k(d.select(0, 0), moe.down_qtype) == inter && moe.top_k >= 1;
}

// A MoE layer's expert stacks as raw pointers: expert x's part is base + x * expert_bytes.
struct ExpertStacks {
  std::vector<Part> gate_up;  // expert 0's parts
  std::vector<int64_t> gate_up_expert_bytes;
  Part down;
  int64_t down_expert_bytes = 0, inter = 0;

  explicit ExpertStacks(const MoEBlock& moe) {
    for (size_t p = 0; p < moe.gate_up.size(); ++p) {
      const at::Tensor& w = moe.gate_up[p];
      gate_up.push_back({w.data_ptr<uint8_t>(), w.size(2), moe.gate_up_qtypes[p], w.size(1)});
      gate_up_expert_bytes.push_back(w.size(1) * w.size(2));
      inter += w.size(1);
    }
    inter /= 2;
    const at::Tensor& d = moe.down;
    down = {d.data_ptr<uint8_t>(), d.size(2), moe.down_qtype, d.size(1)};
    down_expert_bytes = d.size(1) * d.size(2);
  }
  std::vector<Part> gate_up_of(int64_t expert) const {
    std::vector<Part> parts = gate_up;
    for (size_t p = 0; p < parts.size(); ++p) {
      parts[p].weights += expert * gate_up_expert_bytes[p];
    }
    return parts;
  }
  Part down_of(int64_t expert) const {
    Part part = down;
    part.weights += expert * down_expert_bytes;
    return part;
  }
};

// Thread t's share of k experts' `width` columns each (columns j * width + c): each expert's
// run of them through `run(j, lo, hi)`, lo and hi within the expert.
template <typename Run>
void expert_columns(int64_t k, int64_t width, int64_t t, int64_t team, const Run& run) {
  const auto [b, end] = share(k * width, t, team, 4);
  for (int64_t c = b; c < end;) {
    const int64_t j = c / width, lo = c % width, hi = std::min(width, lo + end - c);
    run(j, lo, hi);
    c += hi - lo;
  }
}

// One layer's raw pointers for the region.
struct LayerPointers {
  std::vector<Part> parts[4];
  ChainInput inputs[4];  // of qkv (the normed hidden), o (attention), gate_up, down
  const float *norm_in, *norm_post, *cos;
  const float *q_norm = nullptr, *k_norm = nullptr;  // per-head q/k RMSNorm weights
  void *k_row, *v_row;  // the new token's KV rows
  const void *k_cache, *v_cache;
  float eps, scale, qk_eps = 0.0f;
  float k_scale = 1.0f, v_scale = 1.0f;  // an 8-bit KV cache's
  int64_t inter = 0;  // the dense MLP's intermediate size (0 for a MoE layer)
  std::shared_ptr<const ExpertStacks> experts;  // a MoE layer's
};

}  // namespace

bool single_row_chain_applies(const std::vector<LlamaLayerChain::Layer>& layers,
                              const at::Tensor& hidden, const std::vector<at::Tensor>& k_caches,
                              const std::vector<at::Tensor>& v_caches,
                              const std::vector<at::Tensor>& meta) {
  if (hidden.dim() != 2 || hidden.size(0) != 1 || !is_float_vector(hidden, hidden.size(1))) {
    return false;
  }
  // One request with one new token, its row first.
  if (meta.size() != 4 || meta[0].numel() != 1 || first_value(meta[2]) != 1 ||
      first_value(meta[3]) != 0) {
    return false;
  }
  const int64_t e = hidden.size(1);
  const LlamaLayerChain::Layer& first = layers.front();
  const int64_t q_size = first.heads * first.head_dim, kv_size = first.kv_heads * first.head_dim;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LlamaLayerChain::Layer& l = layers[i];
    if (l.q_norm.defined() && (!is_float_vector(l.q_norm, l.head_dim) ||
                               !is_float_vector(l.k_norm, l.head_dim))) {
      return false;
    }
    if (l.moe && !moe_applies(*l.moe, e)) return false;
    if (l.heads != first.heads || l.kv_heads != first.kv_heads || l.head_dim != first.head_dim ||
        l.heads % l.kv_heads != 0) {
      return false;
    }
    // Each projection: GGUF block parts without bias, N rows in all, K wide.
    int64_t rows[4];
    bool down_int8 = false;
    for (int p = 0; p < 4; ++p) {
      rows[p] = 0;
      if (l.biases[p].numel() != 0) return false;
      for (int64_t i = l.first_part(p); i < l.first_part(p) + l.part_counts[p]; ++i) {
        const at::Tensor& w = l.weights[i];
        if (!is_block_type(l.qtypes[i]) || w.scalar_type() != at::kByte || !w.is_contiguous() ||
            w.dim() != 2) {
          return false;
        }
        rows[p] += w.size(0);
        if (p == kDown) down_int8 = down_int8 || on_q8k(l.qtypes[i]);
      }
    }
    const int64_t inter = rows[kGateUp] / 2;
    const int64_t widths[4] = {e, q_size, e, inter};
    for (int p = 0; p < 4; ++p) {
      for (int64_t i = l.first_part(p); i < l.first_part(p) + l.part_counts[p]; ++i) {
        if (block_k(l.weights[i], l.qtypes[i]) != widths[p]) return false;
      }
    }
    if (rows[kQKV] != q_size + 2 * kv_size || rows[kO] != e) return false;
    if (!l.moe && (rows[kGateUp] != 2 * inter || rows[kDown] != e || inter == 0 ||
                   inter % (down_int8 ? 256 : gguf::kBlock) != 0)) {
      return false;
    }
    if (!is_float_vector(l.norms[0], e) || !is_float_vector(l.norms[1], e) ||
        l.cos_sin.scalar_type() != at::kFloat || !l.cos_sin.is_contiguous()) {
      return false;
    }
    const at::Tensor& kc = k_caches[i];
    const at::Tensor& vc = v_caches[i];
    const at::ScalarType ct = kc.scalar_type();
    const bool cache_type = ct == at::kFloat || ct == at::kBFloat16 ||
                            ct == at::kFloat8_e4m3fn || ct == at::kFloat8_e5m2;
    if (!cache_type || vc.scalar_type() != kc.scalar_type() || !kc.is_contiguous() ||
        !vc.is_contiguous() || kc.dim() != 3 || kc.size(1) != l.kv_heads ||
        kc.size(2) != l.head_dim || vc.sizes() != kc.sizes()) {
      return false;
    }
  }
  return true;
}

std::vector<at::Tensor> run_single_row_chain(const std::vector<LlamaLayerChain::Layer>& layers,
                                             const at::Tensor& hidden,
                                             const at::Tensor& positions,
                                             const std::vector<at::Tensor>& k_caches,
                                             const std::vector<at::Tensor>& v_caches,
                                             const at::Tensor& slots,
                                             const at::Tensor& req_to_token,
                                             const std::vector<at::Tensor>& meta) {
  const LlamaLayerChain::Layer& first = layers.front();
  const int64_t e = hidden.size(1), heads = first.heads, kv_heads = first.kv_heads;
  const int64_t head_dim = first.head_dim, rot_dim = first.rot_dim;
  const int64_t q_size = heads * head_dim, kv_size = kv_heads * head_dim;
  const int64_t n_layers = static_cast<int64_t>(layers.size());
  // Everything that can fail is checked here, before the region (nothing may throw inside it).
  const int64_t pos = first_value(positions), slot = first_value(slots);
  const int64_t prefix = first_value(meta[1]), pool_row = first_value(meta[0]);
  TORCH_CHECK(req_to_token.scalar_type() == at::kLong && req_to_token.is_contiguous(),
              "req_to_token must be a contiguous int64 table");
  TORCH_CHECK(pool_row >= 0 && pool_row < req_to_token.size(0), "req_pool_index out of range");
  TORCH_CHECK(prefix >= 0 && prefix + 1 <= req_to_token.size(1), "lengths out of range");
  TORCH_CHECK(slot >= 0 && slot < k_caches[0].size(0), "KV slot out of range");
  const int64_t* token_row = req_to_token.data_ptr<int64_t>() + pool_row * req_to_token.size(1);
  const at::ScalarType cache_type = k_caches[0].scalar_type();
  const KvElem cache = cache_type == at::kBFloat16       ? KvElem::kBFloat16
                       : cache_type == at::kFloat8_e4m3fn ? KvElem::kFp8E4M3
                       : cache_type == at::kFloat8_e5m2   ? KvElem::kFp8E5M2
                                                          : KvElem::kFloat;
  const int64_t elem = k_caches[0].element_size();
  std::vector<LayerPointers> ptrs(n_layers);
  int64_t max_inter = 0, max_top_k = 0, max_moe_inter = 0;
  for (int64_t i = 0; i < n_layers; ++i) {
    const LlamaLayerChain::Layer& l = layers[i];
    TORCH_CHECK(pos >= 0 && pos < l.cos_sin.size(0), "position out of the RoPE table");
    TORCH_CHECK(k_caches[i].scalar_type() == k_caches[0].scalar_type() &&
                    k_caches[i].size(0) > slot,
                "KV caches differ between layers");
    LayerPointers& p = ptrs[i];
    for (int w = 0; w < 4; ++w) {
      for (int64_t j = l.first_part(w); j < l.first_part(w) + l.part_counts[w]; ++j) {
        p.parts[w].push_back({l.weights[j].data_ptr<uint8_t>(), l.weights[j].size(1), l.qtypes[j],
                              l.weights[j].size(0)});
      }
    }
    if (l.moe) {
      p.experts = std::make_shared<const ExpertStacks>(*l.moe);
      p.inputs[kGateUp].size_for(p.experts->gate_up, e);  // each expert's gate|up input
      max_top_k = std::max(max_top_k, l.moe->top_k);
      max_moe_inter = std::max(max_moe_inter, p.experts->inter);
    } else {
      for (const Part& part : p.parts[kGateUp]) p.inter += part.rows;
      p.inter /= 2;
      max_inter = std::max(max_inter, p.inter);
      p.inputs[kGateUp].size_for(p.parts[kGateUp], e);
      p.inputs[kDown].size_for(p.parts[kDown], p.inter);
    }
    p.inputs[kQKV].size_for(p.parts[kQKV], e);
    p.inputs[kO].size_for(p.parts[kO], q_size);
    p.norm_in = l.norms[0].data_ptr<float>();
    p.norm_post = l.norms[1].data_ptr<float>();
    if (l.q_norm.defined()) {
      p.q_norm = l.q_norm.data_ptr<float>();
      p.k_norm = l.k_norm.data_ptr<float>();
      p.qk_eps = static_cast<float>(l.qk_eps);
    }
    p.cos = l.cos_sin.data_ptr<float>() + pos * rot_dim;
    p.k_cache = k_caches[i].data_ptr();
    p.v_cache = v_caches[i].data_ptr();
    p.k_row = static_cast<char*>(k_caches[i].data_ptr()) + slot * kv_size * elem;
    p.v_row = static_cast<char*>(v_caches[i].data_ptr()) + slot * kv_size * elem;
    p.eps = static_cast<float>(l.eps);
    p.scale = static_cast<float>(l.scale);
    p.k_scale = static_cast<float>(l.k_scale);
    p.v_scale = static_cast<float>(l.v_scale);
  }
  // The residual starts as the embeddings (llama_layer's first layer: residual = hidden).
  at::Tensor residual = hidden.clone();
  at::Tensor out = at::empty({1, e}, hidden.options());  // each layer's MLP output
  // The post-attention normed hidden: a tensor, as a MoE router reads it between regions
  // through the same call as run_layer (and so with the same alignment).
  at::Tensor mid_row = at::empty({1, e}, hidden.options());
  float* res = residual.data_ptr<float>();
  float* h = out.data_ptr<float>();
  float* mid = mid_row.data_ptr<float>();
  std::vector<float> normed(e), qkv(q_size + 2 * kv_size), attn(q_size);
  std::vector<float> gate_up(std::max(2 * max_inter, max_top_k * 2 * max_moe_inter));
  std::vector<float> act(std::max(max_inter, max_top_k * max_moe_inter));
  std::vector<float> expert_out(max_top_k * e);
  std::vector<ChainInput> expert_in(max_top_k);  // each chosen expert's down input
  // Each chosen expert's gate|up parts and down part, set between regions with its routing
  // (nothing may allocate, so throw, inside a region).
  std::vector<std::vector<Part>> expert_gate_up(max_top_k), expert_down(max_top_k);
  // llama_layer's attention items for one token: one per KV head (all heads in one when there
  // is a single KV head).
  const int64_t items = kv_heads > 1 ? kv_heads : 1;
  std::unique_ptr<std::atomic<int64_t>[]> next_item(new std::atomic<int64_t>[n_layers]);
  for (int64_t i = 0; i < n_layers; ++i) next_item[i].store(0);
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());

  // A MoE layer's router is an ATen call (as in run_layer, for the same bits), which cannot run
  // inside the region: the region stops after that layer's post-attention norm, the router
  // runs, and the next region starts with the layer's experts. `start`: the first layer whose
  // attention the next region runs; `routed`: the MoE layer whose experts it runs first.
  int64_t start = 0, routed = -1;
  TokenRoute route;
  for (;;) {
    int64_t stop = n_layers;  // the MoE layer this region stopped at, for its router
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
      if (routed >= 0) {  // the routed layer's experts: moe_rows_gguf's arithmetic for one row
        const ExpertStacks& ex = *ptrs[routed].experts;
        const ChainInput& x_in = ptrs[routed].inputs[kGateUp];
        const int64_t k = static_cast<int64_t>(route.experts.size()), inter = ex.inter;
        expert_columns(k, 2 * inter, t, team, [&](int64_t j, int64_t lo, int64_t hi) {
          gemv_parts(expert_gate_up[j], x_in, e, gate_up.data() + j * 2 * inter, lo, hi);
        });
#pragma omp barrier
        for (int64_t j = t; j < k; j += team) {
          float* a = act.data() + j * inter;
          const float* g = gate_up.data() + j * 2 * inter;
          silu_mul_span_f32(g, g + inter, a, inter);
          expert_in[j].quantize(a, inter, 0, inter);
        }
#pragma omp barrier
        expert_columns(k, e, t, team, [&](int64_t j, int64_t lo, int64_t hi) {
          gemv_parts(expert_down[j], expert_in[j], inter, expert_out.data() + j * e, lo, hi);
        });
#pragma omp barrier
        if (t == 0) {
          std::fill(h, h + e, 0.0f);
          for (int64_t j = 0; j < k; ++j) {
            add_weighted_f32(h, expert_out.data() + j * e, static_cast<float>(route.weights[j]),
                             e);
          }
        }
      }
      for (int64_t i = start; i < n_layers; ++i) {
        const LayerPointers& p = ptrs[i];
        if (t == 0) {  // input norm (with the residual add after the first layer), quantized
          float* x = normed.data();
          if (i == 0) {
            rms_norm_row_f32(res, p.norm_in, x, e, p.eps);
          } else {
            add_rms_norm_row_f32(h, res, p.norm_in, e, p.eps);
            x = h;
          }
          ptrs[i].inputs[kQKV].quantize(x, e, 0, e);
        }
#pragma omp barrier
        {
          const auto [b, end] = share(q_size + 2 * kv_size, t, team, 4);
          gemv_parts(p.parts[kQKV], p.inputs[kQKV], e, qkv.data(), b, end);
        }
#pragma omp barrier
        if (t == 0) {
          float* q = qkv.data();
          if (p.q_norm != nullptr) {  // each head normalized in place (rms_norm's rows)
            for (int64_t hd = 0; hd < heads; ++hd) {
              float* row = q + hd * head_dim;
              rms_norm_row_f32(row, p.q_norm, row, head_dim, p.qk_eps);
            }
            for (int64_t hd = 0; hd < kv_heads; ++hd) {
              float* row = q + q_size + hd * head_dim;
              rms_norm_row_f32(row, p.k_norm, row, head_dim, p.qk_eps);
            }
          }
          rope_store_token_f32(q, q + q_size, q + q_size + kv_size, p.cos, heads, kv_heads,
                               head_dim, rot_dim, layers[i].neox, p.k_row, p.v_row, cache,
                               p.k_scale, p.v_scale);
        }
#pragma omp barrier
        for (int64_t it = next_item[i].fetch_add(1); it < items; it = next_item[i].fetch_add(1)) {
          const int64_t h0 = kv_heads > 1 ? it : 0, h1 = kv_heads > 1 ? it + 1 : kv_heads;
          decode_attention_heads(qkv.data(), p.k_cache, p.v_cache, cache, p.k_scale,
                                 p.v_scale, kv_heads, head_dim, token_row, prefix, heads, h0,
                                 h1, p.scale, attn.data());
        }
#pragma omp barrier
        if (t == 0) ptrs[i].inputs[kO].quantize(attn.data(), q_size, 0, q_size);
#pragma omp barrier
        {
          const auto [b, end] = share(e, t, team, 4);
          gemv_parts(p.parts[kO], p.inputs[kO], q_size, mid, b, end);
        }
#pragma omp barrier
        if (t == 0) {  // post-attention norm with the residual add, quantized
          add_rms_norm_row_f32(mid, res, p.norm_post, e, p.eps);
          ptrs[i].inputs[kGateUp].quantize(mid, e, 0, e);
        }
        if (p.experts) {  // every thread stops here; the region's end is the barrier
          if (t == 0) stop = i;
          break;
        }
#pragma omp barrier
        {
          // Gate and up columns [j0, j1) on the same thread, so it can apply SiLU and quantize
          // those blocks of the activation itself (j0, j1 multiples of the down input's block).
          const int64_t inter = p.inter;
          ChainInput& down_in = ptrs[i].inputs[kDown];
          const auto [j0, j1] = share(inter, t, team, down_in.align());
          gemv_parts(p.parts[kGateUp], p.inputs[kGateUp], e, gate_up.data(), j0, j1);
          gemv_parts(p.parts[kGateUp], p.inputs[kGateUp], e, gate_up.data(), inter + j0,
                     inter + j1);
          silu_mul_span_f32(gate_up.data() + j0, gate_up.data() + inter + j0, act.data() + j0,
                            j1 - j0);
          down_in.quantize(act.data(), inter, j0, j1);
        }
#pragma omp barrier
        {
          const auto [b, end] = share(e, t, team, 4);
          gemv_parts(p.parts[kDown], p.inputs[kDown], p.inter, h, b, end);
        }
#pragma omp barrier
      }
    }
    if (stop == n_layers) break;
    route = route_token(*layers[stop].moe, mid_row);
    const ExpertStacks& ex = *ptrs[stop].experts;
    for (size_t j = 0; j < route.experts.size(); ++j) {
      TORCH_CHECK(route.experts[j] >= 0 && route.experts[j] < layers[stop].moe->down.size(0),
                  "expert id out of range");
      expert_gate_up[j] = ex.gate_up_of(route.experts[j]);
      expert_down[j] = {ex.down_of(route.experts[j])};
      expert_in[j] = ChainInput{};
      expert_in[j].size_for(expert_down[j], ex.inter);
    }
    routed = stop;
    start = stop + 1;
  }
  return {out, residual};
}

}  // namespace radixserve
