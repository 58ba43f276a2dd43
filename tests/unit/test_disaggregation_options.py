"""--disaggregation-* option rules and the PD request fields on the HTTP bodies: what is refused,
each with a message naming the option or field."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from radixserve.entrypoints.bootstrap_fields import bootstrap_per_prompt
from radixserve.entrypoints.openai.errors import ApiError
from radixserve.messages import BootstrapInfo
from radixserve.options.errors import ServerArgsError
from radixserve.server_args import ServerArgs


@pytest.fixture
def mooncake_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "mooncake" else real(name, *a),
    )


def test_modes_are_accepted(mooncake_installed: None) -> None:
    for mode in ("prefill", "decode"):
        args = ServerArgs.from_kwargs(device="cpu", disaggregation_mode=mode)
        assert args.disaggregation_mode == mode
        assert args.disaggregation_transfer_backend == "mooncake"
        assert args.disaggregation_bootstrap_port == 8998


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dp_size": 2}, "--disaggregation-mode: prefill cannot be combined with --dp-size > 1"),
        ({"pp_size": 2}, "--disaggregation-mode: prefill cannot be combined with --pp-size > 1"),
        (
            {"speculative_algorithm": "NGRAM"},
            "--disaggregation-mode: prefill cannot be combined with --speculative-algorithm",
        ),
        ({"disaggregation_transfer_backend": "nixl"}, "--disaggregation-transfer-backend"),
    ],
)
def test_refused_combinations(
    mooncake_installed: None, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ServerArgsError, match=message):
        ServerArgs.from_kwargs(device="cpu", disaggregation_mode="prefill", **kwargs)


def test_missing_mooncake_is_refused_with_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mooncake" else real(name, *a)
    )
    with pytest.raises(ServerArgsError, match=r"radixserve\[disaggregation\]"):
        ServerArgs.from_kwargs(device="cpu", disaggregation_mode="decode")
    # fake needs nothing (SGLang's warm-up backend)
    args = ServerArgs.from_kwargs(
        device="cpu", disaggregation_mode="decode", disaggregation_transfer_backend="fake"
    )
    assert args.disaggregation_transfer_backend == "fake"


def test_bootstrap_fields_scalar_and_batch() -> None:
    assert bootstrap_per_prompt(None, None, None, 2) == [None, None]
    assert bootstrap_per_prompt("h", 1, 5, 1) == [BootstrapInfo("h", 1, 5)]
    assert bootstrap_per_prompt("h", 1, [5, 6], 2) == [
        BootstrapInfo("h", 1, 5),
        BootstrapInfo("h", 1, 6),
    ]
    assert bootstrap_per_prompt(["a", "b"], [1, 2], [5, 6], 2)[1] == BootstrapInfo("b", 2, 6)


@pytest.mark.parametrize(
    ("host", "port", "room", "param"),
    [
        ("h", None, 5, "bootstrap_port"),
        (None, 1, 5, "bootstrap_host"),
        ("h", 1, -1, "bootstrap_room"),
        ("h", 1, "x", "bootstrap_room"),
        ("h", 1, [1, 2, 3], "bootstrap_room"),
    ],
)
def test_bad_bootstrap_fields_are_400(host: Any, port: Any, room: Any, param: str) -> None:
    with pytest.raises(ApiError) as err:
        bootstrap_per_prompt(host, port, room, 2)
    assert err.value.status_code == 400 and err.value.param == param
