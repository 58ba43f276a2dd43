"""The startup banner names the settings a newcomer asks about first, and the URL."""

from __future__ import annotations

from radixserve.entrypoints.banner import startup_banner
from radixserve.messages import SchedulerReady
from radixserve.server_args import ServerArgs
from radixserve.utils.cpu_threads import CpuPlan


def test_banner_shows_resolved_settings_and_url() -> None:
    args = ServerArgs(device="cpu", dtype="float32", chunked_prefill_size=2048)
    ready = SchedulerReady("/m", 49152, 8192, 65536, 256, ("LlamaForCausalLM",))
    text = startup_banner(args, ready, CpuPlan((0, 1), (0, 1), False), "http://127.0.0.1:30000")
    for needle in (
        "radixserve is ready",
        args.served_model_name,
        "LlamaForCausalLM",
        "float32 on cpu",
        "2 compute threads on CPUs 0,1",
        "65,536 tokens",
        "max 256 running requests",
        "prefill chunks of 2048 tokens",
        args.grammar_backend,
        "http://127.0.0.1:30000/v1",
    ):
        assert needle in text, needle


def test_banner_names_what_the_attention_kernels_run_on() -> None:
    """--attention-backend keeps SGLang's name (intel_amx) on an AMD CPU too; the banner adds
    what actually runs there."""
    args = ServerArgs(device="cpu", attention_backend="intel_amx")
    ready = SchedulerReady(
        "/m",
        49152,
        8192,
        65536,
        256,
        ("LlamaForCausalLM",),
        kernels="radixserve C++ kernels: avx2, no AMX",
    )
    text = startup_banner(args, ready, None, "http://127.0.0.1:30000")
    line = next(row for row in text.splitlines() if row.strip().startswith("attention"))
    assert line.split(None, 1)[1] == "intel_amx (radixserve C++ kernels: avx2, no AMX)"
