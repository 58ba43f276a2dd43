"""Loads the model, sizes and owns the KV memory, and runs forward passes.

Knows nothing about requests, queues, the radix tree or sampling: the scheduler hands it a
StepInputs (plain lists) and gets logits back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.distributed import parallel_state as ps
from radixserve.distributed.launch import RankLostError
from radixserve.kernels.describe import describe_kernels, kernel_summary
from radixserve.kernels.kv_codes import is_fp8
from radixserve.layers.attention.registry import FAST_KERNEL_BACKENDS, create_attention_backend
from radixserve.layers.fast_path import use_fast_kernels
from radixserve.layers.moe import expert_stats
from radixserve.layers.moe.eplb import EPLBConfig, EPLBManager
from radixserve.layers.moe.expert_location import initial_placements
from radixserve.layers.moe.expert_moves import moe_layers, move_layer
from radixserve.layers.moe.placement import set_num_redundant_experts
from radixserve.layers.moe.routed_capture import RoutedShape, capture_step, routed_shape
from radixserve.mem_cache.kv_cache import KVCache
from radixserve.model_executor.forward_batch import ForwardBatch, ForwardMode
from radixserve.model_executor.kv_scales import KvScales, load_kv_scales
from radixserve.model_executor.kv_scales import ones as kv_ones
from radixserve.model_executor.memory_plan import plan_kv_pool
from radixserve.model_executor.step_io import ForwardOutput, StepInputs
from radixserve.models.kv_layout import kv_layout
from radixserve.models.vision_feature_cache import VisionFeatureCache, budget_bytes
from radixserve.options.errors import ServerArgsError
from radixserve.options.hardware import device_memory_bytes
from radixserve.sampling.sampler import set_batch_invariant

if TYPE_CHECKING:
    from radixserve.lora.manager import LoRAManager
    from radixserve.model_executor.compiled_decode import CompiledDecode
    from radixserve.model_executor.pipeline import PipelineExecutor
    from radixserve.models.config import ModelConfig
    from radixserve.server_args import ServerArgs

logger = logging.getLogger(__name__)

# Without a --max-running-requests, the batch is bounded by what the device can usefully run.
DEFAULT_MAX_RUNNING_REQUESTS = {"cpu": 256, "cuda": 2048}


@dataclass(frozen=True)
class MemoryPlan:
    max_total_tokens: int
    max_running_requests: int
    bytes_per_token: int


class ModelRunner:
    # Set on tensor-parallel rank 0 (managers/tp_sync.py): sends each step to the other ranks
    # before it runs here.
    step_broadcaster: Callable[[StepInputs, torch.Tensor], None] | None = None
    # Set there too: sends a KV slot copy (copy_kv_slots) to the other ranks.
    kv_copy_broadcaster: Callable[[torch.Tensor, torch.Tensor], None] | None = None
    # --enable-lora: the adapters and the hooks in the model's linear layers.
    lora: LoRAManager | None = None
    # --pp-size > 1: runs each step as this rank's pipeline stage (model_executor/pipeline.py).
    pipeline: PipelineExecutor | None = None
    # --enable-torch-compile: decode steps of up to --torch-compile-max-bs requests.
    compiled_decode: CompiledDecode | None = None
    # EAGLE (set by speculative/eagle_draft.py on the target's runner): return every token's
    # final hidden state (EAGLE-1) or the inputs of these decoder layers (EAGLE3) as features.
    capture_final: bool = False
    capture_layers: tuple[int, ...] = ()
    # --enable-eplb: rebalances the MoE layers' experts between forward passes.
    eplb: EPLBManager | None = None

    def __init__(self, server_args: ServerArgs, draft_head: bool = False) -> None:
        from radixserve.models.loader import load_model

        self.server_args = server_args
        self.device = torch.device(server_args.device)
        # --random-seed: unseeded sampling and dummy weights are reproducible run to run.
        torch.manual_seed(server_args.random_seed)
        # --ep-size: MoE layers read the expert-parallel split as they are built.
        ps.set_ep_size(server_args.ep_size)
        set_num_redundant_experts(0 if draft_head else server_args.ep_num_redundant_experts)
        loaded = load_model(
            server_args.model_path,
            load_format=server_args.load_format,
            dtype=server_args.resolved_dtype,
            device=server_args.device,
            revision=server_args.revision,
            trust_remote_code=server_args.trust_remote_code,
            context_length=server_args.context_length,
            json_model_override_args=server_args.json_model_override_args,
            download_dir=server_args.download_dir,
            seed=server_args.random_seed,
            check_config=lambda cfg: self._check_config(cfg, draft_head),
            gguf_blocks=self._gguf_blocks(),
            quantization=self._on_load_quantization(),
        )
        self.model = loaded.model
        if hasattr(self.model, "feature_cache"):  # a vision model: its encoder-output budget
            self.model.feature_cache = VisionFeatureCache(
                budget_bytes(server_args.mm_preprocess_cache_size_mb)
            )
        expert_stats.attach(self.model)  # MoE layers report routings under their layer index
        if not draft_head:
            self._init_expert_placement(server_args)
        self.routed_shape = self._init_routed_capture(server_args, loaded.config)
        self.model_config: ModelConfig = loaded.config
        self.model_dir = loaded.model_dir
        self.dtype = self.model_config.dtype
        # Every rank must size its pools as rank 0 does: the scheduler's slot numbers index them.
        plan = ps.broadcast_object(self._plan_memory())
        assert isinstance(plan, MemoryPlan)
        self.plan = plan
        cfg = self.model_config
        self.compiled_decode = self._init_compile()
        layout = kv_layout(cfg, ps.kv_heads_per_rank(cfg.num_key_value_heads))
        scales = self._kv_scales(layout.v_shares_k)
        self.kv_cache = KVCache(
            size=self.kv_cache_size,
            num_layers=cfg.num_hidden_layers,
            num_kv_heads=layout.num_kv_heads,
            head_dim=layout.head_dim,
            dtype=self._kv_dtype(),
            device=self.device,
            owned_layers=self.model.model.stage.layers,
            v_shares_k=layout.v_shares_k,
            k_scales=scales.k,
            v_scales=scales.v,
        )
        if ps.get_pp_size() > 1:
            from radixserve.model_executor.pipeline import PipelineExecutor

            self.pipeline = PipelineExecutor(self)
        # Extend batches (prefill, mixed) use the prefill backend, decode batches the decode
        # one; both default to --attention-backend.
        self.extend_backend = create_attention_backend(server_args.prefill_attention_backend)
        self.decode_backend = create_attention_backend(server_args.decode_attention_backend)
        # Before use_fast_kernels: hooked layers do not qualify for the one-call C++ layer.
        self.lora = self._init_lora()
        fast = server_args.attention_backend in FAST_KERNEL_BACKENDS
        use_fast_kernels(
            self.model,
            fast,
            repack_weights=not server_args.enable_torch_compile,
            deterministic=bool(server_args.enable_deterministic_inference),
        )
        set_batch_invariant(bool(server_args.enable_deterministic_inference))
        if fast and ps.get_tp_size() > 1:
            logger.info(
                "--tp-size %d: decoder layers run module by module (the one-call C++ layer "
                "holds whole, unsharded projections)",
                ps.get_tp_size(),
            )
        self.kernel_summary = kernel_summary(fast)
        logger.info(
            "Kernels: %s (%s)",
            server_args.attention_backend,
            describe_kernels(fast),
        )
        logger.info(
            "KV cache: %d tokens (%.1f MiB, committed as used; %s), max running requests %d",
            self.plan.max_total_tokens,
            self.plan.max_total_tokens * self.plan.bytes_per_token / 2**20,
            self.kv_pool_reason,
            self.plan.max_running_requests,
        )

    def _check_config(self, cfg: ModelConfig, draft_head: bool) -> None:
        """Refuse a checkpoint in the wrong role (an EAGLE head as the model, or a model as the
        head) before any weight is read; then the --tp-size rules."""
        from radixserve.models.registry import get_model_class

        path = self.server_args.model_path
        if getattr(get_model_class(cfg.architectures), "is_eagle_head", False) != draft_head:
            raise ValueError(
                f"--speculative-draft-model-path {path} is not an EAGLE head (config.json "
                "architectures LlamaForCausalLMEagle or LlamaForCausalLMEagle3)"
                if draft_head
                else f"{path} is an EAGLE draft head: pass it as --speculative-draft-model-path "
                "with --speculative-algorithm EAGLE or EAGLE3"
            )
        self.server_args.validate_against_model(cfg.num_attention_heads, cfg.num_key_value_heads)

    def _init_expert_placement(self, args: ServerArgs) -> None:
        """--init-expert-location: move the MoE layers' experts to the given placement;
        --enable-eplb: the manager that rebalances them as the load is measured."""
        layers = moe_layers(self.model)
        for layer_id, layout in initial_placements(args.init_expert_location, layers).items():
            move_layer(layers[layer_id], layout)
        if not args.enable_eplb:
            expert_stats.set_eplb_counts(None)  # no window left from an earlier runner
            return
        if not layers:
            raise ServerArgsError("--enable-eplb", "the model has no MoE layers to balance")
        self.eplb = EPLBManager(
            layers,
            EPLBConfig(
                rebalance_num_iterations=args.eplb_rebalance_num_iterations,
                layers_per_chunk=args.eplb_rebalance_layers_per_chunk,
                min_utilization_threshold=args.eplb_min_rebalancing_utilization_threshold,
            ),
        )

    def _init_routed_capture(self, args: ServerArgs, cfg: ModelConfig) -> RoutedShape | None:
        """--enable-return-routed-experts: the shape of a token's ids; refused for a model
        with no MoE layer, where there is nothing to return."""
        if not args.enable_return_routed_experts:
            return None
        shape = routed_shape(self.model, cfg.num_hidden_layers)
        if shape is None:
            raise ServerArgsError(
                "--enable-return-routed-experts",
                f"the model ({', '.join(cfg.architectures) or 'unknown architecture'}) has no "
                "MoE layers: there are no routed experts to return",
            )
        return shape

    def _init_compile(self) -> CompiledDecode | None:
        """--enable-torch-compile: the compiled decode graphs (model_executor/compiled_decode.py),
        whose padded rows store their KV in one spare slot past the allocator's range."""
        args = self.server_args
        if not args.enable_torch_compile:
            return None
        from radixserve.model_executor.compiled_decode import CompiledDecode, decode_buckets

        # As SGLang on the CPU: --torch-compile-max-bs is the largest compiled batch, and
        # --cuda-graph-bs (when given) lists the buckets.
        buckets = decode_buckets(args.torch_compile_max_bs, args.cuda_graph_bs_decode)
        return CompiledDecode(buckets, debug=args.enable_torch_compile_debug_mode)

    @property
    def kv_cache_size(self) -> int:
        """KV slots: the allocator's, plus the compiled decode's spare slot."""
        return self.plan.max_total_tokens + (1 if self.compiled_decode is not None else 0)

    def _init_lora(self) -> LoRAManager | None:
        from radixserve.lora.config import lora_config_from_args
        from radixserve.lora.manager import LoRAManager

        config = lora_config_from_args(self.server_args)
        if config is None:
            return None
        if ps.get_tp_size() != 1:
            raise ValueError("--enable-lora runs with --tp-size 1 only")
        return LoRAManager(config, self.model, self.dtype, self.device)

    def _on_load_quantization(self) -> str | None:
        """--quantization w8a8_int8 / bitsandbytes: projections quantized while they load."""
        from radixserve.distributed import parallel_state as ps
        from radixserve.models.quantize_on_load import SCHEMES

        name = self.server_args.quantization
        if name not in SCHEMES:
            return None
        if ps.get_tp_size() != 1 or self.device.type != "cpu":
            raise ValueError(f"--quantization {name} runs on the CPU with --tp-size 1 only")
        return name

    def _gguf_blocks(self) -> bool:
        """--quantization gguf: the model loads straight from the GGUF's blocks."""
        # With --tp-size > 1 each rank keeps its slice of the blocks (models/gguf_shard.py).
        return self.server_args.quantization == "gguf"

    def _kv_dtype(self) -> torch.dtype:
        if self.server_args.kv_cache_dtype == "auto":
            return self.dtype
        return getattr(torch, self.server_args.resolved_kv_cache_dtype)

    def _kv_scales(self, v_shares_k: bool) -> KvScales:
        """An 8-bit KV cache's per-layer scales (model_executor/kv_scales.py), after refusing the
        paths that cannot read one; 1.0 for a float cache."""
        cfg = self.model_config
        args = self.server_args
        dtype = self._kv_dtype()
        if not is_fp8(dtype):
            if args.quantization_param_path is not None:
                raise ValueError(
                    "--quantization-param-path holds FP8 KV cache scales: it needs "
                    "--kv-cache-dtype fp8_e4m3 or fp8_e5m2"
                )
            return kv_ones(cfg.num_hidden_layers)
        option = f"--kv-cache-dtype {args.kv_cache_dtype}"
        if v_shares_k:
            raise ValueError(
                f"{option}: multi-head latent attention (DeepSeek-V2 style) keeps a float "
                "latent KV cache; use --kv-cache-dtype auto or bf16"
            )
        if args.enable_torch_compile:
            raise ValueError(f"{option} does not run with --enable-torch-compile")
        scales = load_kv_scales(
            kv_dtype=dtype,
            num_layers=cfg.num_hidden_layers,
            tp_rank=ps.get_tp_rank(),
            tp_size=ps.get_tp_size(),
            param_path=args.quantization_param_path,
            model_dir=None if args.load_format == "dummy" else self.model_dir,
        )
        logger.info("KV cache: %s, scales from %s", dtype, scales.source)
        return scales

    def _plan_memory(self) -> MemoryPlan:
        cfg = self.model_config
        args = self.server_args
        layout = kv_layout(cfg, ps.kv_heads_per_rank(cfg.num_key_value_heads))
        per_token = KVCache.bytes_per_token(
            len(self.model.model.stage.layers),  # this pipeline stage's layers (all without pp)
            layout.num_kv_heads,
            layout.head_dim,
            self._kv_dtype(),
            layout.v_shares_k,
        )
        memory = device_memory_bytes(self.device.type) or 0
        ranks = ps.get_world_size() * args.dp_size
        if self.device.type == "cpu":
            memory //= ranks  # every rank of every data-parallel replica shares the host's
        elif ranks > torch.cuda.device_count():
            # More ranks than GPUs: they take turns on the GPUs (rank % count) and share them.
            memory //= -(-ranks // torch.cuda.device_count())
        tensors = [*self.model.parameters(), *self.model.buffers()]
        weight_bytes = sum(t.numel() * t.element_size() for t in tensors)
        pool = plan_kv_pool(
            device=self.device.type,
            memory_bytes=memory,
            mem_fraction_static=args.mem_fraction_static,
            weight_bytes=weight_bytes,
            bytes_per_token=per_token,
            context_len=cfg.context_len,
            page_size=args.page_size,
            max_total_tokens=args.max_total_tokens,
            sized_by_default=args.kv_pool_sized_by_default,
        )
        total = pool.tokens
        self.kv_pool_reason = pool.reason
        running = args.max_running_requests or DEFAULT_MAX_RUNNING_REQUESTS.get(
            self.device.type, 256
        )
        return MemoryPlan(total, min(running, total), per_token)

    def forward(self, step: StepInputs, req_to_token: torch.Tensor) -> ForwardOutput:
        """Run the model; float32 logits for `step.logits_rows` (under `step.argmax_only`, where
        the model can, only their argmax: ForwardOutput.greedy_tokens), and final hidden states
        for `step.hidden_rows` (embeddings)."""
        if self.step_broadcaster is None:
            return self._forward(step, req_to_token)
        self.step_broadcaster(step, req_to_token)
        try:
            return self._forward(step, req_to_token)
        except Exception as exc:
            # Under tensor parallelism a step that fails here may have left the other ranks
            # inside a collective: the ranks are out of step for good.
            raise RankLostError(f"forward step failed: {exc}") from exc

    def copy_kv_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy K/V of slots `src` to slots `dst` (every layer, every tensor-parallel rank)."""
        if self.kv_copy_broadcaster is not None:
            self.kv_copy_broadcaster(src, dst)
        self.kv_cache.copy_slots(src, dst)

    @torch.inference_mode()
    def _forward(self, step: StepInputs, req_to_token: torch.Tensor) -> ForwardOutput:
        out = self._run_step(step, req_to_token)
        if self.eplb is not None:
            # Between steps, on every rank in the same pass: the moves' collectives pair up.
            self.eplb.on_forward_pass_end()
        return out

    def _run_step(self, step: StepInputs, req_to_token: torch.Tensor) -> ForwardOutput:
        if self.pipeline is not None:
            return self.pipeline.forward(step, req_to_token)
        bucket = self._compiled_bucket(step)
        if bucket is not None:
            return self._forward_compiled(step, req_to_token, bucket)
        fb = self.forward_batch(step, req_to_token)
        if step.capture_routing and self.routed_shape is not None:
            with capture_step(len(step.input_ids), self.routed_shape) as capture:
                hidden = self.model(fb.input_ids, fb.positions, fb)
            routed: torch.Tensor | None = capture.ids
        else:
            hidden = self.model(fb.input_ids, fb.positions, fb)
            routed = None
        # A decode step wants every row, in order: no [rows, hidden] copy then.
        every_row = step.logits_rows == list(range(hidden.shape[0]))
        logits, greedy = self._logits(step, hidden if every_row else hidden[fb.logits_indices])
        pooled = None
        if step.hidden_rows:
            rows = torch.tensor(step.hidden_rows, dtype=torch.int64, device=self.device)
            pooled = hidden[rows].float()
        features = fb.captured
        if features is None and self.capture_final:
            features = hidden
        return ForwardOutput(logits, pooled, features, routed, greedy)

    def _logits(
        self, step: StepInputs, hidden: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(float32 logits, None), or, for a caller that takes only the argmax, (None, each
        row's greedy token) where the model gives them (its `greedy_tokens`)."""
        if step.argmax_only:
            greedy_tokens = getattr(self.model, "greedy_tokens", None)
            tokens = greedy_tokens(hidden) if greedy_tokens is not None else None
            if tokens is not None:
                return None, tokens
        return self.model.compute_logits(hidden).float(), None

    def _compiled_bucket(self, step: StepInputs) -> int | None:
        """The compiled graph's batch size for this step, None to run it eagerly (not a plain
        decode step, or more requests than the largest bucket)."""
        if self.compiled_decode is None or not step.is_decode or step.hidden_rows:
            return None
        if self.capture_final or self.capture_layers or step.spec_hidden is not None:
            return None  # EAGLE features: the compiled graphs return logits only
        if step.capture_routing:
            return None  # the graphs call the experts inside, where nothing is captured
        if step.mrope_positions is not None:
            return None  # the graphs rotate by `positions`
        return self.compiled_decode.bucket(len(step.input_ids))

    def _forward_compiled(
        self, step: StepInputs, req_to_token: torch.Tensor, bucket: int
    ) -> ForwardOutput:
        from radixserve.model_executor.compiled_decode import pad_decode

        assert self.compiled_decode is not None
        padded = pad_decode(step, bucket, spare_slot=self.plan.max_total_tokens)
        fb = self.forward_batch(padded, req_to_token)
        logits = self.compiled_decode.run(self.model, fb)
        rows = torch.tensor(step.logits_rows, dtype=torch.int64, device=self.device)
        return ForwardOutput(logits[rows], None)

    def forward_batch(self, step: StepInputs, req_to_token: torch.Tensor) -> ForwardBatch:
        """The ForwardBatch of `step`, its attention metadata (and LoRA batch) prepared."""
        dev = self.device
        backend = self.decode_backend if step.is_decode else self.extend_backend
        seq_lens = [p + e for p, e in zip(step.prefix_lens, step.extend_lens, strict=True)]
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE if step.is_decode else ForwardMode.EXTEND,
            input_ids=torch.tensor(step.input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(step.positions, dtype=torch.int64, device=dev),
            req_pool_indices=torch.tensor(step.req_pool_indices, dtype=torch.int64, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=dev),
            extend_prefix_lens=torch.tensor(step.prefix_lens, dtype=torch.int64, device=dev),
            extend_seq_lens=torch.tensor(step.extend_lens, dtype=torch.int64, device=dev),
            out_cache_loc=step.out_cache_loc.to(dev),
            req_to_token=req_to_token,
            kv_cache=self.kv_cache,
            attn_backend=backend,
            req_pool_indices_cpu=list(step.req_pool_indices),
            seq_lens_cpu=seq_lens,
            extend_prefix_lens_cpu=list(step.prefix_lens),
            extend_seq_lens_cpu=list(step.extend_lens),
            logits_indices=torch.tensor(step.logits_rows, dtype=torch.int64, device=dev),
            spec_hidden=step.spec_hidden,
            capture_layers=self.capture_layers,
            image_chunks=step.image_chunks,
            mrope_positions=None if step.mrope_positions is None else step.mrope_positions.to(dev),
        )
        backend.init_forward_metadata(fb)
        if self.lora is not None:
            self.lora.prepare(step.lora_ids, step.extend_lens)
        return fb
