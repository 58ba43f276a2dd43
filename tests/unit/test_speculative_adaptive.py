"""--speculative-adaptive's per-request draft length (radixserve/speculative/adaptive.py)."""

from __future__ import annotations

from radixserve.speculative.adaptive import PAUSE_ROUNDS, PROBE_DRAFTS, DraftBudget


def test_first_round_drafts_the_full_length_then_follows_acceptance() -> None:
    budget = DraftBudget(max_drafts=7)
    assert budget.next_drafts() == 7
    budget.record(7, 7)  # everything landed: stay at the maximum
    assert budget.next_drafts() == 7
    for _ in range(12):
        budget.record(7, 1)  # now about one per round: about three drafts
    assert budget.next_drafts() == 3
    for _ in range(20):
        budget.record(3, 3)  # landing again: back up to the maximum
    assert budget.next_drafts() == 7


def test_drafts_that_never_land_pause_drafting_then_probe() -> None:
    budget = DraftBudget(max_drafts=7)
    assert budget.next_drafts() == 7
    budget.record(7, 0)
    rounds = [budget.next_drafts() for _ in range(PAUSE_ROUNDS)]
    assert rounds == [0] * (PAUSE_ROUNDS - 1) + [PROBE_DRAFTS]
    budget.record(PROBE_DRAFTS, 0)  # the probe missed too: another pause
    assert budget.next_drafts() == 0
    # A round that proposed nothing (no n-gram match) changes nothing.
    before = (budget.accepted_avg, budget.paused)
    budget.record(0, 0)
    assert (budget.accepted_avg, budget.paused) == before


def test_a_landing_probe_resumes_drafting() -> None:
    budget = DraftBudget(max_drafts=7)
    budget.next_drafts()
    budget.record(7, 0)
    for _ in range(PAUSE_ROUNDS):
        drafts = budget.next_drafts()
    assert drafts == PROBE_DRAFTS
    budget.record(PROBE_DRAFTS, PROBE_DRAFTS)
    assert budget.next_drafts() >= 1
    budget.record(2, 2)
    assert budget.next_drafts() >= 2
