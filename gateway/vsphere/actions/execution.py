"""Running an execute: starting each mutation and task, and translating faults once a change may be made."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import pyVmomi

from gateway import errors
from gateway.vocabulary import Plan, ProgressFn
from gateway.vsphere import faults
from gateway.vsphere.actions.planning import DEFAULT_TIMEOUT_SECONDS, _read, _target
from gateway.vsphere.collector import managed_object
from gateway.vsphere.task_waiter import wait_for_task

T = TypeVar("T")
vim: Any = pyVmomi.vim  # pyVmomi's constructors are untyped


class Execution:
    """The state of one execute: its plan, progress relay, task timeout and whether it changed anything."""

    def __init__(self, session: Any, plan: Plan, progress: ProgressFn) -> None:
        self.session = session
        self.plan = plan
        self.params = plan.params
        self.progress = progress
        self.target = _target(session)
        self.timeout = float(self.params.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)
        self.mutated = False
        self.stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")

    def obj(self, vim_type: Any, moid: str) -> Any:
        return managed_object(self.session, vim_type, moid)

    def vm(self, moid: str | None = None) -> Any:
        return self.obj(vim.VirtualMachine, moid or str(self.params["vm"]))

    def invoke(self, method: Callable[..., T], *args: Any, destructive: bool, what: str, **kwargs: Any) -> T:
        """Start one mutation (a task or a synchronous call).

        Before anything has changed, a session expiry propagates untranslated so the pool logs in again
        and re-runs the execute; afterwards every fault is translated here. A call whose answer is lost
        (a timeout, a dropped connection: the request may have reached the target) has an unknown
        outcome, never ``unreachable``; only a connection that was never set up stays ``unreachable``
        (for a destructive call even that is reported as unknown).
        """
        first = not self.mutated
        self.mutated = True
        try:
            return method(*args, **kwargs)
        except vim.fault.NotAuthenticated as exc:
            if first:
                self.mutated = False
                raise
            raise faults.translate(exc, self.target) from exc
        except Exception as exc:
            if not faults.is_foreign(exc):
                raise
            error = faults.translate(exc, self.target)
            arrived = faults.request_may_have_arrived(exc)
            if first and not arrived:
                self.mutated = False  # never sent: nothing changed
            if error.code in ("timeout", "unreachable") and (destructive or arrived):
                raise errors.OutcomeUnknown(
                    f"target '{self.target}': the answer to {what} was lost ({error.code}); it may have "
                    "taken effect. Do not retry: read the affected objects again (or get_tasks) to see what "
                    "happened",
                    target=self.target, cause=error.code) from exc
            raise error from exc

    def task(self, method: Callable[..., Any], *args: Any, destructive: bool, label: str,
             progress: ProgressFn | None = None, **kwargs: Any) -> Any:
        """Start a task and wait for it (``timeout_seconds`` from now); return its result."""
        task = self.invoke(method, *args, destructive=destructive, what=label, **kwargs)
        started = getattr(self.progress, "task_started", None)
        if callable(started):  # an MCP task that may be cancelled (gateway.server.edge.mcp_tasks)
            started(task, self.target)
        return wait_for_task(self.session, task, deadline=time.monotonic() + self.timeout,
                             progress=progress or self.progress, destructive=destructive, label=label)

    def share(self, index: int, count: int) -> ProgressFn:
        """A progress function for step ``index`` of ``count`` equal steps of this call."""
        return split_progress(self.progress, index, count)

    def result(self, **fields: Any) -> dict[str, Any]:
        return {"target": self.target, **fields}


def split_progress(progress: ProgressFn, index: int, count: int) -> ProgressFn:
    """Report step ``index`` of ``count`` equal steps as its share of ``progress``'s 0..1."""
    def relay(fraction: float, message: str) -> None:
        progress((index + fraction) / count, message)
    return relay


ExecuteFn = Callable[[Any, Plan, ProgressFn], dict[str, Any]]


def _executor(body: Callable[[Execution], dict[str, Any]]) -> ExecuteFn:
    """Adapt ``body(call)`` to the ``execute(session, plan, progress)`` contract of ``ToolSpec``."""
    @functools.wraps(body)
    def execute(session: Any, plan: Plan, progress: ProgressFn) -> dict[str, Any]:
        call = Execution(session, plan, progress)
        try:
            return body(call)
        except vim.fault.NotAuthenticated as exc:
            if not call.mutated:
                raise
            raise faults.translate(exc, call.target) from exc
        except (errors.Unreachable, errors.Timeout) as exc:
            # A read after the change (the clone's facts, a power state) lost the connection: the change
            # itself was made or is under way, so "worth a retry" would be a lie.
            if not call.mutated or "task" in exc.details:
                raise
            raise errors.OutcomeUnknown(
                f"target '{call.target}': the connection was lost after the change was sent ({exc.code}); "
                "it may have taken effect. Do not retry: read the affected objects again (or get_tasks) "
                "to see what happened", target=call.target, cause=exc.code) from exc
    return execute


def _power_state(call: Execution, moid: str | None = None) -> str | None:
    moid = moid or str(call.params["vm"])
    state = _read(call.session, vim.VirtualMachine, moid, ("runtime.powerState",)).get("runtime.powerState")
    return str(state) if state is not None else None
