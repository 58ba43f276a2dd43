// Python bindings of radixserve's CPU kernels (see radixserve/kernels/ops.py for the
// pure-PyTorch equivalents that run where this extension is not built).
#include <torch/extension.h>

#include "common.h"

namespace radixserve {
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& x);
void rope_store_kv(at::Tensor& q, at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                   const at::Tensor& cos_sin, at::Tensor& k_cache, at::Tensor& v_cache,
                   const at::Tensor& slots, int64_t head_dim, int64_t rot_dim, bool neox);
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& req_to_token,
                           const at::Tensor& req_pool_indices, const at::Tensor& prefix_lens,
                           const at::Tensor& extend_lens, const at::Tensor& q_starts,
                           int64_t heads, double scale);
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t qtype,
                       int64_t out_features);
}  // namespace radixserve

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &radixserve::rms_norm);
  m.def("fused_add_rms_norm", &radixserve::fused_add_rms_norm);
  m.def("silu_and_mul", &radixserve::silu_and_mul);
  m.def("rope_store_kv", &radixserve::rope_store_kv);
  m.def("paged_attention", &radixserve::paged_attention);
  m.def("gguf_linear", &radixserve::gguf_linear);
}
