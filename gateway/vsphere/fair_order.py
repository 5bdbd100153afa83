"""Who is served next in one target's lane: deficit round-robin by call over per-caller queues. Pure.

A caller earns its ``weight`` in credit each turn and spends one per call; one whose queue empties
loses its credit (no saving up while idle). So a caller's burst only delays that caller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

Item = TypeVar("Item")

DEFAULT_WEIGHT: Final = 1.0
#: the smallest and largest ``queue_weight`` a role may have (roles.yaml is parsed against these)
MIN_WEIGHT: Final = 0.1
MAX_WEIGHT: Final = 100.0


@dataclass
class _Caller(Generic[Item]):
    weight: float
    waiting: deque[Item] = field(default_factory=deque)
    credit: float = 0.0


class FairOrder(Generic[Item]):
    """Per-caller FIFO queues served deficit round-robin by call (see the module docstring)."""

    def __init__(self) -> None:
        self._callers: dict[Hashable, _Caller[Item]] = {}
        self._ring: deque[Hashable] = deque()
        #: whether the caller at the head of the ring has been given its credit for this turn
        self._turn_started = False

    def __len__(self) -> int:
        return sum(len(c.waiting) for c in self._callers.values())

    def depth(self, caller: Hashable) -> int:
        """How many items ``caller`` has waiting."""
        found = self._callers.get(caller)
        return 0 if found is None else len(found.waiting)

    def callers(self) -> int:
        """How many callers have something waiting."""
        return len(self._ring)

    def push(self, caller: Hashable, item: Item, weight: float = DEFAULT_WEIGHT) -> None:
        """Queue ``item`` behind ``caller``'s earlier items; a new caller joins the back of the ring.
        ``weight`` (> 0) is the caller's latest: a changed role weight counts from its next turn."""
        if not weight > 0:
            raise ValueError("a queue weight is positive")
        found = self._callers.get(caller)
        if found is None:
            found = self._callers[caller] = _Caller(weight)
            self._ring.append(caller)
        found.weight = weight
        found.waiting.append(item)

    def pop(self) -> Item | None:
        """The next item to serve (removed), or None when nothing waits."""
        while self._ring:
            key = self._ring[0]
            caller = self._callers[key]
            if not self._turn_started:
                caller.credit += caller.weight
                self._turn_started = True
            if caller.credit >= 1.0:
                caller.credit -= 1.0
                item = caller.waiting.popleft()
                if not caller.waiting:
                    self._leave(key)
                return item
            self._ring.rotate(-1)  # its turn is over; the credit it has left counts next turn
            self._turn_started = False
        return None

    def remove(self, caller: Hashable, item: Item) -> bool:
        """Take out ``item`` (a waiter that gave up); False if it is not waiting."""
        found = self._callers.get(caller)
        if found is None:
            return False
        try:
            found.waiting.remove(item)
        except ValueError:
            return False
        if not found.waiting:
            self._leave(caller)
        return True

    def drain(self) -> list[Item]:
        """Every item waiting (ring order, each caller's FIFO), leaving nothing."""
        items = [item for key in self._ring for item in self._callers[key].waiting]
        self._callers.clear()
        self._ring.clear()
        self._turn_started = False
        return items

    def _leave(self, key: Hashable) -> None:
        if self._ring and self._ring[0] == key:
            self._turn_started = False
        self._ring.remove(key)
        del self._callers[key]
