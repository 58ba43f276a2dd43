// Tokens through their chosen experts on GGUF blocks (MoE decode steps and verify rows): every
// chosen expert runs once over the rows routed to it, all experts' gate|up columns split over
// the threads in one parallel region, then all their down columns in another, instead of a few
// kernel calls and regions per chosen expert. Rows are quantized and multiplied as gguf_linear
// does for a few rows (the same column kernels), silu(gate) * up is silu_and_mul's, and each
// token's experts are added in ascending id, y * weight rounded before the add, as FusedMoE's
// grouped loop does (layers/moe/fused_moe.py). A row's result does not depend on the other rows.
#include <vector>

#include "common.h"
#include "gguf_gemv.h"
#include "gguf_kquant.h"
#include "gguf_q8k.h"
#include "kernels.h"
#include "single_row.h"

namespace radixserve {
namespace {

struct Projection {
  const uint8_t* base;  // expert 0's blocks
  int64_t expert_bytes, row_bytes, rows, qtype;
};

Projection projection(const at::Tensor& blocks, int64_t qtype, int64_t k, const char* name) {
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 3 && blocks.is_contiguous(),
              name, " must be contiguous uint8 [experts, rows, bytes]");
  TORCH_CHECK(gguf::linear_type(qtype), name, ": GGML type ", qtype,
              " has no kernel in this build");
  TORCH_CHECK(blocks.size(2) == gguf::linear_row_bytes(qtype, k), name, " rows do not hold K = ",
              k, " weights");
  return {blocks.data_ptr<uint8_t>(), blocks.size(1) * blocks.size(2), blocks.size(2),
          blocks.size(1), qtype};
}

bool uses_int8(int64_t qtype) { return kquant_int8() && q8k_type(qtype); }

// A few activation rows (gathered, one per (token, expert) assignment) in the formats the
// projection's parts take: Q8_K rows for the K-quant parts (multi-row kernels), int16 blocks
// per row for the others (a single-row kernel).
struct GatheredRows {
  Q8KRows q8;
  std::vector<QuantizedRows> q16;

  void quantize(const float* x, int64_t rows, int64_t k, bool need8, bool need16) {
    if (need8) quantize_q8k(x, rows, k, k, q8);
    if (need16) {
      q16.resize(rows);
      for (int64_t r = 0; r < rows; ++r) {
        size_quantized_row(k, q16[r]);
        quantize_row_blocks(x + r * k, k, 0, k / 32, q16[r]);
      }
    }
  }
};

// Columns [lo, hi) of activation rows [r0, r0 + rows) times one expert's blocks W [N, K]:
// out[r * stride + col].
void rows_columns(const uint8_t* blocks, int64_t row_bytes, int64_t qtype, const GatheredRows& x,
                  int64_t k, int64_t r0, int64_t rows, float* out, int64_t stride, int64_t lo,
                  int64_t hi) {
  if (uses_int8(qtype)) {
    q8k_dot_columns(blocks, row_bytes, qtype, x.q8, k, r0, rows, out, stride, lo, hi);
    return;
  }
  for (int64_t r = r0; r < r0 + rows; ++r) {
    gguf_gemv_columns(blocks, row_bytes, qtype, x.q16[r], k, out + r * stride, lo, hi);
  }
}

constexpr int64_t kColumnChunk = 32;  // output columns per work item (a multiple of 4)

}  // namespace

// x [T, H] float32, experts / weights [T, k] (int64 ids, float32 weights); gate_up parts
// [E, rows_p, bytes] (gate rows first), down [E, H, bytes]. Every chosen expert runs once over
// the rows routed to it (ascending expert id, each expert's rows in token order), all experts'
// gate|up columns in one parallel region and all their down columns in another, and each
// token's outputs are added in ascending expert id, y * weight rounded before the add: the
// sums FusedMoE's grouped path makes, without a dozen calls and two parallel regions per
// chosen expert.
at::Tensor moe_rows_gguf(const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weights,
                         const std::vector<at::Tensor>& gate_up,
                         const std::vector<int64_t>& gate_up_qtypes, const at::Tensor& down,
                         int64_t down_qtype) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be contiguous float32 [tokens, hidden]");
  TORCH_CHECK(experts.dim() == 2 && experts.size(0) == x.size(0) &&
                  experts.scalar_type() == at::kLong,
              "experts must be int64 [tokens, k]");
  TORCH_CHECK(weights.sizes() == experts.sizes() && weights.scalar_type() == at::kFloat,
              "weights must be float32 [tokens, k]");
  TORCH_CHECK(gate_up.size() == gate_up_qtypes.size() && !gate_up.empty(), "gate|up parts");
  const int64_t tokens = x.size(0), hidden = x.size(1), top_k = experts.size(1);
  std::vector<Projection> parts;
  int64_t inter2 = 0;
  for (size_t p = 0; p < gate_up.size(); ++p) {
    parts.push_back(projection(gate_up[p], gate_up_qtypes[p], hidden, "gate_up"));
    inter2 += parts.back().rows;
  }
  TORCH_CHECK(inter2 % 2 == 0, "gate|up must have an even number of rows");
  const int64_t inter = inter2 / 2;
  const Projection dn = projection(down, down_qtype, inter, "down");
  TORCH_CHECK(dn.rows == hidden, "down must have H rows");
  const int64_t num_experts = down.size(0);
  for (const at::Tensor& t : gate_up) TORCH_CHECK(t.size(0) == num_experts, "expert counts");

  // Assignments (token, slot) ordered by expert, stably: FusedMoE._grouped's order.
  const at::Tensor ids = experts.contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t assignments = tokens * top_k;
  std::vector<int64_t> count(num_experts, 0);
  for (int64_t a = 0; a < assignments; ++a) {
    TORCH_CHECK(id[a] >= 0 && id[a] < num_experts, "expert id out of range");
    ++count[id[a]];
  }
  std::vector<int64_t> first(num_experts + 1, 0);
  for (int64_t e = 0; e < num_experts; ++e) first[e + 1] = first[e] + count[e];
  std::vector<int64_t> order(assignments), fill(first.begin(), first.end() - 1);
  for (int64_t a = 0; a < assignments; ++a) order[fill[id[a]]++] = a;
  std::vector<int64_t> used;  // experts with rows, ascending
  for (int64_t e = 0; e < num_experts; ++e) {
    if (count[e] > 0) used.push_back(e);
  }

  // Each assignment's row of x, gathered in that order and quantized once per format.
  std::vector<float> xs(assignments * hidden);
  const float* xp = x.data_ptr<float>();
  for (int64_t a = 0; a < assignments; ++a) {
    std::copy_n(xp + (order[a] / top_k) * hidden, hidden, xs.data() + a * hidden);
  }
  bool need8 = false, need16 = false;
  for (const Projection& p : parts) (uses_int8(p.qtype) ? need8 : need16) = true;
  GatheredRows xq;
  xq.quantize(xs.data(), assignments, hidden, need8, need16);

  // gate|up: work items are (used expert, chunk of its 2I columns).
  const int64_t up_chunks = (inter2 + kColumnChunk - 1) / kColumnChunk;
  std::vector<float> gu(assignments * inter2);
  const int64_t n_used = static_cast<int64_t>(used.size());
  parallel_grab(n_used * up_chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t e = used[item / up_chunks];
      const int64_t c0 = item % up_chunks * kColumnChunk;
      const int64_t c1 = std::min(inter2, c0 + kColumnChunk);
      int64_t offset = 0;
      for (const Projection& p : parts) {
        const int64_t lo = std::max(c0, offset) - offset;
        const int64_t hi = std::min(c1, offset + p.rows) - offset;
        if (lo < hi) {
          rows_columns(p.base + e * p.expert_bytes, p.row_bytes, p.qtype, xq, hidden, first[e],
                       count[e], gu.data() + offset, inter2, lo, hi);
        }
        offset += p.rows;
      }
    }
  });

  // silu(gate) * up per assignment, quantized for down.
  std::vector<float> act(assignments * inter);
  for (int64_t a = 0; a < assignments; ++a) {
    silu_mul_span_f32(gu.data() + a * inter2, gu.data() + a * inter2 + inter,
                      act.data() + a * inter, inter);
  }
  GatheredRows aq;
  aq.quantize(act.data(), assignments, inter, uses_int8(down_qtype), !uses_int8(down_qtype));

  const int64_t down_chunks = (hidden + kColumnChunk - 1) / kColumnChunk;
  std::vector<float> ys(assignments * hidden);
  parallel_grab(n_used * down_chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t e = used[item / down_chunks];
      const int64_t c0 = item % down_chunks * kColumnChunk;
      const int64_t c1 = std::min(hidden, c0 + kColumnChunk);
      rows_columns(dn.base + e * dn.expert_bytes, dn.row_bytes, dn.qtype, aq, inter, first[e],
                   count[e], ys.data(), hidden, c0, c1);
    }
  });

  // Each token's experts added in ascending id (the grouped path's index_add_ order).
  auto out = at::zeros({tokens, hidden}, x.options());
  float* op = out.data_ptr<float>();
  const at::Tensor ws = weights.contiguous();
  const float* wp = ws.data_ptr<float>();
  for (int64_t a = 0; a < assignments; ++a) {
    add_weighted_f32(op + (order[a] / top_k) * hidden, ys.data() + a * hidden, wp[order[a]],
                     hidden);
  }
  return out;
}

// out += y * weight, the product rounded first (no fused multiply-add: the Python loop's
// `out += y * weight` rounds twice).
__attribute__((optimize("fp-contract=off"))) void add_weighted_f32(float* out, const float* y,
                                                                     float weight, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const volatile float product = y[i] * weight;
    out[i] += product;
  }
}

}  // namespace radixserve
