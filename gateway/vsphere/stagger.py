"""When the next call on a target's lane starts: at once, unless it would start together with another.

Pure. At fixed call times a lane's slots fall into lock step (all free at one instant, all taken
again), so a caller arriving in between waits for the whole lane. One meeting of starts is let
through; a meeting again about one call time later is lock step, and that start moves to ``spacing``
after a clear start. The lane holds the slot for the wait (less than one call time).
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
