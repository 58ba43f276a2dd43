"""The scheduler's request table: who waits, who runs, and the prompt being prefilled in
chunks. One object, shared by the scheduler, the batch former and the output processor, so
each reads and moves requests through the same lists."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixserve.managers.schedule_batch import Req


@dataclass
class RequestQueues:
    waiting: list[Req] = field(default_factory=list)
    running: list[Req] = field(default_factory=list)
    chunked_req: Req | None = None  # a prompt part-way through chunked prefill

    def batchable(self) -> bool:
        """Whether some request could go into a step now."""
        return bool(self.waiting or self.running or self.chunked_req)

    def in_progress(self) -> list[Req]:
        """Running requests and the chunked prompt: the ones holding computed KV."""
        return [*self.running, *([self.chunked_req] if self.chunked_req is not None else [])]

    def drop_finished(self) -> None:
        """Forget requests that ended outside a step (aborts, time limits)."""
        self.waiting = [r for r in self.waiting if not r.finished]
        self.running = [r for r in self.running if not r.finished]
        if self.chunked_req is not None and self.chunked_req.finished:
            self.chunked_req = None

    def clear(self) -> None:
        self.waiting, self.running, self.chunked_req = [], [], None
