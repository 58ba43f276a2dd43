"""--use-ray's option rules (no Ray needed): what it is refused with, each with one line naming
the options, and that the CLI exits 2 on them. The launch itself: tests/e2e/test_http_e2e_ray.py
(slow, needs ray)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

import pytest

from radixserve.options import hardware
from radixserve.options.errors import ServerArgsError
from radixserve.server_args import ServerArgs


@pytest.fixture
def ray_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules only look for the package; pretend it is there whether or not it is."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "ray" else real(name, *a)
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dp_size": 2}, "--use-ray: cannot be combined with --dp-size > 1"),
        (
            {"nnodes": 2, "tp_size": 2, "dist_init_addr": "127.0.0.1:1"},
            "--use-ray: cannot be combined with --nnodes > 1 \\(Ray places the ranks",
        ),
    ],
)
def test_refused_combinations(ray_installed: None, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ServerArgsError, match=message):
        ServerArgs.from_kwargs(use_ray=True, device="cpu", **kwargs)


def test_cuda_is_refused(ray_installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cuda_available", lambda: True)
    with pytest.raises(ServerArgsError, match="--use-ray: runs CPU ranks only for now"):
        ServerArgs.from_kwargs(use_ray=True, device="cuda")


def test_accepted_with_tp_and_pp_on_cpu(ray_installed: None) -> None:
    args = ServerArgs.from_kwargs(use_ray=True, device="cpu", tp_size=2, pp_size=2)
    assert args.use_ray and args.tp_size * args.pp_size == 4


def test_missing_ray_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    with pytest.raises(ServerArgsError, match="--use-ray: needs the ray package"):
        ServerArgs.from_kwargs(use_ray=True, device="cpu")


def test_thread_runtime_is_refused(ray_installed: None) -> None:
    from radixserve.managers.inprocess_runtime import InProcessRuntime

    with pytest.raises(ValueError, match="--use-ray runs the scheduler as a Ray actor"):
        InProcessRuntime(ServerArgs.from_kwargs(use_ray=True, device="cpu"))


def test_cli_refuses_with_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "radixserve", "serve", "--use-ray", "--dp-size", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    # Without ray installed the missing package is named first; either way one line.
    assert "--use-ray:" in result.stderr


@pytest.mark.parametrize(
    ("nodes", "dist_init_addr", "host"),
    [(1, None, "127.0.0.1"), (2, None, "10.0.0.5"), (2, "10.0.0.9:4000", "10.0.0.9")],
)
def test_rendezvous_host_on_a_cluster_of_several_nodes(
    nodes: int, dist_init_addr: str | None, host: str
) -> None:
    """On one node the ranks meet at 127.0.0.1; when Ray may place them on other machines, at
    this machine's address (rank 0 hosts the store here); --dist-init-addr always wins."""
    from radixserve.distributed.ray_launch import RayCluster
    from radixserve.managers.multiprocess_runtime import MultiProcessRuntime

    runtime = object.__new__(MultiProcessRuntime)  # only the rendezvous logic, no processes
    runtime._ray = RayCluster(started=False, node_ip="10.0.0.5", nodes=nodes)
    args = ServerArgs(tp_size=2, device="cpu", dist_init_addr=dist_init_addr)
    config = runtime._dist_config(args)
    assert config is not None and config.world_size == 2
    assert config.init_addr.rpartition(":")[0] == host
