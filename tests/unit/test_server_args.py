"""ServerArgs: one frozen, fully resolved configuration, with clear errors for bad values."""

from __future__ import annotations

import dataclasses
import logging
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from radixserve import default_model
from radixserve.options import hardware, registry
from radixserve.options.resolve import default_grammar_backend
from radixserve.options.spec import Kind, Support
from radixserve.options.validate import validate_against_model
from radixserve.server_args import ServerArgs, ServerArgsError
from radixserve.utils.auto_dtype import DtypeChoice

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_default_model_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # Resolution must never reach pip in unit tests.
    monkeypatch.setattr(default_model, "ensure_default_model", lambda: Path("/cache/smol.gguf"))


def _cpu(**kwargs: object) -> ServerArgs:
    kwargs.setdefault("model_path", "/models/m")
    kwargs.setdefault("device", "cpu")
    return ServerArgs.from_kwargs(**kwargs)


def test_every_implemented_option_is_a_typed_field_with_the_sglang_default() -> None:
    fields = {f.name: f for f in dataclasses.fields(ServerArgs) if f.init and f.name != "other"}
    implemented = {
        spec.dest: spec
        for spec in registry.all_options()
        if spec.support is Support.IMPLEMENTED and not spec.is_deprecated
    }
    assert set(fields) == set(implemented)
    for dest, spec in implemented.items():
        assert fields[dest].default == spec.default, dest


def test_cli_resolves_every_auto_for_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cpu_memory_bytes", lambda: 24 << 30)
    monkeypatch.setattr(hardware, "cpu_auto_dtype", lambda: DtypeChoice("float32", "none"))
    args = ServerArgs.from_cli(["/models/m", "--device", "cpu"])
    assert args.model_path == args.tokenizer_path == args.served_model_name == "/models/m"
    assert (args.device, args.resolved_dtype, args.resolved_kv_cache_dtype) == (
        "cpu",
        "float32",
        "float32",
    )
    assert args.mem_fraction_static == 0.5
    assert args.chunked_prefill_size == 512
    assert args.page_size == 1
    assert isinstance(args.random_seed, int)
    assert args.attention_backend == args.prefill_attention_backend == "intel_amx"
    assert args.decode_attention_backend == "intel_amx"
    assert args.sampling_backend == "pytorch"
    assert args.grammar_backend == default_grammar_backend()  # the first installed
    assert args.log_level_http == "info"
    assert args.cuda_graph_max_bs_decode == args.torch_compile_max_bs == 32
    assert args.not_applicable == ()


def test_cpu_with_native_bf16_defaults_to_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cpu_auto_dtype", lambda: DtypeChoice("bfloat16", "probed"))
    assert _cpu().resolved_dtype == "bfloat16"
    assert _cpu(dtype="half").resolved_dtype == "float16"
    assert _cpu(dtype="float", kv_cache_dtype="bf16").resolved_kv_cache_dtype == "bfloat16"


def test_cuda_defaults_follow_sglang_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "detect_device", lambda: "cuda")
    monkeypatch.setattr(hardware, "cuda_available", lambda: True)
    monkeypatch.setattr(hardware, "cuda_memory_bytes", lambda index=0: 80 << 30)
    monkeypatch.setattr(hardware, "cuda_supports_bf16", lambda: True)
    args = ServerArgs.from_kwargs(model_path="/m")
    assert (args.device, args.resolved_dtype) == ("cuda", "bfloat16")
    assert args.chunked_prefill_size == 8192
    # reserved = 512 + 8192 * 1.5 + 1/8 * 1024 MiB = 12928 MiB of 81920 MiB.
    assert args.mem_fraction_static == round((81920 - 12928) / 81920, 3)
    assert args.cuda_graph_max_bs_decode == 256


def test_device_index_is_stripped_and_unknown_devices_refused() -> None:
    with pytest.raises(ServerArgsError, match=r"^--device: 'xpu' is not supported"):
        _cpu(device="xpu")


def test_missing_model_path_uses_the_default_model() -> None:
    args = ServerArgs.from_kwargs(device="cpu")
    assert args.model_path == "/cache/smol.gguf"
    assert args.served_model_name == default_model.DEFAULT_MODEL_NAME
    assert args.load_format == "gguf"
    assert args.quantization == "gguf"  # a .gguf runs on its blocks, as in SGLang


def test_a_gguf_model_runs_quantized_where_the_kernels_can(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="radixserve.options.resolve"):
        assert _cpu(model_path="/m/x.Q4_1.gguf").quantization == "gguf"
    assert "--quantization unquant dequantises" in caplog.text
    # what the user chose stands: the exact float path, or another method
    assert _cpu(model_path="/m/x.gguf", quantization="unquant").quantization == "unquant"
    assert _cpu(model_path="/m/x.gguf", quantization="w8a8_int8").quantization == "w8a8_int8"
    assert _cpu(model_path="/m/x.gguf", quantization="bitsandbytes").quantization == "bitsandbytes"
    # not a GGUF, or not loaded as one
    assert _cpu(model_path="/models/m").quantization is None
    assert _cpu(model_path="/m/x.gguf", load_format="dummy").quantization is None
    # where the GGUF kernels do not run, the blocks are dequantised (and the log says why)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="radixserve.options.resolve"):
        assert _cpu(model_path="/m/x.gguf", pp_size=2).quantization is None
    assert "do not run with --pp-size 2" in caplog.text
    # tensor parallel ranks each keep their slice of the blocks (models/gguf_shard.py)
    assert _cpu(model_path="/m/x.gguf", tp_size=2).quantization == "gguf"
    monkeypatch.setattr(hardware, "cuda_available", lambda: True)
    monkeypatch.setattr(hardware, "cuda_memory_bytes", lambda index=0: 80 << 30)
    monkeypatch.setattr(hardware, "cuda_supports_bf16", lambda: True)
    assert _cpu(model_path="/m/x.gguf", device="cuda").quantization is None
    # a replaced copy (TP ranks, DP workers) keeps the resolved choice
    unquant = _cpu(model_path="/m/x.gguf", quantization="unquant")
    assert dataclasses.replace(unquant, max_total_tokens=1024).quantization == "unquant"


def test_other_options_are_read_only_attributes() -> None:
    args = _cpu(cuda_graph_max_bs_decode=8, lora_backend="csgmv")
    assert args.cuda_graph_max_bs_decode == 8
    assert args.other["lora_backend"] == "csgmv"
    assert args.enable_hierarchical_cache is False
    with pytest.raises(AttributeError, match="no attribute 'no_such_option'"):
        _ = args.no_such_option
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        args.other["tp_size"] = 2  # type: ignore[index]


def test_replace_and_pickle_keep_the_checks() -> None:
    args = _cpu(cuda_graph_max_bs_decode=8)
    changed = dataclasses.replace(args, max_running_requests=4)
    assert changed.max_running_requests == 4
    assert changed.not_applicable == args.not_applicable == ("--cuda-graph-max-bs-decode=8",)
    assert pickle.loads(pickle.dumps(changed)) == changed
    with pytest.raises(ServerArgsError, match=r"^--page-size: must be > 0"):
        dataclasses.replace(args, page_size=0)


def test_kwargs_unknown_deprecated_and_coerced() -> None:
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'mem_fraction'.*mem_fraction_static"
    ):
        _cpu(mem_fraction=0.5)
    with pytest.warns(DeprecationWarning, match="cuda_graph_max_bs"):
        assert _cpu(cuda_graph_max_bs=8).cuda_graph_max_bs_decode == 8
    with pytest.warns(DeprecationWarning):
        args = _cpu(cuda_graph_max_bs=8, cuda_graph_max_bs_decode=16)
    assert args.cuda_graph_max_bs_decode == 16
    args = _cpu(mem_fraction_static="0.25", context_length="32k", gc_threshold=[1, 2])
    assert (args.mem_fraction_static, args.context_length) == (0.25, 32_000)
    assert args.gc_threshold == (1, 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_size": "two"}, "^--tp-size: invalid integer 'two'"),
        ({"disable_radix_cache": "yes"}, "^--disable-radix-cache: expected True or False"),
        ({"schedule_policy": "nope"}, "^--schedule-policy: invalid choice 'nope'"),
        ({"host": 5}, "^--host: expected a string"),
        ({"page_size": 0}, "^--page-size: must be > 0"),
        ({"chunked_prefill_size": 0}, "^--chunked-prefill-size: must be -1"),
        ({"mem_fraction_static": 1.0}, "^--mem-fraction-static: must be between 0 and 1"),
        ({"port": 70000}, "^--port: must be between 1 and 65535"),
        ({"max_running_requests": 0}, "^--max-running-requests: must be > 0"),
        ({"schedule_conservativeness": -1.0}, "^--schedule-conservativeness: must be >= 0"),
        ({"dp_size": 0}, "^--dp-size: must be >= 1"),
        ({"pp_size": 0}, "^--pp-size: must be >= 1"),
        ({"pp_size": 2, "dp_size": 2}, "^--pp-size: 2 cannot be combined with --dp-size 2"),
        ({"pp_max_micro_batch_size": 4}, "^--pp-max-micro-batch-size: .* needs --pp-size > 1"),
        ({"log_level": "loud"}, "^--log-level: unknown level 'loud'"),
        ({"ssl_keyfile": "k.pem"}, "^--ssl-certfile: --ssl-keyfile and --ssl-certfile"),
        ({"json_model_override_args": "[1]"}, "^--json-model-override-args: must be a JSON object"),
        ({"gc_threshold": [1, 2, 3, 4]}, "^--gc-threshold: takes 1 to 3 integers"),
    ],
)
def test_bad_values_name_the_option(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ServerArgsError, match=message):
        _cpu(**kwargs)


def test_unsupported_options_are_refused_not_ignored() -> None:
    with pytest.raises(ServerArgsError) as info:
        _cpu(enable_lora_overlap_loading=True, disaggregation_decode_enable_offload_kvcache=True)
    message = str(info.value)
    assert info.value.option == "--enable-lora-overlap-loading"
    assert "not supported by radixserve yet" in message
    assert "--enable-lora-overlap-loading=True" in message
    assert "--disaggregation-decode-enable-offload-kvcache=True" in message
    # Leaving them at their defaults is fine.
    args = _cpu(
        enable_lora_overlap_loading=None, disaggregation_decode_enable_offload_kvcache=False
    )
    assert args.other["enable_lora_overlap_loading"] is None
    # EAGLE without its trained head is refused in one line.
    with pytest.raises(ServerArgsError, match="EAGLE needs a trained draft head"):
        _cpu(speculative_algorithm="EAGLE")


def test_implemented_options_refuse_unsupported_choices() -> None:
    with pytest.raises(ServerArgsError, match=r"--load-format npcache"):
        _cpu(load_format="npcache")
    assert _cpu(load_format="safetensors", schedule_policy="lpm").schedule_policy == "lpm"


def test_sglang_kernel_names_map_to_the_kernels_here(caplog: pytest.LogCaptureFixture) -> None:
    """SGLang command lines start unchanged: a kernel radixserve lacks (flashinfer, triton,
    fa3, ...) becomes the one that runs here, with one warning naming both."""
    with caplog.at_level(logging.WARNING):
        args = _cpu(
            attention_backend="flashinfer",
            decode_attention_backend="triton",
            sampling_backend="flashinfer",
        )
    assert args.attention_backend == "intel_amx"
    assert args.decode_attention_backend == "intel_amx"
    assert args.prefill_attention_backend == "intel_amx"
    assert args.sampling_backend == "pytorch"
    warnings = [r.getMessage() for r in caplog.records]
    assert any("--attention-backend flashinfer" in w and "intel_amx" in w for w in warnings)
    assert any("--decode-attention-backend triton" in w for w in warnings)
    assert any("--sampling-backend flashinfer" in w and "pytorch" in w for w in warnings)
    assert _cpu(attention_backend="torch_native").attention_backend == "torch_native"


def test_a_grammar_backend_that_is_not_installed_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from radixserve.options import resolve

    monkeypatch.setattr(resolve, "_grammar_installed", lambda name: name == "llguidance")
    monkeypatch.setattr(resolve, "default_grammar_backend", lambda: "llguidance")
    with caplog.at_level(logging.WARNING):
        args = _cpu(grammar_backend="outlines")
    assert args.grammar_backend == "llguidance"
    assert any("--grammar-backend outlines" in r.getMessage() for r in caplog.records)
    assert _cpu(grammar_backend="none").grammar_backend == "none"


def test_not_applicable_options_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.warns(DeprecationWarning, match="'disable_cuda_graph' is deprecated"):
        args = _cpu(cuda_graph_max_bs_decode=8, enable_nccl_nvls=True, disable_cuda_graph=True)
    assert set(args.not_applicable) == {
        "--cuda-graph-max-bs-decode=8",
        "--enable-nccl-nvls=True",
        "--disable-cuda-graph=True",
    }
    with caplog.at_level(logging.WARNING):
        args.warn_not_applicable()
    assert len(caplog.records) == 1
    assert "--enable-nccl-nvls=True" in caplog.records[0].getMessage()


def test_validate_against_model() -> None:
    _cpu().validate_against_model(num_attention_heads=9, num_kv_heads=3)
    with pytest.raises(ServerArgsError, match=r"^--tp-size: 4 does not divide"):
        validate_against_model(4, num_attention_heads=9, num_kv_heads=3)
    with pytest.raises(ServerArgsError, match=r"^--tp-size: 4 neither divides"):
        validate_against_model(4, num_attention_heads=8, num_kv_heads=6)
    validate_against_model(4, num_attention_heads=8, num_kv_heads=2)


def test_port_check() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServerArgsError, match=f"^--port: cannot listen on 127.0.0.1:{port}"):
            _cpu(port=port).check_port_available()
    _cpu(port=port).check_port_available()


def test_to_dict_has_every_dest() -> None:
    data = _cpu().to_dict()
    assert set(registry.dest_table()) <= set(data)
    assert data["resolved_dtype"] in ("float32", "bfloat16")


def test_deprecated_specs_point_at_real_dests() -> None:
    table = registry.dest_table()
    for spec in registry.all_options():
        if spec.is_deprecated and spec.kind is not Kind.DEPRECATED_NOOP:
            assert spec.dest in table, spec.name


def test_parsing_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from radixserve.server_args import ServerArgs\n"
        "import radixserve.cli\n"
        "ServerArgs.from_cli(['--model-path', 'm', '--device', 'cpu'])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_kwargs_config_file_is_read_and_overridden(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("max_running_requests: 5\nport: 1234\n", encoding="utf-8")
    args = _cpu(config=str(config), port=4321)
    assert (args.max_running_requests, args.port, args.config) == (5, 4321, str(config))


def test_renamed_tool_call_parser_is_translated(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        args = _cpu(tool_call_parser="qwen25")
    assert "deprecated" in caplog.text
    assert args.tool_call_parser == "qwen"


def test_unimplemented_tool_call_parser_is_refused() -> None:
    with pytest.raises(ServerArgsError) as err:
        _cpu(tool_call_parser="kimi_k2")
    assert "tool-call-parser" in str(err.value)


def test_repr_shows_fields_and_only_changed_other_options() -> None:
    text = repr(_cpu(cuda_graph_max_bs_decode=8))
    assert text.startswith("ServerArgs(model_path='/models/m'")
    assert "'cuda_graph_max_bs_decode': 8" in text
    assert "lora_backend" not in text
