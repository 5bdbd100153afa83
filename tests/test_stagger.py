"""When a lane's next call starts (``gateway.vsphere.stagger``): table tests with plain values."""

from __future__ import annotations

import pytest

from gateway.vsphere.stagger import TOGETHER_MAX_SECONDS, start_at


@pytest.mark.parametrize(("now", "starts", "call", "slots", "expected"), [
    # nothing started lately, or the last start well apart: at once
    (10.0, [], 0.4, 2, 10.0),
    (10.0, [9.8], 0.4, 2, 10.0),
    (10.0, [9.6, 9.8], 0.4, 2, 10.0),
    # lock step: the other slot was taken 2 ms ago, so this one starts half a call after it
    (10.0, [9.998], 0.4, 2, 9.998 + 0.2),
    # a start already scheduled counts as well (it is what made the slot wait)
    (10.0, [10.2], 0.4, 2, 10.0),
    # four slots freeing together: each start a quarter call after the one before, none on another
    (10.0, [10.0], 0.4, 4, 10.1),
    (10.0, [10.0, 10.1], 0.4, 4, 10.2),
    (10.0, [10.0, 10.1, 10.2], 0.4, 4, 10.3),
    # one slot: nothing to spread; no call time measured yet: nothing to spread by
    (10.0, [9.999], 0.4, 1, 10.0),
    (10.0, [9.999], 0.0, 2, 10.0),
    # short calls: "together" is a fraction of a call (5% of 20 ms = 1 ms); 2 ms apart is apart
    (10.0, [9.998], 0.02, 2, 10.0),
    (10.0, [9.9995], 0.02, 2, 9.9995 + 0.01),
], ids=["idle", "apart", "apart-both", "lock-step", "scheduled-apart", "four-1", "four-2", "four-3",
        "one-slot", "no-call-time", "short-apart", "short-together"])
def test_start_at(now: float, starts: list[float], call: float, slots: int, expected: float) -> None:
    assert start_at(now, starts, call, slots) == pytest.approx(expected)


def test_together_is_bounded_for_long_calls() -> None:
    """A 10 s call: starts 30 ms apart are apart (together is at most TOGETHER_MAX_SECONDS)."""
    assert TOGETHER_MAX_SECONDS < 0.03
    assert start_at(10.0, [9.97], 10.0, 2) == 10.0
    assert start_at(10.0, [9.99], 10.0, 2) == pytest.approx(14.99)


@pytest.mark.parametrize("slots", [2, 3, 4, 8])
def test_a_start_is_never_later_than_one_call_and_never_together(slots: int) -> None:
    """Every slot of a lane freeing at one instant: each start waits less than one call time, and
    no two starts are together."""
    call, now, starts = 0.4, 100.0, [100.0]
    for _ in range(slots - 1):
        at = start_at(now, starts, call, slots)
        assert now <= at < now + call
        assert all(abs(at - s) >= 0.02 for s in starts)
        starts.append(at)
    assert sorted(starts) == pytest.approx([now + i * call / slots for i in range(slots)])
