"""Events and tasks, read over vSphere history collectors and scrolled by time window.

``QueryEvents`` answers one server-capped slice and says nothing when it cut the window short, so a
collector is scrolled back page by page, and always destroyed. Past ``max_scan`` records it raises
``ScanLimitReached``: a partial list would read like a complete one. Every filter is applied again
client-side (the simulator ignores them); ``entity_name`` only client-side, which finds deleted objects.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pyVmomi import vim, vmodl

from gateway import errors
from gateway.guard.patterns import UserRegex
from gateway.vsphere.collector import Session, iso, object_spec, retrieve_objects
from gateway.vsphere.resolve import resolve_vm

log = logging.getLogger(__name__)

_EventFilterSpec: Any = vim.event.EventFilterSpec
_TaskFilterSpec: Any = vim.TaskFilterSpec

MAX_PAGE = 1000
"""Largest collector page vCenter accepts."""
MIN_PAGE = 10
"""Collectors start with 10-record pages; shrinking them gains nothing (and the simulator mishandles it)."""


# --------------------------------------------------------------------------------------------------
# Pure parts: window, scan, filters


@dataclass(frozen=True)
class Window:
    """A closed time window ``[start, end]`` (aware datetimes)."""

    start: datetime
    end: datetime

    def to_dict(self) -> dict[str, str | None]:
        return {"start": iso(self.start), "end": iso(self.end)}


def make_window(start: datetime | None, end: datetime | None, minutes: float, now: datetime) -> Window:
    """The window the caller asked for: explicit ``start``/``end``; otherwise ``end`` defaults to now and
    ``start`` to ``minutes`` before ``end``. A start after the end is an ``InvalidArgument``."""
    end = end or now
    start = start or end - timedelta(minutes=minutes)
    if start > end:
        raise errors.InvalidArgument("start", f"the window starts ({iso(start)}) after it ends ({iso(end)})")
    return Window(start, end)


@dataclass(frozen=True)
class Record:
    """One history record: its key (for de-duplication), when it happened, and its plain fields."""

    key: Any
    created: datetime
    data: dict[str, Any]
    names: tuple[str, ...] = ()


@dataclass
class ScanResult:
    records: list[Record] = field(default_factory=list)
    scanned: int = 0
    complete: bool = True
    oldest_seen: datetime | None = None


def scan(first: Sequence[Record], read_older: Callable[[int], Sequence[Record]], *, window: Window,
         max_scan: int, page: int) -> ScanResult:
    """Walk from ``first`` (the newest page) to older pages until the window's start is passed or the
    history ends; keep the records inside ``window``.

    ``read_older(n)`` returns up to ``n`` records older than those seen (empty at the end of history);
    it is asked for at most ``page`` records and never beyond ``max_scan + 1`` distinct records in
    total. Once more than ``max_scan`` distinct records were read without passing the window's start
    the scan stops with ``complete=False`` (so does a history that keeps answering without ending).
    """
    result = ScanResult()
    seen: set[Any] = set()
    batch = first
    reads = 0
    while batch:
        passed_start = False
        for record in batch:
            if record.key in seen:
                continue
            seen.add(record.key)
            result.scanned += 1
            if result.oldest_seen is None or record.created < result.oldest_seen:
                result.oldest_seen = record.created
            if record.created < window.start:
                passed_start = True
            elif record.created <= window.end:
                result.records.append(record)
        if passed_start:
            return result
        if result.scanned > max_scan or reads > max_scan:
            result.complete = False
            return result
        batch = read_older(min(page, max_scan + 1 - result.scanned))
        reads += 1
    return result


@dataclass(frozen=True)
class RecordFilter:
    """Client-side record filters, all of which must hold: ``allowed`` maps a record field to the set
    of values it may take; ``entity_name`` is searched in every entity name the record carries."""

    allowed: Mapping[str, frozenset[Any]] = field(default_factory=dict)
    entity_name: UserRegex | None = None

    def __call__(self, record: Record) -> bool:
        if any(record.data.get(k) not in values for k, values in self.allowed.items()):
            return False
        return self.entity_name is None or any(self.entity_name.search(n) for n in record.names)


def allow(**values: Any) -> dict[str, frozenset[Any]]:
    """``allowed`` for ``RecordFilter`` from keyword arguments: None or empty means no constraint."""
    out: dict[str, frozenset[Any]] = {}
    for key, value in values.items():
        if value is None or value == ():
            continue
        many = isinstance(value, tuple | list | set | frozenset)
        out[key] = frozenset(value) if many else frozenset({value})
    return out


def page_size(max_scan: int) -> int:
    return max(MIN_PAGE, min(MAX_PAGE, max_scan + 1))


def shape(result: ScanResult, keep: RecordFilter, window: Window, max_results: int,
          key: str) -> dict[str, Any]:
    """The answer: matching records newest first, at most ``max_results`` (``truncated`` says so)."""
    matched = sorted((r for r in result.records if keep(r)), key=lambda r: (r.created, str(r.key)),
                     reverse=True)
    out: dict[str, Any] = {
        key: [r.data for r in matched[:max_results]], "count": min(len(matched), max_results),
        "matched": len(matched), "scanned": result.scanned, "window": window.to_dict(),
    }
    if len(matched) > max_results:
        out["truncated"] = True
    return out


# --------------------------------------------------------------------------------------------------
# Collectors


@contextmanager
def _collector(create: Callable[[], Any]) -> Iterator[Any]:
    collector = create()
    try:
        yield collector
    finally:
        try:
            collector.DestroyCollector()
        except Exception as exc:  # the answer is complete; the server reclaims the collector with the session
            log.warning("could not destroy history collector %s: %s", getattr(collector, "_moId", "?"),
                        type(exc).__name__)


def _scroll(collector: Any, read_previous: Callable[[int], Sequence[Any]], convert: Callable[[Any], Record],
            window: Window, max_scan: int) -> ScanResult:
    page = page_size(max_scan)
    collector.SetCollectorPageSize(page)
    collector.ResetCollector()
    latest = [convert(item) for item in collector.latestPage or []]
    return scan(latest, lambda n: [convert(item) for item in read_previous(n) or []],
                window=window, max_scan=max_scan, page=page)


def _incomplete(session: Session, what: str, window: Window, result: ScanResult, max_scan: int) -> Exception:
    target = session.target.name
    return errors.ScanLimitReached(
        f"target '{target}': the {what} window {iso(window.start)} .. {iso(window.end)} holds more than "
        f"max_scan={max_scan} records (read back to {iso(result.oldest_seen)} without reaching the start); "
        "narrow the window, add filters, or raise max_scan", target=target, scanned=result.scanned,
        oldest_seen=iso(result.oldest_seen))


# --------------------------------------------------------------------------------------------------
# Events


_EVENT_ENTITIES = (
    ("vm", "vm"), ("host", "host"), ("datacenter", "datacenter"), ("compute_resource", "computeResource"),
    ("datastore", "ds"), ("network", "net"), ("dvs", "dvs"),
)


def event_type(event: Any) -> str:
    """The type a caller filters on: ``eventTypeId`` for extensible events, else the class name."""
    type_id = getattr(event, "eventTypeId", None)
    return str(type_id) if type_id else str(event._wsdlName)


def event_record(event: Any) -> Record:
    """A vSphere event as a plain record."""
    data: dict[str, Any] = {
        "key": event.key, "type": event_type(event), "created": iso(event.createdTime),
        "user": event.userName or None, "message": event.fullFormattedMessage or "",
        "chain_id": event.chainId,
    }
    names = []
    for label, attr in _EVENT_ENTITIES:
        argument = getattr(event, attr, None)
        if argument is not None and argument.name:
            data[label] = argument.name
            names.append(str(argument.name))
    if getattr(event, "vm", None) is not None and event.vm.vm is not None:
        data["vm_moid"] = event.vm.vm._moId
    object_name = getattr(event, "objectName", None)
    if object_name:
        data["object_name"] = object_name
        names.append(str(object_name))
    reason = getattr(event, "reason", None)
    if isinstance(reason, str) and reason:
        data["reason"] = reason
    return Record(event.key, event.createdTime, data, tuple(names))


@dataclass(frozen=True)
class EventQuery:
    """get_events: the window, server-side narrowing (types, user) and client-side filters."""

    window: Window
    event_types: tuple[str, ...] = ()
    user: str | None = None
    entity_name: UserRegex | None = None
    entity: Any = None
    max_scan: int = 5000
    max_results: int = 500


def event_filter(query: EventQuery) -> Any:
    spec = _EventFilterSpec(
        time=_EventFilterSpec.ByTime(beginTime=query.window.start, endTime=query.window.end))
    if query.event_types:
        spec.eventTypeId = list(query.event_types)
    if query.user:
        spec.userName = _EventFilterSpec.ByUsername(userList=[query.user], systemUser=False)
    if query.entity is not None:
        spec.entity = _EventFilterSpec.ByEntity(entity=query.entity, recursion="self")
    return spec


def _event_keep(query: EventQuery) -> RecordFilter:
    return RecordFilter(allow(type=query.event_types, user=query.user), query.entity_name)


def scan_events(session: Session, query: EventQuery) -> ScanResult:
    """Scroll the events of ``query``'s window (see the module docstring); raises ``ScanLimitReached``."""
    manager = session.content.eventManager
    with _collector(lambda: manager.CreateCollectorForEvents(event_filter(query))) as collector:
        result = _scroll(collector, collector.ReadPreviousEvents, event_record, query.window, query.max_scan)
    if not result.complete:
        raise _incomplete(session, "event", query.window, result, query.max_scan)
    return result


def get_events(session: Session, query: EventQuery) -> dict[str, Any]:
    """Events in the window matching the filters, newest first:
    ``{"events": [...], "count", "matched", "scanned", "window", "truncated"?}``."""
    result = scan_events(session, query)
    return shape(result, _event_keep(query), query.window, query.max_results, "events")


# --------------------------------------------------------------------------------------------------
# Tasks


def task_record(info: Any) -> Record:
    """A vSphere ``TaskInfo`` as a plain record."""
    reason = info.reason
    error = info.error
    data: dict[str, Any] = {
        "key": info.key, "name": info.descriptionId or info.name, "entity": info.entityName,
        "entity_moid": info.entity._moId if info.entity is not None else None, "state": info.state,
        "user": getattr(reason, "userName", None), "queued": iso(info.queueTime),
        "started": iso(info.startTime),
        "completed": iso(info.completeTime), "progress": info.progress, "cancelled": info.cancelled,
        "error": (error.msg or type(error).__name__) if error is not None else None,
    }
    return Record(info.key, info.queueTime, data, (info.entityName,) if info.entityName else ())


@dataclass(frozen=True)
class TaskQuery:
    window: Window
    states: tuple[str, ...] = ()
    task_id: str | None = None
    user: str | None = None
    entity_name: UserRegex | None = None
    max_scan: int = 5000
    max_results: int = 500


def task_filter(query: TaskQuery) -> Any:
    spec = _TaskFilterSpec(time=_TaskFilterSpec.ByTime(
        timeType="queuedTime", beginTime=query.window.start, endTime=query.window.end))
    if query.states:
        spec.state = list(query.states)
    if query.user:
        spec.userName = _TaskFilterSpec.ByUsername(userList=[query.user], systemUser=False)
    return spec


def _task_keep(query: TaskQuery) -> RecordFilter:
    return RecordFilter(allow(state=query.states, user=query.user, key=query.task_id), query.entity_name)


def _task_collector(session: Session, query: TaskQuery) -> Any:
    try:
        return session.content.taskManager.CreateCollectorForTasks(task_filter(query))
    except (vmodl.fault.MethodNotFound, vmodl.fault.NotImplemented, vmodl.fault.NotSupported) as exc:
        target = session.target.name
        raise errors.NotSupported(
            f"target '{target}' does not keep a task history this gateway can read ({type(exc).__name__} "
            "for CreateCollectorForTasks); use get_events, whose records include task events",
            target=target) from exc


def get_tasks(session: Session, query: TaskQuery) -> dict[str, Any]:
    """Tasks queued in the window matching the filters, newest first (same shape as ``get_events``).

    A target without task history collectors answers ``errors.NotSupported``.
    """
    with _collector(lambda: _task_collector(session, query)) as collector:
        result = _scroll(collector, collector.ReadPreviousTasks, task_record, query.window, query.max_scan)
    if not result.complete:
        raise _incomplete(session, "task", query.window, result, query.max_scan)
    return shape(result, _task_keep(query), query.window, query.max_results, "tasks")


# --------------------------------------------------------------------------------------------------
# Guest customization


CUSTOMIZATION_STARTED = frozenset({"CustomizationStartedEvent"})
CUSTOMIZATION_SUCCEEDED = frozenset({"CustomizationSucceeded"})
CUSTOMIZATION_FAILED = frozenset({
    "CustomizationFailed", "CustomizationLinuxIdentityFailed", "CustomizationNetworkSetupFailed",
    "CustomizationSysprepFailed", "CustomizationUnknownFailure",
})
CUSTOMIZATION_EVENTS = tuple(sorted(CUSTOMIZATION_STARTED | CUSTOMIZATION_SUCCEEDED | CUSTOMIZATION_FAILED))

_GUEST_STATUS = {
    "TOOLSDEPLOYPKG_IDLE": "idle", "TOOLSDEPLOYPKG_PENDING": "pending", "TOOLSDEPLOYPKG_RUNNING": "running",
    "TOOLSDEPLOYPKG_SUCCEEDED": "succeeded", "TOOLSDEPLOYPKG_FAILED": "failed",
}


Event = Mapping[str, Any]


def _latest_run(events: Sequence[Event]) -> tuple[Event | None, list[Event]]:
    """The latest start event and the events after it (all events when none started)."""
    ordered = sorted(events, key=lambda e: (e.get("created") or "", e.get("key") or 0))
    starts = [i for i, e in enumerate(ordered) if e.get("type") in CUSTOMIZATION_STARTED]
    if not starts:
        return None, ordered
    return ordered[starts[-1]], ordered[starts[-1] + 1:]


def fold_customization(guest: Mapping[str, Any] | None, events: Sequence[Event]) -> dict[str, Any]:
    """One verdict from the guest's customization block and the Customization* events.

    ``guest`` holds ``status`` (idle/pending/running/succeeded/failed), ``started``, ``ended``,
    ``error`` or is None when the target does not report it. A failure in either source wins (where
    a failure is recorded depends on how far customization got); then a success in either; then a
    run in progress (a start event without an outcome, or pending/running). Otherwise nothing is
    known to have started.
    """
    start, after = _latest_run(events)
    failed = next((e for e in reversed(after) if e.get("type") in CUSTOMIZATION_FAILED), None)
    succeeded = next((e for e in reversed(after) if e.get("type") in CUSTOMIZATION_SUCCEEDED), None)
    status = (guest or {}).get("status")
    started_at = (start or {}).get("created") or (guest or {}).get("started")
    if failed is not None or status == "failed":
        error = _failure_text(failed, guest)
        ended = (failed or {}).get("created") or (guest or {}).get("ended")
        return _verdict("failed", True, False, started_at, ended, error)
    if succeeded is not None or status == "succeeded":
        ended = (succeeded or {}).get("created") or (guest or {}).get("ended")
        return _verdict("succeeded", True, True, started_at, ended, None)
    if start is not None or status in ("pending", "running"):
        return _verdict("running", False, None, started_at, None, None)
    return _verdict("not_started", False, None, None, None, None)


def _failure_text(event: Event | None, guest: Mapping[str, Any] | None) -> str | None:
    """The best description of a failure: the event's reason or message, the guest's error, the event type."""
    event = event or {}
    return event.get("reason") or event.get("message") or (guest or {}).get("error") or event.get("type")


def _verdict(status: str, finished: bool, succeeded: bool | None, started: Any, ended: Any,
             error: Any) -> dict[str, Any]:
    return {"status": status, "finished": finished, "succeeded": succeeded, "started_at": started,
            "finished_at": ended, "error": error}


def _guest_block(info: Any) -> dict[str, Any] | None:
    if info is None:
        return None
    return {"status": _GUEST_STATUS.get(info.customizationStatus, info.customizationStatus),
            "started": iso(info.startTime), "ended": iso(info.endTime), "error": info.errorMsg or None}


def get_customization_status(session: Session, ref: str, *, max_events: int = 100) -> dict[str, Any]:
    """The VM's guest customization verdict (``fold_customization``) with both sources shown.

    The events are the newest ``max_events`` Customization* events of this VM (one collector page).
    """
    vm = resolve_vm(session, ref)
    mo = vm.managed_object(session)
    objects = retrieve_objects(session, object_spec(
        mo, {vim.VirtualMachine: ("guest.customizationInfo",)}))
    props = objects[0] if objects else None
    guest = _guest_block(props.props.get("guest.customizationInfo")) if props else None
    reported = props is not None and "guest.customizationInfo" not in props.missing
    spec = _EventFilterSpec(eventTypeId=list(CUSTOMIZATION_EVENTS),
                                     entity=_EventFilterSpec.ByEntity(entity=mo, recursion="self"))
    manager = session.content.eventManager
    with _collector(lambda: manager.CreateCollectorForEvents(spec)) as collector:
        collector.SetCollectorPageSize(max_events)
        collector.ResetCollector()
        records = [event_record(e) for e in collector.latestPage or []]
    mine = [r.data for r in records
            if r.data.get("vm_moid") == vm.moid and r.data["type"] in CUSTOMIZATION_EVENTS]
    return {
        "vm": vm.name, "vm_moid": vm.moid, **fold_customization(guest, mine),
        "guest_customization_info": guest if reported else "not reported by this target",
        "events": sorted(mine, key=lambda e: (e.get("created") or "", e.get("key") or 0), reverse=True),
    }
