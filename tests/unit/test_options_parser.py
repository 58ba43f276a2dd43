"""Parsing behaviour SGLang users rely on: prefixes, aliases, deprecated spellings, one-line errors."""

from __future__ import annotations

import logging

import pytest

from radixserve.options.errors import OptionError
from radixserve.options.parser import build_parser, parse_args


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["--tp", "2"], "tp_size", 2),
        (["--dp", "3"], "dp_size", 3),
        (["--mem-frac", "0.7"], "mem_fraction_static", 0.7),
        (["--context-len", "32k"], "context_length", 32_000),
        (["--disable-radix"], "disable_radix_cache", True),
        (["--trust-remote"], "trust_remote_code", True),
        (["--max-total-token", "4096"], "max_total_tokens", 4096),
        (["--speculative-algo", "EAGLE"], "speculative_algorithm", "EAGLE"),
        (["--tp=4"], "tp_size", 4),
    ],
)
def test_prefixes_sglang_users_rely_on(argv: list[str], dest: str, value: object) -> None:
    assert parse_args(argv) == {dest: value}


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["--model", "m"], "model_path", "m"),
        (["--tensor-parallel-size", "2"], "tp_size", 2),
        (["--data-parallel-size", "2"], "dp_size", 2),
        (["--pipeline-parallel-size", "2"], "pp_size", 2),
        (["--expert-parallel-size", "2"], "ep_size", 2),
        (["--ep", "4"], "ep_size", 4),
        (["--nccl-init-addr", "h:1"], "dist_init_addr", "h:1"),
        (["--speculative-draft-model", "d"], "speculative_draft_model_path", "d"),
        (["--fp8-gemm-backend", "triton"], "fp8_gemm_runner_backend", "triton"),
        (["--elastic-ep-join-mode", "scale"], "ep_join_mode", "scale"),
    ],
)
def test_aliases_store_into_sglang_dests(argv: list[str], dest: str, value: object) -> None:
    assert parse_args(argv) == {dest: value}


def test_legacy_cuda_graph_max_bs_sets_decode_limit_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        values = parse_args(["--cuda-graph-max-bs", "8"])
    assert values == {"cuda_graph_max_bs_decode": 8}
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        "'--cuda-graph-max-bs' is deprecated and will be removed in a future release. "
        "Use '--cuda-graph-max-bs-decode' instead."
    ]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--cuda-graph-bs", "1", "2", "4"], {"cuda_graph_bs_decode": [1, 2, 4]}),
        (["--disable-cuda-graph"], {"disable_cuda_graph": True}),
        (
            ["--enable-flashinfer-allreduce-fusion"],
            {"flashinfer_allreduce_fusion_backend": "auto"},
        ),
        (["--piecewise-cuda-graph-max-tokens", "512"], {"cuda_graph_max_bs_prefill": 512}),
        (["--disable-piecewise-cuda-graph"], {"cuda_graph_backend_prefill": "disabled"}),
        (["--stream-output"], {"incremental_streaming_output": True}),
        (["--nsa-prefill-cp-mode", "round-robin-split"], {"cp_strategy": "interleave"}),
        (["--mamba-scheduler-strategy", "no_buffer"], {"mamba_radix_cache_strategy": "no_buffer"}),
        (["--collect-tokens-histogram"], {}),
    ],
)
def test_deprecated_spellings_store_into_the_new_option(
    argv: list[str], expected: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert parse_args(argv) == expected
    assert len(caplog.records) == 1
    assert argv[0] in caplog.records[0].getMessage()


def test_exact_new_names_win_over_prefix_matching() -> None:
    assert parse_args(["--cuda-graph-max-bs-decode", "16"]) == {"cuda_graph_max_bs_decode": 16}
    assert parse_args(["--model-path", "p"]) == {"model_path": "p"}


def test_bool_optional_options_accept_no_form() -> None:
    assert parse_args(["--no-lora-strict-loading"]) == {"lora_strict_loading": False}
    assert parse_args(["--dllm-fdfo"]) == {"dllm_fdfo": True}


def test_nargs_options_and_negative_numbers() -> None:
    values = parse_args(["--gc-threshold", "10", "20", "--chunked-prefill-size", "-1"])
    assert values == {"gc_threshold": [10, 20], "chunked_prefill_size": -1}
    assert parse_args(["--uvicorn-access-log-exclude-prefixes"]) == {
        "uvicorn_access_log_exclude_prefixes": []
    }
    assert parse_args(["--model-checksum"]) == {"model_checksum": ""}


def test_json_options_are_decoded() -> None:
    values = parse_args(["--preferred-sampling-params", '{"temperature": 0.5}'])
    assert values == {"preferred_sampling_params": {"temperature": 0.5}}


def _error(argv: list[str]) -> str:
    with pytest.raises(OptionError) as info:
        parse_args(argv)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_ambiguous_prefix_names_the_candidates() -> None:
    message = _error(["--cuda-graph-max", "8"])
    assert message.startswith("ambiguous option: --cuda-graph-max could match")
    assert "--cuda-graph-max-bs-decode" in message and "--cuda-graph-max-bs-prefill" in message


def test_unknown_option_suggests_the_closest() -> None:
    assert _error(["--tp-sise", "2"]) == (
        "unrecognized option '--tp-sise' (did you mean --tp-size?)"
    )
    assert "see radixserve serve --help" in _error(["--frobnicate"])
    assert _error(["--cuda-graph-max-bss", "8"]) == (
        "unrecognized option '--cuda-graph-max-bss' (did you mean --cuda-graph-max-bs?)"
    )
    assert _error(["--chunked-prefil-sizes=4"]).startswith(
        "unrecognized option '--chunked-prefil-sizes' (did you mean --chunked-prefill-size"
    )


def test_bad_choice_names_option_and_valid_values() -> None:
    assert _error(["--dtype", "fp64"]) == (
        "argument --dtype: invalid choice: 'fp64' "
        "(choose from 'auto', 'half', 'float16', 'bfloat16', 'float', 'float32')"
    )


def test_bad_type_names_the_option() -> None:
    assert _error(["--tp-size", "two"]) == (
        "argument --tp-size/--tensor-parallel-size: invalid integer 'two'"
    )
    assert "invalid number 'x'" in _error(["--mem-fraction-static", "x"])
    assert "argument --context-length" in _error(["--context-length", "12q"])
    assert "invalid JSON" in _error(["--preferred-sampling-params", "{oops"])


def test_missing_value_and_stray_positional() -> None:
    assert _error(["--port"]) == "argument --port: expected one argument"
    assert _error(["--port", "1", "extra"]).startswith("unexpected argument 'extra'")


def test_help_lists_only_what_works_here_grouped_by_area(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--cuda-graph-max-bs", "8", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: radixserve serve [MODEL_PATH]")
    for title in ("Model and tokenizer:", "Memory and scheduling:", "HTTP server and API:"):
        assert f"\n{title}\n" in out
    assert "--max-running-requests" in out and "--chunked-prefill-size" in out
    # Options without an effect here are not listed; the footer says how to see them.
    assert "[not applicable" not in out and "[not supported yet]" not in out
    assert "--cuda-graph-backend-decode" not in out and "--enable-nccl-nvls" not in out
    assert "--cuda-graph-bs-decode" in out  # --enable-torch-compile's buckets on the CPU
    assert "[supported here: torch_native, intel_amx]" in out
    assert "radixserve serve --help-all" in out


def test_help_all_lists_every_option_with_its_support_level(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--help-all"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: radixserve serve [MODEL_PATH]")
    for title in ("Model and tokenizer:", "CUDA graphs:", "Speculative decoding:", "LoRA:"):
        assert f"\n{title}\n" in out
    assert "[not applicable: accepted and ignored]" in out
    assert "[not supported yet]" in out
    assert "--cuda-graph-max-bs-decode" in out
    # Hidden deprecated spellings stay out of the help.
    assert "--speculative-dflash-draft-window-size" not in out


def test_parser_is_reused() -> None:
    assert build_parser() is build_parser()
