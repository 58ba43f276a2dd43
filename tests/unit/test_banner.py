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
