"""When a lane's next call starts (``gateway.vsphere.stagger``): table tests with plain values."""

from __future__ import annotations

import heapq
import itertools
from collections import deque

import pytest

from gateway.vsphere.stagger import TOGETHER_MAX_SECONDS, Start, start_at

CALL = 0.4  # seconds: "together" is 20 ms, a meeting again 0.2 s to 0.6 s after the last


@pytest.mark.parametrize(("now", "starts", "call", "slots", "met", "expected"), [
    # nothing started lately, or the last start well apart: at once, the last meeting still remembered
    (10.0, [], CALL, 2, None, Start(10.0, None)),
    (10.0, [9.8], CALL, 2, None, Start(10.0, None)),
    (10.0, [9.6, 9.8], CALL, 2, 9.6, Start(10.0, 9.6)),
    # a first meeting (the other slot taken 2 ms ago): let through, remembered
    (10.0, [9.998], CALL, 2, None, Start(10.0, 10.0)),
    # a meeting long after the last (varying call times): let through, remembered anew
    (10.0, [9.998], CALL, 2, 8.0, Start(10.0, 10.0)),
    # ... or only just after it (more slots freeing at one instant): let through
    (10.0, [9.998, 9.999], CALL, 4, 9.999, Start(10.0, 10.0)),
    # lock step: they met one call ago and meet again: half a call after the other start
    (10.0, [9.998], CALL, 2, 9.6, Start(9.998 + 0.2, 9.6)),
    (10.0, [9.998], CALL, 2, 9.45, Start(9.998 + 0.2, 9.45)),
    # a start already scheduled counts as a start (it is what made a slot wait)
    (10.0, [10.2], CALL, 2, None, Start(10.0, None)),
    # four slots in lock step: each start a quarter call after one before it, on no other one
    (10.0, [10.0], CALL, 4, 9.6, Start(10.1, 9.6)),
    (10.0, [10.0, 10.1], CALL, 4, 9.6, Start(10.2, 9.6)),
    (10.0, [10.0, 10.1, 10.2], CALL, 4, 9.6, Start(10.3, 9.6)),
    # one slot: nothing to spread; no call time measured yet: nothing to spread by
    (10.0, [9.999], CALL, 1, 9.6, Start(10.0, 9.6)),
    (10.0, [9.999], 0.0, 2, 9.6, Start(10.0, 9.6)),
    # short calls: "together" is a fraction of a call (5% of 20 ms = 1 ms); 2 ms apart is apart
    (10.0, [9.998], 0.02, 2, 9.98, Start(10.0, 9.98)),
    (10.0, [9.9995], 0.02, 2, 9.98, Start(9.9995 + 0.01, 9.98)),
], ids=["idle", "apart", "apart-both", "first-meeting", "meeting-long-after", "meeting-just-after",
        "lock-step", "lock-step-late", "scheduled-apart", "four-1", "four-2", "four-3", "one-slot",
        "no-call-time", "short-apart", "short-lock-step"])
def test_start_at(now: float, starts: list[float], call: float, slots: int, met: float | None,
                  expected: Start) -> None:
    got = start_at(now, starts, call, slots, met)
    assert (got.at, got.met) == (pytest.approx(expected.at), expected.met)


def test_together_is_bounded_for_long_calls() -> None:
    """A 10 s call: starts 30 ms apart are apart (together is at most TOGETHER_MAX_SECONDS)."""
    assert TOGETHER_MAX_SECONDS < 0.03
    assert start_at(10.0, [9.97], 10.0, 2, 0.0).at == 10.0
    assert start_at(10.0, [9.99], 10.0, 2, 0.0).at == pytest.approx(14.99)


@pytest.mark.parametrize("slots", [2, 3, 4, 8])
def test_slots_in_lock_step_are_spread_evenly_within_one_call(slots: int) -> None:
    """A lane's every slot taken at one instant by a burst, at a fixed call time, each freed slot
    started again as the lane would (its last ``slots`` starts remembered): no start waits a call
    time or more, and from the third round on no two starts are together."""
    call, first = 0.4, 100.0
    frees = [first + call] * slots  # a burst took every slot at once
    recent: deque[float] = deque([first] * slots, maxlen=slots)
    met: float | None = None
    starts: list[float] = []
    for _ in range(slots * 8):
        free = heapq.heappop(frees)
        start = start_at(free, recent, call, slots, met)
        assert free <= start.at < free + call
        recent.append(start.at)
        met = start.met
        starts.append(start.at)
        heapq.heappush(frees, start.at + call)
    later = sorted(s for s in starts if s >= first + 3 * call)
    assert later and min(b - a for a, b in itertools.pairwise(later)) >= 0.02, later


def test_varying_call_times_that_meet_once_are_let_through() -> None:
    """Two slots meeting once (call times vary) and not a call later: neither start waits."""
    first = start_at(10.0, [9.995], 0.4, 2, None)
    assert first == Start(10.0, 10.0)
    later = start_at(10.4, [10.0, 10.25], 0.4, 2, first.met)
    assert later == Start(10.4, 10.0)
