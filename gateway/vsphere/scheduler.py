"""Per-target scheduling of blocking pyVmomi work: fair slots, worker threads, deadlines, fan-out.

Each target is a bulkhead: a call holds its slot until its thread is done, even after the caller gave
up, so a hung target fills only its own slots. After ``breaker_threshold`` connection failures in a
row its calls fail fast with ``unreachable`` while one background probe backs off until one answers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from gateway import errors, tracing
from gateway.config import Target
from gateway.vsphere.lane import Caller, Lane, caller_var, queue_waits_var, shutting_down
from gateway.vsphere.pool import SessionPool, VSphereSession

if TYPE_CHECKING:
    from gateway.store.slots import SlotLimiter

log = logging.getLogger(__name__)

T = TypeVar("T")

BREAKER_THRESHOLD = 3
"""Connection failures in a row that open a target's breaker."""
PROBE_SECONDS = 5.0
"""First wait before probing an open breaker; doubled after each failed probe up to ``MAX_PROBE_SECONDS``."""
MAX_PROBE_SECONDS = 60.0


def is_connection_failure(error: BaseException | None) -> bool:
    """Whether a call's error says the target could not be talked to: ``unreachable``, or a ``timeout``
    caused by the socket (a vSphere task past its deadline is an answer, not a connection failure)."""
    if isinstance(error, errors.Unreachable):
        return True
    return isinstance(error, errors.Timeout) and isinstance(error.__cause__, OSError)

_CLOSE_SECONDS = 6.0
"""How long ``close`` waits for all pools together (each bounds its own logouts)."""


class _Workers:
    """A fixed set of daemon threads serving one target's calls in submission order.

    Not a ``ThreadPoolExecutor``: its threads are joined at interpreter exit, so one call hung in a
    socket read on a dead vCenter would hold up the gateway's shutdown until that socket timed out.
    """

    def __init__(self, count: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue())
        self._count = count
        self._name = name
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue ``fn``; RuntimeError after ``shutdown``."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("workers shut down")
            if not self._started:
                self._started = True
                for index in range(self._count):
                    threading.Thread(target=self._serve, name=f"{self._name}-{index}", daemon=True).start()
            self._jobs.put((future, fn))
        return future

    def shutdown(self) -> None:
        """Cancel queued calls and let each thread end after its current call."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
            for _ in range(self._count):
                self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn = job
            del job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, fn


class _Breaker:
    """One target's circuit breaker: closed, open (failing fast, a probe waiting) or probing.

    Shared by the event loop (``check``, ``record``) and the probe thread, hence the lock.
    """

    def __init__(self, name: str, probe: Callable[[], object], *, threshold: int, probe_seconds: float,
                 max_probe_seconds: float, stopping: threading.Event) -> None:
        self.name = name
        self._probe = probe
        self._threshold = threshold
        self._first_wait = probe_seconds
        self._max_wait = max(max_probe_seconds, probe_seconds)
        self._stopping = stopping
        self._lock = threading.Lock()
        self.state = "closed"
        self.failures = 0
        self._wait = probe_seconds
        self._probe_at = 0.0

    def retry_after(self) -> float:
        with self._lock:
            if self.state == "closed":
                return 0.0
            return round(max(self._probe_at - time.monotonic(), 1.0), 1)

    def check(self) -> None:
        """Raise the fail-fast ``Unreachable`` while the breaker is open or probing."""
        if self.state == "closed":
            return
        wait = self.retry_after()
        raise errors.Unreachable(
            f"target '{self.name}': {self.failures} connection attempts in a row failed, so calls fail fast "
            f"until a background probe reaches it again; retry in {wait:g}s, and check the target's health "
            "and the network path to it", target=self.name, circuit="open", retry_after_seconds=wait)

    def record(self, error: BaseException | None) -> None:
        """Count a finished call: a connection failure (``error``), or an answer (None or another error)."""
        failed = is_connection_failure(error)  # else the target answered (a fault, a refusal)
        with self._lock:
            if not failed:
                if self.state == "closed":
                    self.failures = 0
                return
            self.failures += 1
            if self.state != "closed" or self.failures < self._threshold:
                return
            self.state = "open"
            self._wait = self._first_wait
            self._probe_at = time.monotonic() + self._wait
        log.warning("target %s: %d connection failures in a row; failing fast and probing it every %gs or "
                    "more", self.name, self.failures, self._first_wait)
        threading.Thread(target=self._probe_until_closed, name=f"vsphere-probe-{self.name}",
                         daemon=True).start()

    def snapshot(self) -> dict[str, Any]:
        retry = self.retry_after()
        with self._lock:
            return {"state": self.state, "consecutive_failures": self.failures, "retry_after_seconds": retry}

    def _probe_until_closed(self) -> None:
        while True:
            with self._lock:
                delay = self._probe_at - time.monotonic()
            if self._stopping.wait(max(delay, 0.0)):
                return
            with self._lock:
                self.state = "probing"
            try:
                self._probe()
            except Exception as exc:
                with self._lock:
                    self.state = "open"
                    self._wait = min(self._wait * 2, self._max_wait)
                    self._probe_at = time.monotonic() + self._wait
                log.info("target %s: probe failed (%s); next probe in %gs", self.name, type(exc).__name__,
                         self._wait)
                continue
            with self._lock:
                self.state, self.failures = "closed", 0
            log.warning("target %s: probe answered; calls go through again", self.name)
            return


class Scheduler:
    """Runs blocking vSphere work per target: fair slots, bulkheaded threads, deadlines, fan-out."""

    def __init__(self, targets: Sequence[Target], credentials: Mapping[str, str], *,
                 queue_timeout: float = 300.0, breaker_threshold: int = BREAKER_THRESHOLD,
                 probe_seconds: float = PROBE_SECONDS, max_probe_seconds: float = MAX_PROBE_SECONDS,
                 slots: SlotLimiter | None = None) -> None:
        self._targets = tuple(targets)
        #: with replicas on one database: a target's ``pool_size`` bounds all of them together
        self._slots = slots
        self._by_name = {t.name: t for t in self._targets}
        self._credentials = credentials
        self.queue_timeout = queue_timeout
        self._lanes = {t.name: Lane(t) for t in self._targets}
        self._workers = {t.name: _Workers(t.pool_size, f"vsphere-{t.name}") for t in self._targets}
        self._pools: dict[str, SessionPool] = {}
        self._pools_lock = threading.Lock()
        self._stopping = threading.Event()
        self._breakers = {
            t.name: _Breaker(t.name, self._prober(t.name), threshold=breaker_threshold,
                             probe_seconds=probe_seconds, max_probe_seconds=max_probe_seconds,
                             stopping=self._stopping)
            for t in self._targets}

    def _prober(self, name: str) -> Callable[[], object]:
        """One login (when no session is open) and one call on ``name``, on the probe's own thread."""
        return lambda: self.pool(name).run(lambda session: session.si.CurrentTime())

    def breakers(self) -> dict[str, dict[str, Any]]:
        """Per target: breaker ``state`` (closed, open, probing), ``consecutive_failures``,
        ``retry_after_seconds`` (0 when closed)."""
        return {name: breaker.snapshot() for name, breaker in self._breakers.items()}

    @property
    def targets(self) -> tuple[Target, ...]:
        return self._targets

    def target(self, name: str) -> Target:
        """The target called ``name``; ``NotFound`` listing the known names otherwise."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name)) or "none configured"
            raise errors.NotFound(f"unknown target '{name}'; known targets: {known}", target=name) from None

    def pool(self, name: str) -> SessionPool:
        """The session pool of ``name``, built on first use; ``ConfigError`` if credentials are missing."""
        target = self.target(name)
        with self._pools_lock:
            pool = self._pools.get(name)
            if pool is None:
                pool = self._pools[name] = SessionPool(target, target.credentials(self._credentials))
            return pool

    async def run(self, target: str, fn: Callable[[VSphereSession], T], *,
                  deadline: float | None = None, caller: Caller | None = None, bounded: bool = True) -> T:
        """Run ``fn`` with a session of ``target`` on that target's worker threads; return its result.

        Calls on one target wait for one of its ``pool_size`` slots, served round-robin among callers
        (``caller``, by default the tool call's ``caller_var``) and in arrival order within one; a
        caller with ``max_queued_per_caller`` calls waiting is refused at once (``Busy``), a wait longer
        than ``queue_timeout`` raises ``QueueTimeout``; ``bounded=False`` (a change's execution, admitted
        when it was planned) is never refused as busy. ``deadline`` (seconds) bounds the whole call,
        queueing included, and raises ``Timeout``; a worker thread stuck in a hung vSphere call keeps
        its slot until its socket times out, but neither the caller nor other targets wait for it.
        """
        lane = self._lanes[self.target(target).name]
        workers = self._workers[target]
        breaker = self._breakers[target]
        try:
            breaker.check()
        except errors.Unreachable:
            lane.count_refusal("circuit_open")
            raise
        pool = self.pool(target)
        started = time.monotonic()
        wait = self.queue_timeout if deadline is None else min(self.queue_timeout, deadline)
        try:
            who = caller_var.get() if caller is None else caller
            with tracing.span("gateway.queue_wait", **{"vsphere.target": target}):
                granted = await lane.acquire(wait, who, bounded=bounded)
        except errors.Unreachable:
            lane.count_refusal("shutting_down")
            raise
        waits = queue_waits_var.get()
        if waits is not None:  # the tool call's rows say how long it queued (``lane.queue_wait_ms``)
            waits.append(time.monotonic() - started)
        if not granted:
            error = self._wait_error(lane, deadline)
            lane.count_refusal("deadline" if isinstance(error, errors.Timeout) else "queue_timeout")
            raise error
        try:
            work = workers.submit(tracing.in_context(lambda: self._in_slot(target, pool, fn, wait)))
        except RuntimeError:  # the workers were shut down between the grant and now
            lane.release()
            raise shutting_down(target) from None
        held = time.monotonic()

        def finished(done: concurrent.futures.Future[T]) -> None:
            lane.release(time.monotonic() - held)
            breaker.record(None if done.cancelled() else done.exception())

        work.add_done_callback(finished)
        remaining = None if deadline is None else deadline - (time.monotonic() - started)
        scope = asyncio.timeout(remaining)
        try:
            async with scope:
                return await asyncio.wrap_future(work)
        except TimeoutError:
            if not scope.expired():
                raise
            raise errors.Timeout(
                f"target '{target}': no result within the {deadline:g}s deadline; the target is slow or "
                "hung: check its health, or retry with a narrower request", target=target) from None

    def _in_slot(self, target: str, pool: SessionPool, fn: Callable[[VSphereSession], T], wait: float) -> T:
        """``pool.run(fn)`` holding one of the target's slots shared by every replica, when there are any
        (on a worker thread: after this replica's own fair slot, so its order holds)."""
        if self._slots is None:
            return pool.run(fn)
        slot = self._slots.acquire(target, self.target(target).pool_size, wait)
        try:
            return pool.run(fn)
        finally:
            self._slots.release(slot)

    async def fan_out(self, targets: Sequence[str], fn: Callable[[VSphereSession], T], *,
                      deadline: float) -> dict[str, dict[str, Any]]:
        """Run ``fn`` on every named target at once, each bounded by ``deadline`` seconds.

        Returns ``{name: {"ok": result}}`` or ``{name: {"error": {"code", "message", ...}}}`` per target,
        in the order given (duplicates once). An unknown name raises ``NotFound`` before anything runs.
        """
        names = list(dict.fromkeys(targets))
        for name in names:
            self.target(name)
        outcomes = await asyncio.gather(*(self._settle(name, fn, deadline) for name in names))
        return dict(zip(names, outcomes, strict=True))

    def queue_stats(self) -> dict[str, dict[str, Any]]:
        """Per target: the queue wait histogram and the calls refused by reason (``Lane.snapshot``)."""
        return {name: lane.snapshot() for name, lane in self._lanes.items()}

    def stats(self) -> dict[str, dict[str, int]]:
        """Per target: calls queued and running, slots, sessions open and lent out, logins and re-logins."""
        with self._pools_lock:
            pools = dict(self._pools)
        result: dict[str, dict[str, int]] = {}
        for name, lane in self._lanes.items():
            pool = pools.get(name)
            sessions = pool.stats if pool is not None else None
            breaker = self._breakers[name]
            result[name] = {
                "circuit_open": int(breaker.state != "closed"),
                "consecutive_failures": breaker.failures,
                "queued": lane.queued,
                "running": lane.running,
                "slots": lane.capacity,
                "sessions": sessions.size if sessions else 0,
                "in_use": sessions.in_use if sessions else 0,
                "logins": sessions.logins if sessions else 0,
                "relogins": sessions.relogins if sessions else 0,
            }
        return result

    def close(self) -> None:
        """Refuse new calls, fail queued ones, and log out every pool (bounded; running calls finish)."""
        self._stopping.set()
        for lane in self._lanes.values():
            lane.close()
        for workers in self._workers.values():
            workers.shutdown()
        with self._pools_lock:
            pools = list(self._pools.values())
        closers = [threading.Thread(target=p.close, daemon=True, name=f"vsphere-close-{p.target.name}")
                   for p in pools]
        for closer in closers:
            closer.start()
        deadline = time.monotonic() + _CLOSE_SECONDS
        for closer in closers:
            closer.join(max(0.0, deadline - time.monotonic()))
        if self._slots is not None:
            self._slots.close()  # idle slot connections; held ones close with their calls' threads

    async def _settle(self, name: str, fn: Callable[[VSphereSession], T], deadline: float) -> dict[str, Any]:
        try:
            return {"ok": await self.run(name, fn, deadline=deadline)}
        except errors.GatewayError as exc:
            return {"error": exc.to_wire()}
        except Exception:
            log.exception("target %s: unexpected error in a fan-out call", name)
            message = f"target '{name}': internal error; see the gateway log"
            return {"error": {"code": "internal", "message": message}}

    def _wait_error(self, lane: Lane, deadline: float | None) -> errors.GatewayError:
        name = lane.target.name
        busy = f"all {lane.capacity} slots busy, {lane.queued} more calls queued"
        if deadline is not None and deadline < self.queue_timeout:
            return errors.Timeout(
                f"target '{name}': the {deadline:g}s deadline passed while waiting for a slot ({busy}); the "
                "target is slow or overloaded: retry later or raise its 'pool_size'", target=name)
        return errors.QueueTimeout(
            f"target '{name}': waited {self.queue_timeout:g}s for a slot ({busy}); the target is slow or "
            "overloaded: retry later or raise its 'pool_size'", target=name)
