"""Hardware detection, ceiling shares and the per-step cost model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from radixserve.benchmarking.hardware import (
    CPU_FEATURES,
    HardwareInfo,
    ceiling_shares,
    cpu_model_name,
    detect_hardware,
    read_cpu_flags,
)
from radixserve.benchmarking.model_cost import ForwardCounter, ModelCost

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Fake Xeon 9000
flags\t\t: fpu sse avx avx2 avx512f avx512_bf16 amx_tile amx_bf16
"""


def _hardware(**overrides: object) -> HardwareInfo:
    base = dict(
        device="cpu",
        cpu_model="test",
        logical_cpus=2,
        threads=2,
        features=("avx2",),
        cpu_capability="AVX2",
        memory_bandwidth_gbs=10.0,
        fp32_gflops=100.0,
        bf16_gflops=None,
        bf16_native=False,
    )
    base.update(overrides)
    return HardwareInfo(**base)  # type: ignore[arg-type]


def test_cpu_flags_and_model_from_cpuinfo(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    flags = read_cpu_flags(path)
    assert {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"} <= flags
    assert "avx512_vnni" not in flags
    assert cpu_model_name(path) == "Fake Xeon 9000"
    assert read_cpu_flags(tmp_path / "missing") == frozenset()


def test_detect_hardware_measures_sane_ceilings() -> None:
    hw = detect_hardware(bandwidth_bytes=1 << 22, matmul_size=128)
    assert hw.device == "cpu" and hw.threads == torch.get_num_threads() >= 1
    assert hw.logical_cpus >= 1 and hw.cpu_model
    assert set(hw.features) <= set(CPU_FEATURES)
    assert hw.cpu_capability == str(torch.backends.cpu.get_cpu_capability())
    assert 0.01 < hw.memory_bandwidth_gbs < 100_000
    assert 0.01 < hw.fp32_gflops < 1_000_000
    native = bool({"avx512_bf16", "amx_bf16"} & set(hw.features))
    assert hw.bf16_native == native and (hw.bf16_gflops is not None) == native
    assert len(hw.describe()) == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        hw.threads = 99  # type: ignore[misc]


def test_ceiling_shares_arithmetic() -> None:
    hw = _hardware()
    shares = ceiling_shares(
        tokens_per_s=50.0, bytes_per_token=1e8, flops_per_token=1e9, hardware=hw
    )
    assert shares.achieved_gbs == pytest.approx(5.0)
    assert shares.bandwidth_share == pytest.approx(0.5)
    assert shares.achieved_gflops == pytest.approx(50.0)
    assert shares.compute_share == pytest.approx(0.5)
    # bf16 weights use the bf16 ceiling only where it was measured natively.
    assert hw.compute_ceiling_gflops("bfloat16") == 100.0
    native = _hardware(bf16_gflops=400.0, bf16_native=True)
    assert native.compute_ceiling_gflops(torch.bfloat16) == 400.0
    assert "50.0%" in shares.describe("decode")


CONFIG = SimpleNamespace(
    vocab_size=100,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=4,
    intermediate_size=32,
)


class TinyModel(torch.nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 16)
        self.body = torch.nn.Linear(16, 16, bias=False)
        self.lm_head = None if tied else torch.nn.Linear(16, 100, bias=False)


@pytest.mark.parametrize("tied", [True, False])
def test_model_cost_counts_each_matrix_once(tied: bool) -> None:
    cost = ModelCost.from_model(TinyModel(tied), CONFIG, torch.float32)
    assert cost.body_params == 256 and cost.lm_head_params == 1600
    assert cost.body_bytes == 256 * 4 and cost.lm_head_bytes == 1600 * 4
    assert cost.kv_bytes_per_token == 2 * 2 * 2 * 4 * 4
    assert cost.attn_flops_per_pair == 4 * 2 * 4 * 4
    assert cost.flops_per_token == 2 * (256 + 1600)


def test_step_cost_of_prefill_and_decode() -> None:
    cost = ModelCost.from_model(TinyModel(True), CONFIG, torch.float32)
    prefill = cost.step(prefix_lens=[0], extend_lens=[3], num_logits=1)
    assert prefill.tokens == 3
    # 3 tokens through the body, 1 logits row, causal pairs 1 + 2 + 3.
    assert prefill.flops == 2 * 256 * 3 + 2 * 1600 + 128 * 6
    assert prefill.bytes == (256 + 1600) * 4 + 3 * 128
    decode = cost.decode_step([3, 5])
    assert decode.flops == 2 * 256 * 2 + 2 * 1600 * 2 + 128 * (4 + 6)
    assert decode.bytes == (256 + 1600) * 4 + (3 + 5 + 2) * 128


def test_model_cost_from_config_estimates_a_llama() -> None:
    cost = ModelCost.from_config(CONFIG, torch.bfloat16)
    attn = 16 * 4 * (2 * 4 + 2 * 2)
    assert cost.body_params == 2 * (attn + 3 * 16 * 32 + 2 * 16) + 16
    assert cost.body_bytes == 2 * cost.body_params and cost.dtype == "bfloat16"


def test_forward_counter_adds_up_steps_and_restores_forward() -> None:
    cost = ModelCost.from_model(TinyModel(True), CONFIG, torch.float32)

    class Runner:
        def forward(self, step: object, table: object) -> str:
            return "logits"

    runner = Runner()
    counter = ForwardCounter(runner, cost)
    step = SimpleNamespace(
        is_decode=True, prefix_lens=[3, 5], extend_lens=[1, 1], logits_rows=[0, 1]
    )
    assert runner.forward(step, None) == "logits"
    assert counter.steps == counter.decode_steps == 1
    assert counter.total == cost.decode_step([3, 5])
    counter.close()
    assert "forward" not in vars(runner)


def test_model_cost_counts_gguf_blocks_not_freed_float_weights() -> None:
    """--quantization gguf: a projection's bytes are its blocks (Q4_1: 20 bytes per 32
    weights), and a tied LM head reads the embedding's blocks (Q8_0: 34 per 32)."""
    from radixserve.kernels import reference
    from radixserve.layers.linear import ReplicatedLinear
    from radixserve.layers.quantization import use_gguf_blocks
    from radixserve.layers.vocab_embedding import VocabParallelEmbedding

    config = SimpleNamespace(**{**vars(CONFIG), "hidden_size": 32})
    model = torch.nn.Module()
    model.embed = VocabParallelEmbedding(100, 32)
    model.body = ReplicatedLinear(32, 64)
    use_gguf_blocks(model.body, [(torch.zeros(64, 20, dtype=torch.uint8), reference.GGML_Q4_1)])
    use_gguf_blocks(model.embed, [(torch.zeros(100, 34, dtype=torch.uint8), reference.GGML_Q8_0)])
    cost = ModelCost.from_model(model, config, torch.float32)
    assert cost.body_params == 64 * 32 and cost.body_bytes == 64 * 20
    assert cost.lm_head_params == 100 * 32 and cost.lm_head_bytes == 100 * 34


def test_model_cost_of_routed_experts() -> None:
    """A MoE layer's experts count per expert: one token's flops and bytes are its top_k
    experts', a step's bytes the distinct experts its tokens read (exactly k for one token;
    never more than all of them)."""
    from radixserve.layers.moe import FusedMoE, RouterSpec

    model = TinyModel(True)
    model.experts = FusedMoE(8, 16, 32, RouterSpec(top_k=2))  # 8 experts of 3 x 16 x 32
    cost = ModelCost.from_model(model, CONFIG, torch.float32)
    per_expert = 3 * 16 * 32
    assert cost.body_params == 256  # the experts' stacks are not dense parameters
    (layer,) = cost.expert_layers
    assert (layer.params_per_expert, layer.bytes_per_expert) == (per_expert, per_expert * 4)
    assert cost.params == 256 + 1600 + 8 * per_expert
    assert cost.active_params == 256 + 1600 + 2 * per_expert
    assert cost.active_bytes == 4 * cost.active_params
    one = cost.decode_step([3])
    assert one.flops == 2 * (256 + 2 * per_expert) + 2 * 1600 + 128 * 4
    assert one.bytes == (256 + 1600 + 2 * per_expert) * 4 + 4 * 128
    many = cost.decode_step([3] * 64)
    experts_read = (many.bytes - (256 + 1600) * 4 - 64 * 4 * 128) / (per_expert * 4)
    assert 7.9 < experts_read <= 8


def test_model_cost_from_config_of_a_moe() -> None:
    """A MoE config's MLP is its experts: top_k of them per token."""
    config = SimpleNamespace(
        **vars(CONFIG), num_experts=8, num_experts_per_tok=2, moe_intermediate_size=8
    )
    cost = ModelCost.from_config(config, torch.float32)
    attn = 16 * 4 * (2 * 4 + 2 * 2)
    assert cost.body_params == 2 * (attn + 2 * 16) + 16
    assert len(cost.expert_layers) == 2
    assert cost.active_params == cost.body_params + cost.lm_head_params + 2 * 2 * 3 * 16 * 8
