"""The scheduler's side of /update_weights_from_disk, /get_weights_by_name and
/release_memory_occupation + /resume_memory_occupation.

A weight update waits for the requests that already started to finish (new ones wait in the
queue, SGLang's behaviour) unless the caller asked to abort them; then the new weights go in
and the prefix cache, computed with the old ones, is dropped. Releasing memory first retracts
the running requests and pauses the scheduler: requests wait until the memory is resumed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from radixserve.errors import InvalidRequestError
from radixserve.messages import AbortReq, UpdateWeightsFromDiskReq
from radixserve.model_executor import weight_update

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req
    from radixserve.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class WeightHost(Protocol):
    """What weight control acts on (the Scheduler): its model, its requests, admission of new
    ones, pausing, and the prefix cache computed with the old weights."""

    runner: ModelRunner
    paused: bool
    admit_new: bool

    @property
    def waiting(self) -> list[Req]: ...

    def live_reqs(self) -> list[Req]: ...

    def abort(self, msg: AbortReq) -> None: ...

    def pause(self, mode: str) -> None: ...

    def drop_prefix_cache(self) -> None: ...


class WeightControl:
    def __init__(self, scheduler: WeightHost) -> None:
        self.scheduler = scheduler
        self.pending: tuple[int, UpdateWeightsFromDiskReq] | None = None
        self.released: set[str] = set()
        self.paused_by_release = False

    # -- update from disk ---------------------------------------------------------------------
    def begin_update(self, call_id: int, req: UpdateWeightsFromDiskReq) -> None:
        if self.pending is not None:
            raise InvalidRequestError("A weight update is already in progress.")
        if self.released:
            raise InvalidRequestError(
                "Memory is released; call /resume_memory_occupation before updating weights."
            )
        sched = self.scheduler
        if req.abort_all_requests:
            sched.abort(AbortReq(abort_all=True, message="Aborted for a weight update."))
        sched.admit_new = False
        self.pending = (call_id, req)

    def update_ready(self) -> bool:
        """True once no request that started with the old weights is left."""
        if self.pending is None:
            return False
        return not any(r.first_scheduled_time is not None for r in self.scheduler.live_reqs())

    def finish_update(self) -> tuple[int, dict[str, Any]]:
        assert self.pending is not None
        call_id, req = self.pending
        self.pending = None
        sched = self.scheduler
        sched.admit_new = True
        waiting = len(sched.waiting)
        try:
            weight_update.update_weights_from_disk(sched.runner, req.model_path, req.load_format)
        except InvalidRequestError as exc:
            logger.warning("Weight update from %s refused: %s", req.model_path, exc)
            return call_id, {"success": False, "message": str(exc), "num_paused_requests": 0}
        except Exception as exc:  # the old model is still installed and serving
            logger.exception("Weight update from %s failed", req.model_path)
            message = f"Failed to update weights ({type(exc).__name__}); see the server log."
            return call_id, {"success": False, "message": message, "num_paused_requests": 0}
        sched.drop_prefix_cache()
        message = "Succeeded to update model weights."
        return call_id, {"success": True, "message": message, "num_paused_requests": waiting}

    # -- reading ------------------------------------------------------------------------------
    def get_weights_by_name(self, name: str, truncate_size: int) -> list[Any]:
        return weight_update.get_weights_by_name(self.scheduler.runner, name, truncate_size)

    # -- release / resume ---------------------------------------------------------------------
    def release(self, tags: list[str] | None) -> None:
        chosen = weight_update.check_tags(tags)
        if self.pending is not None:
            raise InvalidRequestError("A weight update is in progress.")
        sched = self.scheduler
        if not self.released:
            self.paused_by_release = not sched.paused
        sched.pause("retract")
        sched.drop_prefix_cache()  # its KV is about to go (or was computed by these weights)
        weight_update.release_memory(sched.runner, chosen)
        self.released |= set(chosen)

    def resume(self, tags: list[str] | None) -> None:
        chosen = weight_update.check_tags(tags)
        sched = self.scheduler
        weight_update.resume_memory(sched.runner, chosen)
        self.released -= set(chosen)
        if not self.released and self.paused_by_release:
            self.paused_by_release = False
            sched.paused = False
