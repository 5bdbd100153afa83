"""The single waiter for vSphere tasks (and for property conditions, such as a guest shutting down).

A private filter and long polls bounded by the deadline, with a plain read after an empty poll (a lost
update cannot stall the wait); not ``task.info``, which breaks on snapshot tasks. A lost connection is
``OutcomeUnknown`` for every task (it may still complete, so never retried); a passed deadline is
``OutcomeUnknown`` for a destructive task, ``Timeout`` for a write. The filter is always destroyed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyVmomi

from gateway import errors
from gateway.vocabulary import ProgressFn
from gateway.vsphere import faults

log = logging.getLogger(__name__)
vim: Any = pyVmomi.vim  # pyVmomi's constructors are untyped
vmodl: Any = pyVmomi.vmodl

TASK_PATHS = ("info.state", "info.progress", "info.error", "info.result")
TERMINAL_STATES = frozenset({"success", "error"})
MAX_POLL_SECONDS = 20
"""Longest single ``WaitForUpdatesEx`` long poll; kept well under the SOAP socket timeout."""

Props = dict[str, Any]
#: error codes of a wait that lost its connection: the submitted task may still complete
_CONNECTION_LOST = frozenset({"timeout", "unreachable"})


def wait_for_task(
    session: Any,
    task: Any,
    *,
    deadline: float,
    progress: ProgressFn,
    destructive: bool,
    label: str | None = None,
) -> Any:
    """Follow ``task`` to its end and return ``info.result``; see the module docstring for failures.

    ``progress(fraction, message)`` is called whenever ``info.progress`` changes (fraction 0..1) and
    with 1.0 on success. ``label`` names the operation in progress messages and errors.
    """
    target = session.target.name
    moid = str(task._moId)
    what = label or moid
    reporter = _ProgressRelay(progress, what)
    try:
        props = watch(session, task, vim.Task, TASK_PATHS, _finished, deadline=deadline,
                      on_change=reporter.relay)
    except errors.GatewayError as exc:
        if not destructive and exc.code not in _CONNECTION_LOST:
            exc.details.setdefault("task", moid)
            raise
        raise _lost(target, moid, what, exc) from exc
    if props is None:
        raise _past_deadline(target, moid, what, destructive, reporter.last)
    if props.get("info.state") == "error":
        raise faults.task_error(props.get("info.error"), target, moid)
    reporter.done()
    return props.get("info.result")


def cancel_task(task: Any, target: str) -> str | None:
    """Ask vSphere to cancel ``task`` (``vim.Task.CancelTask``); None when it accepted, else why not (the
    task is not cancellable, has ended, or the call failed): the task then runs on."""
    try:
        task.CancelTask()
    except Exception as exc:
        if not faults.is_foreign(exc):
            raise
        error = faults.translate(exc, target)
        return f"vSphere did not cancel task {task._moId} ({error.code}: {error.message})"
    return None


def watch(
    session: Any,
    obj: Any,
    obj_type: Any,
    paths: Sequence[str],
    done: Callable[[Props], bool],
    *,
    deadline: float,
    on_change: Callable[[Props], None] | None = None,
) -> Props | None:
    """Watch ``paths`` of ``obj`` until ``done(props)``; return the props, or None past ``deadline``.

    Faults and transport errors raised while watching become gateway errors (``faults.translate``).
    """
    target = session.target.name
    try:
        with _collector(session) as collector, _filter(collector, obj, obj_type, paths):
            return _follow(collector, obj, obj_type, paths, done, deadline, on_change, session)
    except errors.GatewayError:
        raise
    except Exception as exc:
        if not faults.is_foreign(exc):
            raise
        raise faults.translate(exc, target) from exc


def _finished(props: Props) -> bool:
    return props.get("info.state") in TERMINAL_STATES


def _follow(
    collector: Any, obj: Any, obj_type: Any, paths: Sequence[str], done: Callable[[Props], bool],
    deadline: float, on_change: Callable[[Props], None] | None, session: Any,
) -> Props | None:
    props: Props = {}
    version = ""
    cap = _poll_cap(session)
    while (remaining := deadline - time.monotonic()) > 0:
        fresh, version = _next(collector, obj, obj_type, paths, version, min(cap, remaining))
        if fresh is None:
            continue
        props.update(fresh)
        if on_change is not None:
            on_change(props)
        if done(props):
            return props
    return None


def _next(
    collector: Any, obj: Any, obj_type: Any, paths: Sequence[str], version: str, seconds: float
) -> tuple[Props | None, str]:
    """What changed within ``seconds`` (a long poll; a plain read when it comes back empty) and the
    collector version to continue from."""
    if seconds < 1:
        # WaitForUpdatesEx waits whole seconds: sleep out the last fraction, then look once more.
        time.sleep(seconds)
        return _read(collector, obj, obj_type, paths), version
    options = vmodl.query.PropertyCollector.WaitOptions(maxWaitSeconds=int(seconds))
    update = collector.WaitForUpdatesEx(version, options)
    if update is None:
        return _read(collector, obj, obj_type, paths), version
    return _changes(update), update.version


def _poll_cap(session: Any) -> int:
    """Long polls end well within the session's socket timeout, or the read itself would time out."""
    return max(1, min(MAX_POLL_SECONDS, int(float(session.socket_timeout) / 2)))


def _changes(update: Any) -> Props | None:
    """The property values one ``UpdateSet`` carries for our single object; raise if it vanished."""
    found: Props = {}
    for filter_update in update.filterSet or ():
        for object_update in filter_update.objectSet or ():
            if object_update.kind == "leave":
                raise vmodl.fault.ManagedObjectNotFound(obj=object_update.obj)
            for change in object_update.changeSet or ():
                found[change.name] = None if change.op == "remove" else change.val
    return found or None


def _read(collector: Any, obj: Any, obj_type: Any, paths: Sequence[str]) -> Props | None:
    spec = _filter_spec(obj, obj_type, paths)
    result = collector.RetrievePropertiesEx([spec], vmodl.query.PropertyCollector.RetrieveOptions())
    objects = result.objects if result is not None else []
    if not objects:
        raise vmodl.fault.ManagedObjectNotFound(obj=obj)
    props: Props = dict.fromkeys(paths)
    props.update({p.name: p.val for p in objects[0].propSet or ()})
    return props


def _filter_spec(obj: Any, obj_type: Any, paths: Sequence[str]) -> Any:
    pc = vmodl.query.PropertyCollector
    return pc.FilterSpec(
        objectSet=[pc.ObjectSpec(obj=obj, skip=False)],
        propSet=[pc.PropertySpec(type=obj_type, pathSet=list(paths), all=False)],
    )


@contextmanager
def _collector(session: Any) -> Iterator[Any]:
    """A private PropertyCollector, so other waits on the same session never see our updates."""
    collector = session.content.propertyCollector.CreatePropertyCollector()
    try:
        yield collector
    finally:
        _quietly(collector.DestroyPropertyCollector, "property collector")


@contextmanager
def _filter(collector: Any, obj: Any, obj_type: Any, paths: Sequence[str]) -> Iterator[Any]:
    property_filter = collector.CreateFilter(_filter_spec(obj, obj_type, paths), partialUpdates=False)
    try:
        yield property_filter
    finally:
        _quietly(property_filter.DestroyPropertyFilter, "property filter")


def _quietly(destroy: Callable[[], Any], what: str) -> None:
    # Cleanup runs on error paths too (session gone, connection reset): it must not mask the real error.
    try:
        destroy()
    except Exception as exc:
        log.warning("could not destroy the %s: %s", what, type(exc).__name__)


class _ProgressRelay:
    """Turns ``info.progress`` changes into ``progress(fraction, message)`` calls, each value once."""

    def __init__(self, progress: ProgressFn, what: str) -> None:
        self._progress = progress
        self._what = what
        self.last: int | None = None

    def relay(self, props: Props) -> None:
        value = props.get("info.progress")
        if not isinstance(value, int) or value == self.last or props.get("info.state") in TERMINAL_STATES:
            return
        self.last = value
        self._send(max(0, min(100, value)) / 100.0, f"{self._what}: {value}%")

    def done(self) -> None:
        self._send(1.0, f"{self._what}: done")

    def _send(self, fraction: float, message: str) -> None:
        # Progress is advisory: a caller that went away must not turn a finished task into an error.
        try:
            self._progress(fraction, message)
        except Exception:
            log.warning("progress callback failed for %s", self._what, exc_info=True)


def _past_deadline(
    target: str, moid: str, what: str, destructive: bool, last: int | None
) -> errors.GatewayError:
    seen = f" (last progress {last}%)" if last is not None else ""
    if destructive:
        return errors.OutcomeUnknown(
            f"target '{target}': task {moid} ({what}) did not finish before the deadline{seen}; it may "
            f"still complete, so its outcome is unknown. Do not retry: check it with get_tasks "
            f"(task id {moid}) or read the affected objects again", target=target, task=moid)
    return errors.Timeout(
        f"target '{target}': task {moid} ({what}) did not finish before the deadline{seen} and may still be "
        f"running; check it with get_tasks (task id {moid}) before retrying", target=target, task=moid)


def _lost(target: str, moid: str, what: str, cause: errors.GatewayError) -> errors.OutcomeUnknown:
    return errors.OutcomeUnknown(
        f"target '{target}': lost track of task {moid} ({what}) before it finished ({cause.code}); it may "
        f"still complete, so its outcome is unknown. Do not retry: check it with get_tasks "
        f"(task id {moid}) or read the affected objects again", target=target, task=moid, cause=cause.code)
