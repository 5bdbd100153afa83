"""A live inventory mirror per target: one PropertyCollector filter kept current by ``WaitForUpdatesEx``.

- Why: a swept listing costs the whole inventory's SOAP per call; a mirror reads it once, then changes.
- One daemon thread per target on a session of its own; any error, expiry or restart of the target
  means a full resync, and while not synced reads sweep.
- Fresh by default: a read first asks for one zero-wait poll and answers from the state after it, so
  it is at least as fresh as a sweep started then (``max_staleness_seconds`` skips the poll).
- Never mixed: ``Mirrors.answer`` is a whole answer from one state, or ``None`` and the caller sweeps.
  Writes and confirm-time resolution always read live.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyVmomi import vim, vmodl
from pyVmomi.SoapAdapter import SoapResponseDeserializer

from gateway import errors, tracing
from gateway.answer import Answer
from gateway.config import Target
from gateway.vsphere import collector, details, listings, mirror_check, soap_scan
from gateway.vsphere.mirror_check import CONTROL_TYPES, Marker, Schedule
from gateway.vsphere.pool import SessionPool, VSphereSession
from gateway.vsphere.soap_scan import ObjectProps

log = logging.getLogger(__name__)

PC: Any = vmodl.query.PropertyCollector
_Deserializer: Any = SoapResponseDeserializer

LONG_WAIT_SECONDS = 10
"""The background wait for changes; a read interrupts it, so it only bounds idle round trips."""

MAX_OBJECT_UPDATES = 1000
"""``WaitOptions.maxObjectUpdates``: a larger reply (the first sync) comes truncated in parts, each
applied and dropped before the next is asked; the mirror answers only after the last part."""

SYNC_DEADLINE_SECONDS = 5.0
"""How long a read waits for its zero-wait poll before it gives up on the mirror and sweeps."""

LINGER_SECONDS = 1.0
"""After a read's poll, how long the loop waits for the next read's request before a long wait: reads
this close are one zero-wait poll each, no cancel of a long wait first. Each read still polls after it
came; only the lag /metrics shows may grow by this much."""

RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)
"""Back-off between attempts after an error (the last value repeats)."""

MAX_SHAPED_ANSWERS = 4
"""Answers kept per mirror until the inventory changes (distinct reads or arguments; oldest goes
first). Each holds its rows (about 0.7 MB per 1,000 VMs listed with every column)."""

_VM_PATHS = tuple(sorted({"name"} | {p for c in listings.VM_COLUMNS.values() for p in c.paths}
                         | {p for f in listings.VM_FILTERS.values() for p in f.paths}))

MIRRORED: dict[Any, tuple[str, ...]] = {
    vim.VirtualMachine: _VM_PATHS,
    vim.HostSystem: tuple(sorted({p for q in listings.LIST_HOSTS_QUERIES if q.type is vim.HostSystem
                                  for p in q.paths})),
    vim.ComputeResource: ("name",),
    vim.ClusterComputeResource: tuple(sorted({p for q in listings.LIST_CLUSTERS_QUERIES
                                              if q.type is vim.ClusterComputeResource for p in q.paths})),
    vim.ResourcePool: ("name",),
    vim.Folder: ("name", "parent"),
    vim.Datacenter: ("name", "parent"),
    vim.Datastore: tuple(sorted({p for q in listings.LIST_DATASTORES_QUERIES for p in q.paths})),
    vim.Network: ("name",),
}
"""Types and properties a mirror keeps: what list_vms (every column and filter), list_hosts,
list_clusters and list_datastores read, and the names their rows refer to. Clusters keep their
``configurationEx`` (DRS and HA settings) as the data object vSphere sends; everything else is scalar."""

_OTHER_TYPES = {t: p for t, p in MIRRORED.items() if t is not vim.VirtualMachine}
"""The mirrored types kept in the marker's filter; VMs have a filter of their own. govmomi's simulator
crashes the handler of a wait when a filter holds an update of an object it cannot look up (a VM
powered off then destroyed, a session's view) and lists a property spec of another type before the
object's own; with VMs alone in one filter and the marker's view first in the other it never has to.
Two filters, not one per type: the simulator recomputes every filter for every change it reports."""


@dataclass(frozen=True)
class MirrorStats:
    """One mirror's state for /metrics: ``state`` is off, idle, syncing, synced or unhealthy."""

    state: str
    objects: int
    version: str | None
    lag_seconds: float | None
    resyncs: int
    updates: int
    served: int
    swept: int
    last_error: str | None
    lookups: int = 0
    divergences: int = 0
    """Divergences found (a stream that did not deliver, or a comparison with a live read that differed)."""
    repairs: int = 0
    """Resyncs that repaired a divergence (equal to ``divergences`` once the mirror is synced again)."""
    checks: dict[str, int] = field(default_factory=dict)
    """Comparison rounds done, by kind (rolling, full)."""
    interrupts: int = 0
    """Long waits cancelled for a read's poll (reads close together find the loop lingering instead)."""


@dataclass(frozen=True)
class View:
    """What a read function sees: the mirrored objects, the root folder's moid, the target."""

    target: Target
    objects: Sequence[ObjectProps]
    root_folder: str


MirrorRead = Callable[[View, Mapping[str, Any]], dict[str, Any]]


@dataclass
class _Shaped:
    """One read's result over one state of the mirror, and its answer once a reader encoded it."""

    value: dict[str, Any]
    answer: Answer | None = None


class Mirror:
    """The mirror of one target (see the module docstring). Thread-safe; ``answer`` blocks."""

    def __init__(self, target: Target, pool: SessionPool, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        self._pool = pool
        self._clock = clock
        self._lock = threading.Condition()
        self._objects: dict[str, ObjectProps] = {}
        self._root: str | None = None
        self._version: str | None = None
        #: what is derived from ``_objects``, kept until they change (``_changed`` drops both): the
        #: shaped answers by (read, arguments), and the (type, name) -> moids index ``lookup`` reads
        self._answers: dict[tuple[MirrorRead, str], _Shaped] = {}
        self._names: dict[tuple[str, str], list[str]] | None = None
        self._lookups = 0
        self._synced = False
        self._healthy = False
        self._partial = False  # a batch of updates is applied in part: reads wait for its last part
        self._heard_at: float | None = None
        self._resyncs = 0
        self._updates = 0
        self._served = 0
        self._swept = 0
        self._last_error: str | None = None
        self._requested = 0
        self._polled = 0
        self._long_wait = False
        self._linger_until = 0.0  # until when the loop waits for reads, not changes (LINGER_SECONDS)
        self._interrupts = 0
        self._session: VSphereSession | None = None
        self._session_key: str | None = None
        self._filters: list[Any] = []
        self._view: Any = None
        # the self-check (loop thread only, except the counters under the lock)
        self._marker: Marker | None = None
        #: when a poll last brought back the marker's change (None: not since the last resync)
        self._proved_at: float | None = None
        self._schedule = Schedule(target.mirror_check_seconds, clock())
        self._tasks_seen: set[str] = set()
        self._tasks_running: set[str] = set()
        #: what applied updates left to read live (moid -> type), and the task list when it changed
        self._doubts: dict[str, str] = {}
        self._task_list: list[str] | None = None
        self._resync_wanted = False
        self._diverged = False
        self._divergences = 0
        self._repairs = 0
        self._checks = {"rolling": 0, "full": 0}
        self._thread: threading.Thread | None = None
        self._kicker: threading.Thread | None = None
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._started = False

    # ---------------------------------------------------------------- public

    def start(self) -> None:
        """Start the background threads (idempotent; no I/O on the caller's thread)."""
        with self._lock:
            if self._started or self._stop.is_set():
                return
            self._started = True
        name = f"mirror-{self.target.name}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._kicker = threading.Thread(target=self._kick_forever, name=f"{name}-kick", daemon=True)
        self._thread.start()
        self._kicker.start()

    def close(self) -> None:
        """Stop the threads (they end within one long wait) and log out."""
        self._stop.set()
        self._kick.set()
        self._cancel_wait()
        with self._lock:
            self._lock.notify_all()
        self._pool.close()

    @property
    def ready(self) -> bool:
        with self._lock:
            return self._synced and self._healthy

    def answer(self, read: MirrorRead, args: Mapping[str, Any], max_staleness: float | None,
               deadline: float = SYNC_DEADLINE_SECONDS) -> Answer | None:
        """``read`` over the mirrored state, brought up to date first, as the answer to send (encoded
        once per change of the inventory); None when the mirror cannot answer.

        Blocking (run it off the event loop). Errors ``read`` raises (bad arguments, NotFound) propagate.
        """
        self.start()
        age = self._age() if max_staleness is not None else None
        if age is None or age > (max_staleness or 0.0):
            if not self._sync(deadline):
                self._count(served=False)
                return None
            age = None
        with self._lock:
            self._lock.wait_for(lambda: not (self._partial and self._healthy) or self._stop.is_set(),
                                deadline)  # a batch in parts: answered after its last part
            if not (self._synced and self._healthy) or self._root is None or self._partial:
                self._swept += 1
                return None
            shaped = self._shaped(read, args)
            self._served += 1
            heard = self._heard_at
        if shaped.answer is None:  # encoded outside the lock; two readers at once may both encode it
            shaped.answer = Answer.cleaned(shaped.value)
        answer = shaped.answer.copy()  # a caller's changes to its value never reach the kept one
        if age is not None and heard is not None:
            return answer.with_field("mirror_age_seconds", round(max(0.0, self._clock() - heard), 3))
        return answer

    def _shaped(self, read: MirrorRead, args: Mapping[str, Any]) -> _Shaped:
        """``read`` over the mirrored objects, computed once per change of them (called with the lock).

        Agents polling the same listing find it already shaped (and, after the first, encoded) until
        the inventory changes: every applied update drops the kept answers, so an answer is never
        older than the mirror."""
        key = (read, json.dumps(args, sort_keys=True, default=str))
        shaped = self._answers.get(key)
        if shaped is None:
            assert self._root is not None
            shaped = _Shaped(read(View(self.target, list(self._objects.values()), self._root), args))
            if len(self._answers) >= MAX_SHAPED_ANSWERS:
                self._answers.pop(next(iter(self._answers)))
            self._answers[key] = shaped
        return shaped

    def lookup(self, vim_type: Any, ref: str) -> str | None:
        """The moid of the one ``vim_type`` object ``ref`` names in the mirror (a moid wins over names,
        as in a search), or None (not synced, unknown, or several objects carry that name).

        A hint for reads that then read the object live (``details.Lookup``): no freshness poll, as the
        live read checks the name; blocking on the lock, so called on a worker thread."""
        type_name = vim_type._wsdlName
        with self._lock:
            if not (self._synced and self._healthy):
                return None
            found = self._objects.get(ref)
            if found is not None:
                moid: str | None = ref if found.type == type_name else None
            else:
                if self._names is None:
                    self._names = {}
                    for obj in self._objects.values():
                        name = obj.props.get("name")
                        if isinstance(name, str):
                            self._names.setdefault((obj.type, name), []).append(obj.moid)
                moids = self._names.get((type_name, ref), [])
                moid = moids[0] if len(moids) == 1 else None
            self._lookups += moid is not None
            return moid

    def count_swept(self) -> None:
        self._count(served=False)

    def stats(self) -> MirrorStats:
        with self._lock:
            if not self._started:
                state = "idle"
            elif not self._healthy:
                state = "unhealthy" if self._last_error else "syncing"
            else:
                state = "synced" if self._synced else "syncing"
            lag = None if self._heard_at is None else max(0.0, self._clock() - self._heard_at)
            return MirrorStats(state, len(self._objects), self._version, lag, self._resyncs, self._updates,
                               self._served, self._swept, self._last_error, self._lookups,
                               self._divergences, self._repairs, dict(self._checks), self._interrupts)

    # ---------------------------------------------------------------- reads

    def _count(self, *, served: bool) -> None:
        with self._lock:
            if served:
                self._served += 1
            else:
                self._swept += 1

    def _age(self) -> float | None:
        with self._lock:
            if not (self._synced and self._healthy) or self._heard_at is None:
                return None
            return self._clock() - self._heard_at

    def _sync(self, deadline: float) -> bool:
        """Ask for one zero-wait poll and wait until one that started after this request completed."""
        end = self._clock() + deadline
        with self._lock:
            if not (self._synced and self._healthy):
                return False
            self._requested += 1
            wanted = self._requested
            self._lock.notify_all()  # a loop lingering for this request polls now
            waiting = self._long_wait
        if waiting:  # a loop in a long wait is interrupted (no long wait starts after this request)
            self._kick.set()
        with self._lock:
            while self._polled < wanted:
                if not (self._synced and self._healthy) or self._stop.is_set():
                    return False
                remaining = end - self._clock()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, 0.2))
                if self._polled < wanted and self._long_wait:
                    self._kick.set()  # the cancel may have reached the target before the wait did
            return True

    def _kick_forever(self) -> None:
        """Interrupt the long wait when a read asks for a poll (CancelWaitForUpdates, best effort)."""
        while not self._stop.is_set():
            self._kick.wait()
            self._kick.clear()
            if self._stop.is_set():
                return
            with self._lock:
                pending = self._requested > self._polled and self._long_wait
                self._interrupts += pending
            if pending:
                self._cancel_wait()

    def _cancel_wait(self) -> None:
        session = self._session
        if session is None:
            return
        try:
            session.content.propertyCollector.CancelWaitForUpdates()
        except vim.fault.NotAuthenticated:
            # The session is gone: the outstanding wait cannot be interrupted, so reads sweep until
            # the loop notices and resyncs on a new session.
            with self._lock:
                self._healthy = False
                self._last_error = "the mirror's session ended"
                self._lock.notify_all()
        except Exception as exc:  # best effort: the reader falls back to a sweep at its deadline
            log.debug("target %s: CancelWaitForUpdates failed: %s", self.target.name, type(exc).__name__)

    # ---------------------------------------------------------------- the loop

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._pool.run(self._step)
                failures = 0
            except Exception as exc:  # any failure: unhealthy, back off, start over with a full resync
                if self._stop.is_set():
                    return
                message = exc.message if isinstance(exc, errors.GatewayError) else type(exc).__name__
                # The first failure of a run is worth a warning; retries against a target that stays
                # down are not (they repeat every RETRY_SECONDS).
                log.log(logging.WARNING if failures == 0 else logging.DEBUG,
                        "target %s: mirror unhealthy (%s); reads sweep until it resyncs", self.target.name,
                        message)
                with self._lock:
                    self._healthy = False
                    self._last_error = message
                    self._session_key = None
                    self._lock.notify_all()
                self._stop.wait(RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)])
                failures += 1

    def _step(self, session: VSphereSession) -> None:
        """One round: (re)build the filter and resync if the session changed or the mirror diverged;
        else a proven zero-wait poll a read asked for, a comparison round that is due, or one wait: for
        the next read's request while reads come (``LINGER_SECONDS``), else for changes."""
        self._session = session
        if self._session_key != session.key or not self._filters or self._resync_wanted:
            self._resync(session)
            return
        with self._lock:
            wanted = self._requested
            zero = wanted > self._polled
        if zero:
            if self._poll(session, prove=self._proof_due()):
                self._linger_until = self._clock() + LINGER_SECONDS
            return
        due = self._schedule.due(self._clock())
        if due is not None:
            self._check(session, due)
            return
        now = self._clock()
        if now < self._linger_until:  # reads came lately: the next one polls without a cancel
            with self._lock:
                self._lock.wait_for(lambda: self._requested > wanted or self._stop.is_set(),
                                    min(self._linger_until - now, self._schedule.wait(now)))
            return
        wait = min(LONG_WAIT_SECONDS, max(1, int(self.target.timeout_seconds / 2)),
                   max(1, math.ceil(self._schedule.wait(self._clock()))))
        with self._lock:
            self._long_wait = self._requested == wanted
        if self._long_wait:
            self._poll(session, prove=False, wait=wait)

    def _poll(self, session: VSphereSession, *, prove: bool, wait: int = 0) -> bool:
        """One ``WaitForUpdatesEx`` applied, and what it names read live; False when it was cancelled
        or, with ``prove``, when it did not bring back the marker's change (the mirror diverged). Done,
        it is the poll of every read that asked before it began (a comparison round's, too)."""
        marker = self._marker
        assert marker is not None
        with self._lock:
            wanted = self._requested
        if prove:
            marker.change()
        applied = self._wait(session, wait)
        if applied is None:
            return False
        if prove and marker.outstanding:
            # one more look, in case the target had not yet queued the change for this poll
            again = self._wait(session, 0)
            if again is None:
                return False
            applied = again
        if prove and marker.outstanding:
            with self._lock:
                count = len(self._objects)
            self._diverge("its update stream did not deliver the mirror's own change", count)
            return False
        if prove:
            self._proved_at = self._clock()
        self._recheck(session)
        with self._lock:
            self._polled = max(self._polled, wanted)
            self._lock.notify_all()
        return True

    def _proof_due(self) -> bool:
        """Whether a read's poll must prove the stream (change the marker and see it come back): when
        no poll did since the last resync or within ``PROOF_SECONDS`` (comparison rounds prove it more
        often than that while they run)."""
        return self._proved_at is None or self._clock() - self._proved_at >= mirror_check.PROOF_SECONDS

    def _wait(self, session: VSphereSession, seconds: int) -> Applied | None:
        """One wait and its reply's other parts; None when cancelled (the next round continues)."""
        kinds: dict[str, set[str]] = {}
        while True:
            options = PC.WaitOptions(maxWaitSeconds=seconds, maxObjectUpdates=MAX_OBJECT_UPDATES)
            try:
                update = (session.content.propertyCollector.WaitForUpdatesEx(self._version, options)
                          if seconds else self._poll_once(session, options))
            except vmodl.fault.RequestCanceled:
                return None  # a cancel meant for a long wait hit this one: the next round polls
            finally:
                with self._lock:
                    self._long_wait = False
            applied = self._apply(update, kinds)
            if update is None or not update.truncated:
                return applied
            del update  # dropped before the next part is asked
            seconds = 0

    def _poll_once(self, session: VSphereSession, options: Any) -> Any:
        """One zero-wait ``WaitForUpdatesEx`` (update set or None; faults raise as pyVmomi's): a reply
        with no ``returnval`` (nothing changed) is not decoded, half the poll's time."""
        pc: Any = session.content.propertyCollector
        with tracing.span("vsphere WaitForUpdatesEx", **{"vsphere.method": "WaitForUpdatesEx",
                                                         "vsphere.target": self.target.name}):
            body = collector.soap_call(session.si._stub, pc, "WaitForUpdatesEx", [self._version, options])
        if b"<WaitForUpdatesExResponse" in body and b"returnval" not in body:  # nothing changed
            return None
        return _Deserializer(session.si._stub).Deserialize(body, pc._GetMethodInfo("WaitForUpdatesEx").result)

    def _recheck(self, session: VSphereSession) -> None:
        """Read live what applied update sets left in doubt: objects that entered and left in one
        (kept when they exist), and the objects finished tasks touched or made (changes a target may
        not report, such as the simulator's reconfigurations). Doubts wait here until this succeeds,
        so no poll answers before the doubts of every update applied before it were read."""
        with self._lock:
            refs, self._doubts = self._doubts, {}
            tasks, self._task_list = self._task_list, None
        try:
            if tasks is not None or self._tasks_running:
                new = [] if tasks is None else [t for t in tasks if t not in self._tasks_seen]
                touched, running = mirror_check.finished_tasks(
                    session, sorted(set(new) | self._tasks_running))
                refs.update({m: t for m, t in touched.items() if _mirrored(t)})
                self._tasks_running = running
                if tasks is not None:
                    self._tasks_seen = set(tasks)
            live = mirror_check.read_objects(session, refs, {t: _paths_of(t) for t in set(refs.values())})
        except BaseException:
            with self._lock:  # still in doubt: the next attempt (or the resync) reads them
                self._doubts = refs | self._doubts
                self._task_list = self._task_list if self._task_list is not None else tasks
            raise
        if not refs:
            return
        with self._lock:
            for moid in refs:
                if moid in live:
                    self._objects[moid] = live[moid]
                else:
                    self._objects.pop(moid, None)
            self._changed()

    def _check(self, session: VSphereSession, kind: mirror_check.Kind) -> None:
        """One comparison round: read live, bring the mirror up to that read (a proven poll), compare;
        a difference is read and polled once more before it counts as a divergence."""
        with self._lock:
            moids = None if kind == "full" else self._schedule.slice(self._objects)
            refs = {} if moids is None else {m: self._objects[m].type for m in moids}
        paths = None if kind == "full" else {t: mirror_check.cheap_paths(t) for t in set(refs.values())}
        if moids is None:
            live = mirror_check.read_view(session, self._view, MIRRORED)
        else:
            live = mirror_check.read_objects(session, refs, paths or {})
        found = self._compare(session, live, paths, moids)
        if found:
            with self._lock:
                types = {m: o.type for m, o in live.items()} | {m: self._objects[m].type for m in found
                                                                 if m in self._objects}
            again = {m: types[m] for m in found if m in types}
            again_paths = {t: (paths or {}).get(t) or _paths_of(t) for t in set(again.values())}
            live = mirror_check.read_objects(session, again, again_paths)
            found = self._compare(session, live, paths, found)
        self._schedule.done(kind, self._clock())
        with self._lock:
            self._checks[kind] += 1
        if found:
            log.debug("target %s: %s comparison: %s differ", self.target.name, kind, found[:20])
            self._diverge(f"a {kind} comparison found {len(found)} objects differing from a live read",
                          len(found))

    def _compare(self, session: VSphereSession, live: dict[str, ObjectProps],
                 paths: dict[str, tuple[str, ...]] | None, moids: Sequence[str] | None) -> list[str]:
        if not self._poll(session, prove=True):
            return []  # diverged (counted there) or cancelled: the round ends here
        with self._lock:
            return mirror_check.differences(self._objects, live, paths, moids)

    def _diverge(self, why: str, objects: int) -> None:
        """The mirror is not what the target says: reads sweep until a resync repaired it."""
        self._resync_wanted = True
        with self._lock:
            first = not self._diverged
            self._diverged = True
            self._divergences += first
            self._healthy = False
            self._last_error = "the mirror diverged from a live read; resyncing"
            self._lock.notify_all()
        if first:
            log.warning("target %s: mirror diverged (%s; %d objects); reads sweep until it resyncs",
                        self.target.name, why, objects)

    def _resync(self, session: VSphereSession) -> None:
        started = time.perf_counter()
        with self._lock:
            self._healthy = False
            self._synced = False
        content: Any = session.content
        # A wait left running on the target by a cut connection would take updates meant for the new
        # filter (a session outlives its connections): end it first.
        with contextlib.suppress(Exception):
            content.propertyCollector.CancelWaitForUpdates()
        self._drop_filter()
        self._resync_wanted = False
        self._proved_at = None
        self._view = content.viewManager.CreateContainerView(content.rootFolder, list(MIRRORED), True)
        self._marker = Marker(session)
        collector = content.propertyCollector
        # The marker's filter is read first, alone: the update queue then runs before the mirrored
        # state is read, so no change made meanwhile is lost (govmomi's simulator starts listening for
        # a session only after its first read, and a change between them reached nobody).
        self._filters = [collector.CreateFilter(
            self._marker.filter_spec(content.taskManager, self._spec(_OTHER_TYPES)), partialUpdates=False)]
        objects: dict[str, ObjectProps] = {}
        _, tasks = _read_all(collector, objects, None)
        self._filters.append(collector.CreateFilter(self._spec({vim.VirtualMachine: _VM_PATHS}),
                                                    partialUpdates=False))
        version, tasks = _read_all(collector, objects, tasks)
        self._tasks_seen, self._tasks_running = set(tasks or []), set()
        with self._lock:
            self._doubts, self._task_list = {}, None
        self._schedule = Schedule(self.target.mirror_check_seconds, self._clock())
        with self._lock:
            resynced = self._root is not None
            self._objects = objects
            self._changed()
            self._version = version
            self._root = content.rootFolder._moId
            self._session_key = session.key
            self._synced, self._healthy, self._partial = True, True, False
            self._last_error = None
            self._heard_at = self._clock()
            self._resyncs += int(resynced)
            self._repairs += self._diverged
            self._diverged = False
            self._polled = self._requested  # readers still waiting fell back to a sweep already
            self._lock.notify_all()
        log.info("target %s: mirror synced (%d objects, %.2f s)", self.target.name, len(objects),
                 time.perf_counter() - started)

    def _spec(self, paths: Mapping[Any, Sequence[str]]) -> Any:
        """A filter spec over the mirror's view for ``paths`` (by type)."""
        return PC.FilterSpec(
            objectSet=[PC.ObjectSpec(obj=self._view, skip=True, selectSet=[
                PC.TraversalSpec(name="view", type=vim.view.ContainerView, path="view", skip=False)])],
            propSet=[PC.PropertySpec(type=t, pathSet=list(p)) for t, p in paths.items()])

    def _changed(self) -> None:
        """``_objects`` changed (called with the lock): drop what was derived from them."""
        self._answers.clear()
        self._names = None

    def _drop_filter(self) -> None:
        marker, self._marker = self._marker, None
        views = [v for v in (self._view, marker.view if marker is not None else None) if v is not None]
        for obj, method in (*((f, "DestroyPropertyFilter") for f in self._filters),
                            *((v, "DestroyView") for v in views)):
            if obj is not None:
                with contextlib.suppress(Exception):
                    getattr(obj, method)()
        self._filters, self._view = [], None

    def _apply(self, update: Any, kinds: dict[str, set[str]]) -> Applied:
        with self._lock:
            applied = Applied()
            self._partial = update is not None and bool(update.truncated)
            if update is not None:
                applied = _apply_update(self._objects, update, kinds)
                self._updates += applied.count
                if applied.count:
                    self._changed()
                self._version = update.version
            if applied.marker and self._marker is not None:
                self._marker.outstanding = False
            self._doubts.update(applied.recheck)
            if applied.tasks is not None:
                self._task_list = applied.tasks
            self._heard_at = self._clock()
            self._lock.notify_all()
            return applied


def _read_all(collector: Any, objects: dict[str, ObjectProps],
              tasks: list[str] | None) -> tuple[str, list[str] | None]:
    """Every part of a zero-wait ``WaitForUpdatesEx("")`` applied to ``objects``: the version after the
    last part and the task list (``tasks`` unless a part changed it)."""
    version, kinds = "", dict[str, set[str]]()
    while True:
        update = collector.WaitForUpdatesEx(version, PC.WaitOptions(
            maxWaitSeconds=0, maxObjectUpdates=MAX_OBJECT_UPDATES))
        if update is None:
            return version, tasks
        applied = _apply_update(objects, update, kinds)
        tasks = applied.tasks if applied.tasks is not None else tasks
        version, truncated = update.version, update.truncated
        del update  # pyVmomi's decoder leaves each reply in cycles: collected, it serves the next part
        gc.collect()
        if not truncated:
            return version, tasks


@dataclass
class Applied:
    """What one update set did: object updates applied, objects to read live (moid -> type) because
    they entered and left in it, whether the marker changed, the task list when it changed."""

    count: int = 0
    recheck: dict[str, str] = field(default_factory=dict)
    marker: bool = False
    tasks: list[str] | None = None


def _paths_of(type_name: str) -> tuple[str, ...]:
    """The mirrored paths of a type by its wsdl name (a subtype takes its mirrored ancestor's)."""
    return _mirrored(type_name) or ("name",)


def _mirrored(type_name: str) -> tuple[str, ...] | None:
    """The paths ``MIRRORED`` keeps for ``type_name`` (or its nearest mirrored ancestor), or None."""
    try:
        ancestry = mirror_check.wsdl_type(type_name).__mro__
    except (KeyError, AttributeError):
        return None
    return next((MIRRORED[a] for a in ancestry if a in MIRRORED), None)


def _apply_update(objects: dict[str, ObjectProps], update: Any,
                  kinds: dict[str, set[str]] | None = None) -> Applied:
    """Apply one ``UpdateSet`` to ``objects`` (by moid). An object that both entered and left in it
    (the simulator reports a move that way, the enter first) is applied in order and named in
    ``recheck``: the caller reads it live and keeps it when it exists (``kinds``: what each moid did in
    the earlier parts of a truncated reply). The marker and the task list are noted, not mirrored."""
    applied = Applied()
    kinds = {} if kinds is None else kinds
    for filter_update in update.filterSet or []:
        for change in filter_update.objectSet or []:
            moid, type_name = mirror_check.kept(change.obj._moId), _PATHS.setdefault(
                change.obj._wsdlName, str(change.obj._wsdlName))
            if type_name in CONTROL_TYPES:
                for prop in change.changeSet or []:
                    if prop.name == "view":
                        applied.marker = True
                    elif prop.name == "recentTask":
                        applied.tasks = [t._moId for t in prop.val or []]
                continue
            applied.count += 1
            seen = kinds.setdefault(moid, set())
            seen.add(change.kind)
            if {"enter", "leave"} <= seen:
                applied.recheck[moid] = type_name
            if change.kind == "leave":
                objects.pop(moid, None)
                continue
            current = objects.get(moid)
            if change.kind == "enter" or current is None:
                current = objects[moid] = ObjectProps(type_name, moid, {})
            for prop in change.changeSet or []:
                if prop.op in ("remove", "indirectRemove") or prop.val is None:
                    current.props.pop(prop.name, None)
                else:
                    name = _PATHS.setdefault(prop.name, str(prop.name))
                    current.props[name] = mirror_check.plain_value(name, prop.val)
    return applied


_PATHS: dict[str, str] = {}
"""Property names as plain, shared strings. pyVmomi hands them out as ``PropertyPath`` instances (a str
subclass with a ``__dict__``): one per property per object, each tracked by the cycle collector, which
also keeps every props dict tracked. Only the names ``MIRRORED`` lists (a few dozen) ever land here."""


class Mirrors:
    """The mirrors of every target, built lazily; ``answer`` is the one hook the read path calls."""

    def __init__(self, targets: Sequence[Target], credentials: Mapping[str, str],
                 reads: Mapping[str, MirrorRead]) -> None:
        self._targets = {t.name: t for t in targets}
        self._credentials = credentials
        self._reads = dict(reads)
        self._modes = {t.name: t.mirror for t in targets}
        self._staleness = {t.name: t.max_staleness_seconds for t in targets}
        self._mirrors: dict[str, Mirror] = {}
        self._lock = threading.Lock()
        self._closed = False

    def start_eager(self) -> None:
        """Start the mirrors of targets configured ``mirror: eager`` (no I/O on the caller's thread)."""
        for name, mode in self._modes.items():
            if mode == "eager":
                mirror = self._mirror(name)
                if mirror is not None:
                    mirror.start()

    async def answer(self, target: str, tool: str, args: Mapping[str, Any]) -> Answer | None:
        """The answer of read tool ``tool`` on ``target`` from its mirror, or None: sweep instead."""
        read = self._reads.get(tool)
        if read is None:
            return None
        mirror = self._mirror(target)
        if mirror is None:
            return None
        staleness = self._staleness.get(target)
        try:
            return await asyncio.to_thread(mirror.answer, read, args, staleness)
        except errors.GatewayError:
            raise  # the tool's own answer (bad arguments, not found), as a sweep would give it
        except Exception:  # a defect here must not fail the read: the sweep answers instead
            log.exception("target %s: the mirror could not answer %s; sweeping", target, tool)
            mirror.count_swept()
            return None

    async def fan_out(self, names: Sequence[str], tool: str, args: Mapping[str, Any],
                      sweep: Callable[[list[str]], Awaitable[dict[str, dict[str, Any]]]],
                      ) -> dict[str, dict[str, Any]]:
        """A fan-out read: each target answered by its mirror when it can, the others by ``sweep(rest)``;
        ``{name: {"ok": ...} | {"error": ...}}`` in the order of ``names``, a mirror's ``ok`` being its
        encoded ``Answer`` (its text is sent as it is), a sweep's the plain value. Each target's answer
        comes wholly from one source."""
        names = list(dict.fromkeys(names))

        async def settle(name: str) -> dict[str, Any] | None:
            try:
                answer = await self.answer(name, tool, args)
            except errors.GatewayError as exc:
                return {"error": exc.to_wire()}
            return None if answer is None else {"ok": answer}

        mirrored = dict(zip(names, await asyncio.gather(*(settle(n) for n in names)), strict=True))
        rest = [n for n in names if mirrored[n] is None]
        swept = await sweep(rest) if rest else {}
        return {n: mirrored[n] or swept[n] for n in names}

    def lookup(self, target: str) -> details.Lookup | None:
        """``target``'s mirror as a name index for live reads, when it has one that is synced (never
        starts one); None otherwise. Called on the read's worker thread."""
        with self._lock:
            mirror = None if self._closed else self._mirrors.get(target)
        return mirror.lookup if mirror is not None and mirror.ready else None

    def stats(self) -> dict[str, MirrorStats]:
        """Per target with a mirror: state, object count, version, lag, resyncs, served/swept reads."""
        with self._lock:
            mirrors = dict(self._mirrors)
        return {name: m.stats() for name, m in mirrors.items()}

    def samples(self) -> list[tuple[str, str, str, dict[str, str], float]]:
        """The statistics as metric samples ``(family, type, help, labels, value)``, for /metrics."""
        out: list[tuple[str, str, str, dict[str, str], float]] = []
        for name, s in sorted(self.stats().items()):
            labels = {"target": name}
            out += [
                ("gateway_mirror_synced", "gauge", "1 when the mirror is synced and healthy.",
                 labels, float(s.state == "synced")),
                ("gateway_mirror_objects", "gauge", "Objects held by the target's inventory mirror.",
                 labels, float(s.objects)),
                ("gateway_mirror_lag_seconds", "gauge", "Seconds since the mirror heard from its target.",
                 labels, s.lag_seconds if s.lag_seconds is not None else float("nan")),
                ("gateway_mirror_resyncs_total", "counter", "Full resyncs (session loss, restart).",
                 labels, float(s.resyncs)),
                ("gateway_mirror_reads_total", "counter", "Mirrorable reads by how they were answered.",
                 {**labels, "source": "mirror"}, float(s.served)),
                ("gateway_mirror_reads_total", "counter", "Mirrorable reads by how they were answered.",
                 {**labels, "source": "sweep"}, float(s.swept)),
                ("gateway_mirror_lookups_total", "counter",
                 "Names the mirror resolved for a live read (get_vm_details skips its name search).",
                 labels, float(s.lookups)),
                ("gateway_mirror_divergence_total", "counter",
                 "Times the mirror differed from a live read or its stream stopped delivering (each "
                 "repaired by a resync; reads sweep meanwhile).", labels, float(s.divergences)),
                *(("gateway_mirror_checks_total", "counter", "Comparison rounds with a live read, by kind.",
                   {**labels, "kind": kind}, float(s.checks.get(kind, 0))) for kind in ("rolling", "full")),
            ]
        out.append(("gateway_soap_decoder_fallbacks_total", "counter",
                    "Sweep replies the fast scanner left to ElementTree.", {},
                    float(self.decoder_fallbacks())))
        return out

    def decoder_fallbacks(self) -> int:
        """Sweep replies the fast scanner left to ElementTree, since the process started."""
        return soap_scan.DECODER.fallbacks

    def close(self) -> None:
        with self._lock:
            self._closed = True
            mirrors = list(self._mirrors.values())
        closers = [threading.Thread(target=m.close, daemon=True) for m in mirrors]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(6.0)

    def _mirror(self, name: str) -> Mirror | None:
        target = self._targets.get(name)
        if target is None or self._modes.get(name) == "off":
            return None
        with self._lock:
            if self._closed:
                return None
            mirror = self._mirrors.get(name)
            if mirror is None:
                try:
                    credentials = target.credentials(self._credentials)
                except errors.ConfigError:
                    return None  # the sweep reports the missing credentials
                own = dataclasses.replace(target, pool_size=1)
                # two connections: a read's cancel of the long wait needs no new one (a TLS handshake)
                mirror = self._mirrors[name] = Mirror(target, SessionPool(own, credentials, connections=2))
            return mirror
