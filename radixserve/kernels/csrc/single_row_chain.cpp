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
// functions), so the results are bitwise equal to its.
#include <omp.h>

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

// The block types the chain's GEMV runs: its activations are the int16 blocks, so K-quants
// step aside while they run on Q8_K activations (gguf_q8k.cpp).
bool is_block_type(int64_t qtype) {
  return qtype == gguf::kQ4_1 || qtype == gguf::kQ8_0 ||
         (gguf::kquant_type(qtype) && !(kquant_int8() && q8k_type(qtype)));
}

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

// One layer's raw pointers for the region.
struct LayerPointers {
  const uint8_t* weights[4];
  int64_t row_bytes[4], qtypes[4];
  const float *norm_in, *norm_post, *cos;
  void *k_row, *v_row;  // the new token's KV rows
  const void *k_cache, *v_cache;
  float eps, scale;
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
    if (l.heads != first.heads || l.kv_heads != first.kv_heads || l.head_dim != first.head_dim ||
        l.heads % l.kv_heads != 0) {
      return false;
    }
    for (int p = 0; p < 4; ++p) {
      const at::Tensor& w = l.weights[p];
      if (!is_block_type(l.qtypes[p]) || l.biases[p].numel() != 0 ||
          w.scalar_type() != at::kByte || !w.is_contiguous() || w.dim() != 2) {
        return false;
      }
    }
    const int64_t inter = l.weights[kGateUp].size(0) / 2;
    const at::Tensor& w_qkv = l.weights[kQKV];
    const at::Tensor& w_o = l.weights[kO];
    const at::Tensor& w_gu = l.weights[kGateUp];
    const at::Tensor& w_down = l.weights[kDown];
    if (w_qkv.size(0) != q_size + 2 * kv_size || block_k(w_qkv, l.qtypes[kQKV]) != e ||
        w_o.size(0) != e || block_k(w_o, l.qtypes[kO]) != q_size ||
        w_gu.size(0) != 2 * inter || block_k(w_gu, l.qtypes[kGateUp]) != e ||
        w_down.size(0) != e || block_k(w_down, l.qtypes[kDown]) != inter ||
        inter % gguf::kBlock != 0) {
      return false;
    }
    if (!is_float_vector(l.norms[0], e) || !is_float_vector(l.norms[1], e) ||
        l.cos_sin.scalar_type() != at::kFloat || !l.cos_sin.is_contiguous()) {
      return false;
    }
    const at::Tensor& kc = k_caches[i];
    const at::Tensor& vc = v_caches[i];
    const bool cache_type = kc.scalar_type() == at::kFloat || kc.scalar_type() == at::kBFloat16;
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
  const int64_t inter = first.weights[kGateUp].size(0) / 2;
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
  const bool bf16_cache = k_caches[0].scalar_type() == at::kBFloat16;
  const int64_t elem = bf16_cache ? 2 : 4;
  std::vector<LayerPointers> ptrs(n_layers);
  for (int64_t i = 0; i < n_layers; ++i) {
    const LlamaLayerChain::Layer& l = layers[i];
    TORCH_CHECK(pos >= 0 && pos < l.cos_sin.size(0), "position out of the RoPE table");
    TORCH_CHECK(k_caches[i].scalar_type() == k_caches[0].scalar_type() &&
                    k_caches[i].size(0) > slot,
                "KV caches differ between layers");
    LayerPointers& p = ptrs[i];
    for (int w = 0; w < 4; ++w) {
      p.weights[w] = l.weights[w].data_ptr<uint8_t>();
      p.row_bytes[w] = l.weights[w].size(1);
      p.qtypes[w] = l.qtypes[w];
    }
    p.norm_in = l.norms[0].data_ptr<float>();
    p.norm_post = l.norms[1].data_ptr<float>();
    p.cos = l.cos_sin.data_ptr<float>() + pos * rot_dim;
    p.k_cache = k_caches[i].data_ptr();
    p.v_cache = v_caches[i].data_ptr();
    p.k_row = static_cast<char*>(k_caches[i].data_ptr()) + slot * kv_size * elem;
    p.v_row = static_cast<char*>(v_caches[i].data_ptr()) + slot * kv_size * elem;
    p.eps = static_cast<float>(l.eps);
    p.scale = static_cast<float>(l.scale);
  }
  // The residual starts as the embeddings (llama_layer's first layer: residual = hidden).
  at::Tensor residual = hidden.clone();
  at::Tensor out = at::empty({1, e}, hidden.options());  // each layer's MLP output
  float* res = residual.data_ptr<float>();
  float* h = out.data_ptr<float>();
  std::vector<float> normed(e), qkv(q_size + 2 * kv_size), attn(q_size), mid(e);
  std::vector<float> gate_up(2 * inter), act(inter);
  QuantizedRows xq_in, xq_attn, xq_mid, xq_act;
  size_quantized_row(e, xq_in);
  size_quantized_row(q_size, xq_attn);
  size_quantized_row(e, xq_mid);
  size_quantized_row(inter, xq_act);
  // llama_layer's attention items for one token: one per KV head (all heads in one when there
  // is a single KV head).
  const int64_t items = kv_heads > 1 ? kv_heads : 1;
  std::unique_ptr<std::atomic<int64_t>[]> next_item(new std::atomic<int64_t>[n_layers]);
  for (int64_t i = 0; i < n_layers; ++i) next_item[i].store(0);
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
    for (int64_t i = 0; i < n_layers; ++i) {
      const LayerPointers& p = ptrs[i];
      if (t == 0) {  // input norm (with the residual add after the first layer), quantized
        float* x = normed.data();
        if (i == 0) {
          rms_norm_row_f32(res, p.norm_in, x, e, p.eps);
        } else {
          add_rms_norm_row_f32(h, res, p.norm_in, e, p.eps);
          x = h;
        }
        quantize_row_blocks(x, e, 0, e / gguf::kBlock, xq_in);
      }
#pragma omp barrier
      {
        const auto [b, end] = share(q_size + 2 * kv_size, t, team, 4);
        gguf_gemv_columns(p.weights[kQKV], p.row_bytes[kQKV], p.qtypes[kQKV], xq_in, e,
                          qkv.data(), b, end);
      }
#pragma omp barrier
      if (t == 0) {
        float* q = qkv.data();
        rope_store_token_f32(q, q + q_size, q + q_size + kv_size, p.cos, heads, kv_heads,
                             head_dim, rot_dim, layers[i].neox, p.k_row, p.v_row, bf16_cache);
      }
#pragma omp barrier
      for (int64_t it = next_item[i].fetch_add(1); it < items; it = next_item[i].fetch_add(1)) {
        const int64_t h0 = kv_heads > 1 ? it : 0, h1 = kv_heads > 1 ? it + 1 : kv_heads;
        decode_attention_heads(qkv.data(), p.k_cache, p.v_cache, bf16_cache, kv_heads, head_dim,
                               token_row, prefix, heads, h0, h1, p.scale, attn.data());
      }
#pragma omp barrier
      if (t == 0) quantize_row_blocks(attn.data(), q_size, 0, q_size / gguf::kBlock, xq_attn);
#pragma omp barrier
      {
        const auto [b, end] = share(e, t, team, 4);
        gguf_gemv_columns(p.weights[kO], p.row_bytes[kO], p.qtypes[kO], xq_attn, q_size,
                          mid.data(), b, end);
      }
#pragma omp barrier
      if (t == 0) {  // post-attention norm with the residual add, quantized
        add_rms_norm_row_f32(mid.data(), res, p.norm_post, e, p.eps);
        quantize_row_blocks(mid.data(), e, 0, e / gguf::kBlock, xq_mid);
      }
#pragma omp barrier
      {
        // Gate and up columns [j0, j1) on the same thread, so it can apply SiLU and quantize
        // those blocks of the activation itself (j0, j1 multiples of 32).
        const auto [j0, j1] = share(inter, t, team, gguf::kBlock);
        const uint8_t* w = p.weights[kGateUp];
        gguf_gemv_columns(w, p.row_bytes[kGateUp], p.qtypes[kGateUp], xq_mid, e, gate_up.data(),
                          j0, j1);
        gguf_gemv_columns(w, p.row_bytes[kGateUp], p.qtypes[kGateUp], xq_mid, e, gate_up.data(),
                          inter + j0, inter + j1);
        silu_mul_span_f32(gate_up.data() + j0, gate_up.data() + inter + j0, act.data() + j0,
                          j1 - j0);
        quantize_row_blocks(act.data(), inter, j0 / gguf::kBlock, j1 / gguf::kBlock, xq_act);
      }
#pragma omp barrier
      {
        const auto [b, end] = share(e, t, team, 4);
        gguf_gemv_columns(p.weights[kDown], p.row_bytes[kDown], p.qtypes[kDown], xq_act, inter,
                          h, b, end);
      }
#pragma omp barrier
    }
  }
  return {out, residual};
}

}  // namespace radixserve
