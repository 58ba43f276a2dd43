// Python bindings of radixserve's CPU kernels (see radixserve/kernels/ops.py for the
// pure-PyTorch equivalents that run where this extension is not built).
#include <torch/extension.h>

#include "common.h"

#include "gguf_kquant.h"
#include "gguf_q8k.h"
#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &radixserve::rms_norm);
  m.def("fused_add_rms_norm", &radixserve::fused_add_rms_norm);
  m.def("silu_and_mul", &radixserve::silu_and_mul);
  m.def("argmax_rows", &radixserve::argmax_rows);
  m.def("rope_store_kv", &radixserve::rope_store_kv);
  m.def("paged_attention", &radixserve::paged_attention);
  m.def("paged_attention_sinks", &radixserve::paged_attention_sinks);
  m.def("gguf_linear", &radixserve::gguf_linear);
  m.def("llama_layer", &radixserve::llama_layer);
  m.def("bind_threads", &radixserve::bind_threads);
  m.def("gguf_linear_tiled", &radixserve::gguf_linear_tiled);
  // bfloat16 x on AMX-BF16 tiles, taken by gguf_linear where the tiled path runs (enabled and
  // available: the build has it and the OS granted the tile state).
  m.def("gguf_linear_tiled_amx", &radixserve::gguf_linear_tiled_amx);
  m.def("gguf_linear_argmax", &radixserve::gguf_linear_argmax);
  m.def("gguf_tiled_amx_compiled", &radixserve::gguf_tiled_amx_compiled);
  m.def("gguf_tiled_amx_available", &radixserve::gguf_tiled_amx_available);
  m.def("set_gguf_tiled_amx_enabled", &radixserve::set_gguf_tiled_amx_enabled);
  m.def("gguf_tiled_amx_enabled", &radixserve::gguf_tiled_amx_enabled);
  // Whether gguf_linear runs GGML type qtype in this build (Q4_1 and Q8_0 always).
  m.def("gguf_kernel_type", [](int64_t qtype) {
    return qtype == 3 || qtype == 8 || radixserve::gguf::kquant_type(qtype);
  });
  // K-quants (Q3_K..Q6_K) on int8 Q8_K activations instead of int16 blocks: a process-wide
  // choice (layers/fast_path.py measures both at startup).
  m.def("set_kquant_int8", &radixserve::set_kquant_int8);
  m.def("kquant_int8", &radixserve::kquant_int8);
  // Their kernel variants (gguf_q8k.h), and the row count from which gguf_linear takes their
  // matmul for many rows (gguf_q8k_panel.cpp).
  m.def("q8k_isas", &radixserve::q8k_isas);
  m.def("set_q8k_isa", &radixserve::set_q8k_isa);
  m.def("q8k_isa", &radixserve::q8k_isa);
  m.def("set_q8k_panel_min_rows", &radixserve::set_q8k_panel_min_rows);
  m.def("set_q8k_amx_min_rows", &radixserve::set_q8k_amx_min_rows);
  m.def("q8k_amx_min_rows", &radixserve::q8k_amx_min_rows);
  m.def("q8k_panel_min_rows", &radixserve::q8k_panel_min_rows);
  m.def("float_linear_packed", &radixserve::float_linear_packed);
  m.def("float_linear", &radixserve::float_linear);
  m.def("set_float_packed_min_rows", &radixserve::set_float_packed_min_rows);
  m.def("moe_rows_gguf", &radixserve::moe_rows_gguf);
  m.attr("moe_rows_max_tokens") = radixserve::kMoERowsMaxTokens;
  m.def("set_attention_query_rows", &radixserve::set_attention_query_rows);
  m.def("attention_query_rows", &radixserve::attention_query_rows);
  m.def("set_gguf_tiled_enabled", &radixserve::set_gguf_tiled_enabled);
  m.def("gguf_tiled_enabled", &radixserve::gguf_tiled_enabled);
  m.def("float_packed_min_rows", &radixserve::float_packed_min_rows);
  m.def("float_packed_available", &radixserve::float_packed_available);
  m.def("half_weight_linear", &radixserve::half_weight_linear);
  m.def("half_weight_linear_available", &radixserve::half_weight_linear_available);
  // module_local: two builds loaded in one process (an A/B benchmark) keep their own type.
  py::class_<radixserve::LlamaLayerChain>(m, "LlamaLayerChain", py::module_local())
      .def(py::init<const std::vector<at::Tensor>&, const std::vector<double>&,
                    const std::vector<at::Tensor>&, const std::vector<int64_t>&,
                    const std::vector<int64_t>&, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                    const std::vector<int64_t>&, const std::vector<bool>&,
                    const std::vector<int64_t>&, const std::vector<int64_t>&,
                    const std::vector<int64_t>&, const std::vector<double>&>())
      .def("run", &radixserve::LlamaLayerChain::run)
      .def("set_qk_norm", &radixserve::LlamaLayerChain::set_qk_norm)
      .def("set_kv_scales", &radixserve::LlamaLayerChain::set_kv_scales)
      .def("set_moe", &radixserve::LlamaLayerChain::set_moe)
      .def("__len__", &radixserve::LlamaLayerChain::size)
      .def("single_row_runs", &radixserve::LlamaLayerChain::single_row_runs);
}
