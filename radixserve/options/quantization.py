"""Options: quantization and data types."""

from __future__ import annotations

from radixserve.options.choices import KV_CACHE_DTYPE_CHOICES, QUANTIZATION_CHOICES
from radixserve.options.spec import IMPLEMENTED, NOT_APPLICABLE, OptionSpec, flag, value
from radixserve.options.value_types import STR

AREA = "Quantization and data type"

OPTIONS: tuple[OptionSpec, ...] = (
    value(
        "--dtype",
        STR,
        "auto",
        "Weight and activation dtype. 'auto' picks bfloat16 where the hardware supports it fast (on a CPU: AVX512-BF16 or AMX-BF16 and a startup probe, cached per CPU, that measures bfloat16 matmuls faster than float32), else float16 on CUDA or float32 on CPU; a GGUF run on its blocks that are mostly K-quants gets float32 activations (with a bfloat16 KV cache where the CPU's choice is bfloat16), since its kernels quantize activations to int8 themselves; 'half' is float16, 'float' is float32.",
        support=IMPLEMENTED,
        choices=("auto", "half", "float16", "bfloat16", "float", "float32"),
    ),
    value(
        "--quantization",
        STR,
        None,
        "Quantization method of the weights. gguf keeps a GGUF file's Q4_1/Q8_0 blocks and runs the linear layers on them (integer dot products with int16-quantized activations for small batches, float tiles over dequantized blocks for prefill); it is the default for a .gguf --model-path on the CPU with --pp-size 1, each TP rank keeping its slice of the blocks (as SGLang sets it for GGUF files). unquant dequantises a GGUF to --dtype instead, which is exact (HF transformers' arithmetic in float32). w8a8_int8 quantizes a float checkpoint's decoder projections to int8 (Q8_0 blocks: one scale per 32 weights) layer by layer as they load, each float weight freed as soon as its last shard is in, so the model is never held in float; the same kernels run them (CPU, --tp-size 1). bitsandbytes is SGLang's name for quantizing a float checkpoint to 4 bits in flight, and does that here, layer by layer as w8a8_int8: into Q4_K blocks (4.5 bits a weight: min-max per 32 weights with 6-bit scales and mins per 256) where the input size is a multiple of 256, else Q4_1 (5 bits: an fp16 step and minimum per 32), which the integer kernels run natively. It is not bitsandbytes' NF4 (a 16-value normal-float codebook with one absmax per 64 weights, bfloat16 matmuls on dequantized weights): the codes, block sizes and error differ (~6% relative weight error per matmul), no bitsandbytes package is used, and pre-quantized bitsandbytes checkpoints are not read. Both keep the LM head and embeddings in float, as SGLang does.",
        support=IMPLEMENTED,
        choices=QUANTIZATION_CHOICES,
        supported_choices=("gguf", "w8a8_int8", "bitsandbytes", "unquant"),
    ),
    value(
        "--quantization-param-path",
        STR,
        None,
        'JSON file with KV cache scaling factors (for FP8 KV cache): SGLang\'s and vLLM\'s format, {"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"<tp rank>": {"<layer>": scale}}}}, one scale per layer for K and V. Without it an FP8 KV cache takes the checkpoint\'s k_scale/v_scale tensors where it has them, else 1.0 (with a warning).',
        support=IMPLEMENTED,
    ),
    value(
        "--kv-cache-dtype",
        STR,
        "auto",
        "KV cache dtype; 'auto' follows the model dtype. fp8_e4m3 and fp8_e5m2 store one byte per value (float8_e4m3fn / float8_e5m2 codes of K / k_scale and V / v_scale per layer, see --quantization-param-path), a quarter of a float32 cache, which the attention kernels (C++ and PyTorch) widen as they read; refused with multi-head latent attention (DeepSeek-V2) and --enable-torch-compile.",
        support=IMPLEMENTED,
        choices=KV_CACHE_DTYPE_CHOICES,
        supported_choices=("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2"),
    ),
    flag("--enable-fp32-lm-head", "Compute the LM head (logits) in float32."),
    value(
        "--modelopt-quant",
        STR,
        None,
        "ModelOpt quantization config (fp8, int4_awq, w4a8_awq, nvfp4, ...).",
    ),
    value(
        "--modelopt-checkpoint-restore-path",
        STR,
        None,
        "Restore a saved ModelOpt quantized checkpoint from this path.",
    ),
    value(
        "--modelopt-checkpoint-save-path",
        STR,
        None,
        "Save the ModelOpt quantized checkpoint to this path.",
    ),
    value(
        "--modelopt-export-path",
        STR,
        None,
        "Export the ModelOpt quantized model in Hugging Face format to this path.",
    ),
    flag("--quantize-and-serve", "Quantize with ModelOpt and serve right away without exporting."),
    value(
        "--rl-quant-profile",
        STR,
        None,
        "FlashRL quantization profile (for --load-format flash_rl).",
    ),
    flag(
        "--enable-tf32-matmul",
        "Let float32 matmuls use TensorFloat32 (CUDA only).",
        support=NOT_APPLICABLE,
    ),
)
