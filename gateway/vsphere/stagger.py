"""When the next call on a target's lane starts: at once, unless it would start together with another.

Pure (no threads, no clock, no I/O): ``start_at`` takes the time now and the lane's recent call
starts (those already made and those already scheduled) and names when the next call starts.

Why: at fixed call times a lane's slots fall into lock step. A burst that takes every slot at once
frees them all at the same instant, they are all taken again at that instant, and so on call after
call: a caller arriving in between waits for the whole lane to come round, half a call on average,
where slots freeing one after another would have let it in after ``1 / pool_size`` of that. Real
targets' call times vary and break the lock step themselves (a few percent of starts are ever
together); a simulator's fixed delays, or a target answering one kind of call at a steady pace, keep
it forever.

So a start within ``together`` seconds of another start (a small fraction of the call time) is moved
to the first moment ``spacing`` (the call time over the slot count) after one of the recent starts
that is clear of all of them. The lane holds that slot for the wait (nobody else takes it; the wait
is bounded by one call time), and from then on its slots free one after another. One slot, or no
call time measured yet: at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

#: two starts closer than this fraction of the call time count as together ...
TOGETHER_FRACTION: Final = 0.05
#: ... and never more than this many seconds apart
TOGETHER_MAX_SECONDS: Final = 0.025


def start_at(now: float, starts: Iterable[float], call_seconds: float, capacity: int) -> float:
    """When the next call starts (``now`` or later): ``starts`` are the lane's recent starts (past
    and scheduled), ``call_seconds`` its average call time, ``capacity`` its slots."""
    if capacity < 2 or call_seconds <= 0:
        return now
    recent = sorted(starts)
    together = min(TOGETHER_FRACTION * call_seconds, TOGETHER_MAX_SECONDS)
    spacing = call_seconds / capacity

    def clear(moment: float) -> bool:
        return all(abs(moment - start) >= together for start in recent)

    if clear(now):
        return now
    later = (start + spacing for start in recent)
    return next((moment for moment in later if moment > now and clear(moment)), now)
