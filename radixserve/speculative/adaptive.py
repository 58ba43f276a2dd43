"""--speculative-adaptive: each request drafts about as many tokens as it has lately had accepted.

A verify round over k drafts costs more than a plain decode step (on a 2-core CPU an extend of 2
rows ~1.3x a decode step, of 8 rows ~1.6x in float32 and ~2.8x with GGUF weights), so drafts
that are rarely accepted (chat, where the n-gram cache proposes what other requests said) make a
request slower than no speculation at all, while long drafts pay on copying workloads. SGLang's
adaptive mode moves one draft length for the whole batch; here every request keeps its own,
since one batch mixes copying and chatting requests.

Per request: an exponential average of the drafts accepted per round. The next round drafts
about twice that plus one (room to grow when drafts start landing), up to the configured
maximum. When almost nothing is accepted the request stops drafting for a while (its rounds are
plain decode steps) and then probes again with a short draft.
"""

from __future__ import annotations

from dataclasses import dataclass

SMOOTHING = 0.3  # weight of the newest round in the average
DRAFT_PER_ACCEPTED = 2.0  # drafts proposed per token expected to be accepted
PAUSE_BELOW = 0.3  # accepted drafts per round under which drafting pauses
PAUSE_ROUNDS = 8  # rounds without drafts before the next probe
PROBE_DRAFTS = 2  # drafts of a probe round


@dataclass
class DraftBudget:
    """The adaptive draft length of one request (kept on Req.spec_budget)."""

    max_drafts: int
    accepted_avg: float = -1.0  # accepted drafts per round; < 0 until the first round
    paused: int = 0  # rounds left without drafts

    def next_drafts(self) -> int:
        """How many drafts to propose this round (0: decode plainly)."""
        if self.accepted_avg < 0:
            return self.max_drafts  # no history: try the full length
        if self.paused > 0:
            self.paused -= 1
            return 0 if self.paused > 0 else min(PROBE_DRAFTS, self.max_drafts)
        wanted = round(DRAFT_PER_ACCEPTED * self.accepted_avg + 1)
        return max(1, min(self.max_drafts, wanted))

    def record(self, drafted: int, accepted: int) -> None:
        """A round that proposed `drafted` drafts kept `accepted` of them."""
        if drafted == 0:
            return
        if self.accepted_avg < 0:
            self.accepted_avg = float(accepted)
        else:
            self.accepted_avg = SMOOTHING * accepted + (1 - SMOOTHING) * self.accepted_avg
        if self.accepted_avg < PAUSE_BELOW:
            self.paused = PAUSE_ROUNDS
