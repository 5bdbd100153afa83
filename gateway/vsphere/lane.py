"""One target's lane: its ``pool_size`` slots, handed out fairly among callers, and its admission.

A freed slot goes to the next waiter in fair order (``fair_order``), so a newcomer never overtakes a
waiter; when the slots are in lock step (``stagger``) it stays reserved until the start given. A
caller with ``max_queued_per_caller`` calls waiting is refused at once with ``Busy``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import contextvars
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from gateway import errors
from gateway.config import Target
from gateway.vsphere import stagger
from gateway.vsphere.fair_order import DEFAULT_WEIGHT, FairOrder


@dataclass(frozen=True)
class Caller:
    """Who a vSphere call queues as: ``key``, the fair-queue share (a caller key's text form, from
    ``gateway.auth.fair_share.share_of``, never a display name), and its role's queue weight."""

    key: str
    weight: float = DEFAULT_WEIGHT


#: calls made outside a tool call (none today but the tests') queue as one caller (no caller key's
#: text form is "-": they all start with their namespace)
NOBODY: Final = Caller("-")
#: the caller of the tool call in progress (``gateway.server.call.arrival`` sets it for each call)
caller_var: contextvars.ContextVar[Caller] = contextvars.ContextVar("queue_caller", default=NOBODY)
#: seconds each vSphere call of the tool call in progress waited in its lane (``queue_as`` starts the
#: list, ``Scheduler.run`` appends; the call's audit rows carry the sum as ``queue_wait_ms``)
queue_waits_var: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("queue_waits",
                                                                                    default=None)



@contextlib.contextmanager
def queue_as(key: str, weight: float | None = None) -> Iterator[Caller]:
    """Every vSphere call made inside queues in share ``key`` with ``weight`` (entry points use
    ``gateway.auth.fair_share.queue_for``; a caller without a role's ``queue_weight`` weighs
    ``DEFAULT_WEIGHT``)."""
    caller = Caller(key, DEFAULT_WEIGHT if weight is None else weight)
    token, waits = caller_var.set(caller), queue_waits_var.set([])
    try:
        yield caller
    finally:
        queue_waits_var.reset(waits)
        caller_var.reset(token)


def queue_wait_ms() -> float | None:
    """How long the vSphere calls of the tool call in progress waited for a slot so far (ms), summed;
    None when none queued (answered from the mirror, or refused first)."""
    waits = queue_waits_var.get()
    return round(sum(waits) * 1000, 2) if waits else None


#: upper bounds (seconds) of the queue wait histogram's buckets
WAIT_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: why a lane refused a call: a caller over its bound, a wait past the queue timeout or the caller's
#: deadline, an open circuit breaker, a gateway shutting down
ADMISSION_REFUSALS: Final = ("busy", "queue_timeout", "deadline", "circuit_open", "shutting_down")
#: weight of the newest call time in the lane's moving average (for ``retry_after_seconds``)
_CALL_TIME_WEIGHT: Final = 0.2


@dataclass(eq=False)
class _Waiter:
    caller: str
    future: asyncio.Future[None]
    since: float = field(default_factory=time.monotonic)


class Lane:
    """One target's slots, fair queue and admission; shared by the event loop and the worker threads
    (which release slots), hence the lock. ``running`` counts slots taken."""

    #: whether starts together with another are moved apart (``stagger``); bench/fairness.py turns it
    #: off for its comparison arm
    spread_starts = True

    def __init__(self, target: Target) -> None:
        self.target = target
        self.capacity = target.pool_size
        self.running = 0
        self.closed = False
        self._order: FairOrder[_Waiter] = FairOrder()
        self._lock = threading.Lock()
        self._call_seconds = 0.0
        self.refused = dict.fromkeys(ADMISSION_REFUSALS, 0)
        self.wait_counts = [0] * (len(WAIT_BUCKETS) + 1)  # the last: over every bound
        self.wait_sum = 0.0
        #: the lane's latest call starts (made or scheduled), for ``stagger.start_at``
        self._starts: deque[float] = deque(maxlen=max(1, self.capacity))
        #: the last start let through together with another (``stagger.Start.met``)
        self._met: float | None = None
        #: starts moved apart from another (``stagger``)
        self.staggered = 0

    @property
    def queued(self) -> int:
        with self._lock:
            return len(self._order)

    def queued_by(self, caller: str) -> int:
        with self._lock:
            return self._order.depth(caller)

    async def acquire(self, timeout: float, caller: Caller, *, bounded: bool = True) -> bool:
        """A slot for ``caller``, in fair order; False if none came within ``timeout`` seconds;
        ``Busy`` at once when ``caller`` already has its bound of calls waiting here (unless not
        ``bounded``: a change's execution, admitted when it was planned)."""
        with self._lock:
            if self.closed:
                raise shutting_down(self.target.name)
            if self.running < self.capacity and not len(self._order):
                self.running += 1
                self._starts.append(time.monotonic())
                self._observe_wait(0.0)
                return True
            if bounded and self._order.depth(caller.key) >= self.target.max_queued_per_caller:
                self.refused["busy"] += 1
                raise self._busy(caller)
            waiter = _Waiter(caller.key, asyncio.get_running_loop().create_future())
            self._order.push(caller.key, waiter, caller.weight)
        try:
            async with asyncio.timeout(timeout):
                await waiter.future
        except TimeoutError:
            self._abandon(waiter)
            return False
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        return True

    def count_refusal(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1

    def release(self, held_seconds: float | None = None) -> None:
        """Give a slot back: to the next waiter in fair order if there is one, at once or, when that
        would start it together with another call, a little later (``stagger``). Any thread."""
        with self._lock:
            if held_seconds is not None:
                self._call_seconds += (held_seconds - self._call_seconds) * _CALL_TIME_WEIGHT
            if self.spread_starts and len(self._order) and not self.closed:
                now = time.monotonic()
                start = stagger.start_at(now, self._starts, self._call_seconds, self.capacity, self._met)
                at, self._met = start.at, start.met
                self._starts.append(at)
                if at > now:  # the slot stays taken until then: nobody else can start with the others
                    self.staggered += 1
                    timer = threading.Timer(at - now, self._pass_on)
                    timer.daemon = True
                    timer.start()
                    return
            self._grant_next()

    def _pass_on(self) -> None:
        """Give a taken slot to the next waiter at once (no stagger), or free it. Any thread."""
        with self._lock:
            self._grant_next()

    def _grant_next(self) -> None:  # under the lock
        while (waiter := self._order.pop()) is not None:
            try:
                waiter.future.get_loop().call_soon_threadsafe(self._hand_over, waiter)
                return
            except RuntimeError:  # that waiter's event loop is closed; it will never run
                continue
        self.running -= 1

    def close(self) -> None:
        """Refuse new calls and fail queued ones."""
        with self._lock:
            self.closed = True
            waiters = self._order.drain()
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                waiter.future.get_loop().call_soon_threadsafe(self._fail, waiter)

    def snapshot(self) -> dict[str, Any]:
        """The wait histogram (cumulative counts per ``WAIT_BUCKETS`` bound, then +Inf), its sum, the
        refusals by reason, and the starts moved apart (``staggered``)."""
        with self._lock:
            counts, total, refused = list(self.wait_counts), self.wait_sum, dict(self.refused)
            staggered = self.staggered
        cumulative, running = [], 0
        for count in counts:
            running += count
            cumulative.append(running)
        return {"wait_buckets": cumulative, "wait_sum": total, "refused": refused, "staggered": staggered}

    def _busy(self, caller: Caller) -> errors.Busy:
        waiting = self._order.depth(caller.key)
        retry = max(1.0, self._call_seconds * (waiting + 1) / self.capacity)
        return errors.Busy(
            f"target '{self.target.name}': you already have {waiting} calls waiting for its "
            f"{self.capacity} slots (at most {self.target.max_queued_per_caller} per caller); this call was "
            f"not queued. Wait for your calls to finish (retry in {retry:.1f}s), or send fewer at once",
            target=self.target.name, retry_after=retry)

    def _observe_wait(self, seconds: float) -> None:  # under the lock
        self.wait_counts[bisect.bisect_left(WAIT_BUCKETS, seconds)] += 1
        self.wait_sum += seconds

    def _hand_over(self, waiter: _Waiter) -> None:
        if waiter.future.done():  # its caller gave up after the slot was already on its way: pass it on
            self._pass_on()
            return
        with self._lock:
            self._observe_wait(time.monotonic() - waiter.since)
        waiter.future.set_result(None)

    def _abandon(self, waiter: _Waiter) -> None:
        with self._lock:
            if self._order.remove(waiter.caller, waiter):
                return
        # Already granted: if the grant landed, the slot is ours to give back; if it is still on its
        # way, _hand_over will see the cancelled waiter and give it back itself.
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            self.release()

    def _fail(self, waiter: _Waiter) -> None:
        if not waiter.future.done():
            waiter.future.set_exception(shutting_down(self.target.name))


def shutting_down(name: str) -> errors.Unreachable:
    return errors.Unreachable(f"target '{name}': the gateway is shutting down; retry on another instance",
                              target=name)
