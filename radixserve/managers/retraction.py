"""Who gets retracted when a decode step does not fit, and how optimistic admission is.

new_token_ratio is the share of each running request's remaining max_new_tokens that admission
reserves. It starts at 0.7 x --schedule-conservativeness, decays towards 14% of that while
decoding goes well, and jumps back up after a retraction (SGLang's schedule, same constants).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixserve.managers.schedule_batch import Req

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20


class NewTokenRatio:
    def __init__(self, conservativeness: float) -> None:
        self.init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
        self.min = self.init * MIN_NEW_TOKEN_RATIO_FACTOR
        self.step_size = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.value = self.init

    def decay(self) -> None:
        self.value = max(self.value - self.step_size, self.min)

    def reset(self) -> None:
        self.value = self.init

    def after_retraction(self, running: Sequence[Req]) -> None:
        decoded = sum(len(r.output_ids) for r in running)
        budget = sum(r.max_new_tokens for r in running)
        ratio = (decoded + RETRACT_DECODE_STEPS * len(running)) / (budget + 1)
        self.value = min(max(ratio, self.value), 1.0)


def retraction_order(running: Sequence[Req], policy: str) -> list[Req]:
    """Running requests, first-to-retract first.

    "length" keeps requests that have generated more and have shorter prompts (they are closest
    to done and cheapest to keep); "priority" retracts the lowest priority first.
    """
    if policy == "priority":
        return sorted(running, key=lambda r: (r.priority, len(r.output_ids)))
    return sorted(running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
