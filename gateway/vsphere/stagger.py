"""When the next call on a target's lane starts: at once, unless it would start together with another.

Pure (no threads, no clock, no I/O): ``start_at`` takes the time now and the lane's recent call
starts (those already made and those already scheduled) and names when the next call starts.

Why: at fixed call times a lane's slots fall into lock step. A burst that takes every slot at once
frees them all at the same instant, they are all taken again at that instant, and so on call after
call: a caller arriving in between waits for the whole lane to come round, half a call on average,
where slots freeing one after another would have let it in after ``1 / pool_size`` of that. Real
targets' call times vary and break the lock step themselves; a simulator's fixed delays, or a target
answering one kind of call at a steady pace, keep it forever.

A start within ``together`` seconds of another (a small fraction of the call time) is a meeting.
One meeting is let through: varying call times make one now and then, and the next call's spread
undoes it. A meeting again about one call time after the last one let through (half to one and a
half call times: the same slots freed together again) is lock step: that start, and every other
start that meets one while that memory lasts, is moved to the first moment ``spacing`` (the call
time over the slot count) after one of the recent starts that is clear of all of them. The lane
holds the slot for the wait (nobody else takes it; the wait is less than one call time), and from
then on its slots free one after another. One slot, or no call time measured yet: at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

#: two starts closer than this fraction of the call time count as together ...
TOGETHER_FRACTION: Final = 0.05
#: ... and never more than this many seconds apart
TOGETHER_MAX_SECONDS: Final = 0.025
#: a meeting this many call times after the last one let through is lock step
AGAIN_WITHIN: Final = (0.5, 1.5)


@dataclass(frozen=True)
class Start:
    """When the next call starts (``at``), and the meeting let through that the lane remembers for the
    next start (``met``: this one, or the one from before)."""

    at: float
    met: float | None


def start_at(now: float, starts: Iterable[float], call_seconds: float, capacity: int,
             met: float | None = None) -> Start:
    """When the next call starts (``now`` or later): ``starts`` are the lane's recent starts (past
    and scheduled), ``call_seconds`` its average call time, ``capacity`` its slots, ``met`` the last
    meeting let through (``Start.met`` of the start before)."""
    if capacity < 2 or call_seconds <= 0:
        return Start(now, met)
    recent = sorted(starts)
    together = min(TOGETHER_FRACTION * call_seconds, TOGETHER_MAX_SECONDS)
    spacing = call_seconds / capacity

    def clear(moment: float) -> bool:
        return all(abs(moment - start) >= together for start in recent)

    if clear(now):
        return Start(now, met)
    low, high = AGAIN_WITHIN
    if met is None or not low * call_seconds <= now - met <= high * call_seconds:
        return Start(now, now)  # a meeting: let through, remembered
    later = (start + spacing for start in recent)
    return Start(next((moment for moment in later if moment > now and clear(moment)), now), met)
