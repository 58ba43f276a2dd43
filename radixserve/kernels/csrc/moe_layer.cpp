// A mixture-of-experts MLP inside the one-call decoder layer (fused_layer.cpp's run_layer): the
// router, softmax top-k routing and the chosen experts on their GGUF blocks, with the same ATen
// ops and kernels, in the same order, as layers/moe/FusedMoE runs them from Python with the C++
// kernels on, so the same bits without a dozen Python calls per layer.
#include <algorithm>
#include <utility>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace radixserve {
namespace {

// One expert's gate|up columns for rows x: its part of each stacked projection, joined.
at::Tensor expert_gate_up(const MoEBlock& moe, int64_t expert, const at::Tensor& x) {
  std::vector<at::Tensor> outs;
  for (size_t p = 0; p < moe.gate_up.size(); ++p) {
    const at::Tensor blocks = moe.gate_up[p].select(0, expert);
    outs.push_back(gguf_linear(x, blocks, moe.gate_up_qtypes[p], blocks.size(0)));
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, -1);
}

at::Tensor expert_down(const MoEBlock& moe, int64_t expert, const at::Tensor& x) {
  const at::Tensor blocks = moe.down.select(0, expert);
  return gguf_linear(x, blocks, moe.down_qtype, blocks.size(0));
}

// Every chosen expert once over the rows routed to it (FusedMoE._grouped).
at::Tensor grouped(const MoEBlock& moe, const at::Tensor& x, const at::Tensor& weights,
                   const at::Tensor& experts) {
  const int64_t num_experts = moe.down.size(0);
  const at::Tensor flat = experts.reshape(-1);
  const at::Tensor order = at::argsort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor counts = at::bincount(flat, {}, num_experts).contiguous();
  const int64_t* count = counts.data_ptr<int64_t>();
  const at::Tensor flat_weights = weights.reshape(-1);
  at::Tensor out = at::zeros_like(x);
  int64_t start = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (count[e] == 0) continue;
    const at::Tensor picks = order.narrow(0, start, count[e]);
    start += count[e];
    const at::Tensor tokens = at::floor_divide(picks, moe.top_k);
    const at::Tensor rows = x.index_select(0, tokens);
    const at::Tensor y = expert_down(moe, e, silu_and_mul(expert_gate_up(moe, e, rows)));
    out.index_add_(0, tokens, y * flat_weights.index_select(0, picks).unsqueeze(1));
  }
  return out;
}

// layers/moe/router.py: float32 softmax over all experts, top k, optional renormalization,
// weights back in the activations' dtype. Returns {weights, expert ids}, [T, k] each.
std::pair<at::Tensor, at::Tensor> route_rows(const MoEBlock& moe, const at::Tensor& x) {
  const at::Tensor none = at::empty({0}, x.options());
  const at::Tensor logits = project_weight(x, moe.router, moe.router_qtype, none);
  auto [top, chosen] = at::topk(at::softmax(logits, -1, at::kFloat), moe.top_k, -1);
  if (moe.renormalize) top = top / top.sum(-1, /*keepdim=*/true);
  return {top.to(x.scalar_type()), chosen};
}

TokenRoute sorted_route(const at::Tensor& weights, const at::Tensor& chosen, int64_t top_k) {
  const at::Tensor ids = chosen.contiguous(), ws = weights.contiguous();
  std::vector<std::pair<int64_t, double>> picked;
  for (int64_t j = 0; j < top_k; ++j) {
    picked.emplace_back(ids.data_ptr<int64_t>()[j], ws.data_ptr<float>()[j]);
  }
  std::sort(picked.begin(), picked.end());
  TokenRoute route;
  for (const auto& [e, w] : picked) {
    route.experts.push_back(e);
    route.weights.push_back(w);
  }
  return route;
}

}  // namespace

TokenRoute route_token(const MoEBlock& moe, const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && x.scalar_type() == at::kFloat,
              "route_token takes one float32 row");
  const auto [weights, chosen] = route_rows(moe, x);
  return sorted_route(weights, chosen, moe.top_k);
}

at::Tensor moe_block_forward(const MoEBlock& moe, const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "x must be [tokens, hidden]");
  const auto [weights, chosen] = route_rows(moe, x);
  if (x.size(0) <= kMoERowsMaxTokens && x.scalar_type() == at::kFloat && x.is_contiguous()) {
    return moe_rows_gguf(x, chosen, weights, moe.gate_up, moe.gate_up_qtypes, moe.down,
                         moe.down_qtype);
  }
  return grouped(moe, x, weights, chosen);
}

}  // namespace radixserve
