"""Task status notifications on 2026-07-28: ``subscriptions/listen`` naming ``taskIds``.

The tasks extension lets a client that declares it open a listen stream for some of its tasks and be sent
``notifications/tasks`` (the task as ``tasks/get`` shows it) each time one changes, instead of polling.
Only the caller's own tasks are honoured (``callers.same`` on the task's key, as ``tasks/get`` decides);
the acknowledgement names them, and an id that is someone else's, unknown or expired is left out as if
it never existed (one ``refused`` row says how many were). The stream reads the task store, so a task
running on another replica is followed too. It ends, gracefully, once every honoured task has ended and
been sent, or when its tasks are no longer kept; the client ends it by closing it. The revision's other
notification kinds (list changes, resources) are never sent by this gateway, so they are not honoured.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, Protocol

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from pydantic import BaseModel

from gateway.auth.tokens import Principal, caller_fields
from gateway.guard.callers import key_of
from gateway.server.base.context import off_loop
from gateway.server.edge import mcp_tasks_2026 as extension
from gateway.server.edge.middleware import correlation_id_var
from gateway.store.task_records import TaskRecord

#: the task ids one stream follows at most (more are not honoured)
MAX_TASK_IDS: Final = 64
#: listen streams open at once, per caller and in all
MAX_STREAMS_PER_CALLER: Final = 4
MAX_STREAMS: Final = 256


class Tasks(Protocol):
    """Where tasks are read (``gateway.store.task_records.TaskTable``)."""

    def get(self, task_id: str, now: float) -> TaskRecord | None: ...


class Trail(Protocol):
    async def record(self, row: Mapping[str, Any]) -> None: ...


class TaskNotice(BaseModel):
    """``notifications/tasks``: the task as ``tasks/get`` would show it now (the SDK's session sends any
    model with a method and params)."""

    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


def requested_ids(notifications: types.SubscriptionFilter) -> list[str] | None:
    """The ``taskIds`` a listen asks for (an extension's key of the filter), None when it names none."""
    extra = notifications.model_extra or {}
    given = extra.get("taskIds")
    if given is None:
        return None
    if not isinstance(given, list) or not all(isinstance(i, str) for i in given):
        raise MCPError(code=types.INVALID_PARAMS, message="notifications.taskIds must be a list of task id "
                       "strings")
    return list(dict.fromkeys(given))  # once each, in the order given


def notice_of(rec: TaskRecord, meta: Mapping[str, Any]) -> TaskNotice:
    """The notification of ``rec`` now: ``tasks/get``'s task, without the answer's ``resultType``."""
    task = {k: v for k, v in extension.detailed(rec).items() if k != "resultType"}
    return TaskNotice(params={**task, "_meta": dict(meta)})


def _shown(rec: TaskRecord) -> tuple[Any, ...]:
    """What a notification shows of a task: a new notification only when it changed."""
    return rec.status, rec.updated_at, rec.status_message, rec.progress, rec.failed


class TaskNotices:
    """The ``subscriptions/listen`` handler for task ids (see the module docstring)."""

    def __init__(self, table: Tasks, principal_of: Callable[[], Principal | None], trail: Trail, *,
                 clock: Callable[[], float] = time.time,
                 poll_seconds: float = extension.POLL_MS / 1000) -> None:
        self.table, self.principal_of, self.trail = table, principal_of, trail
        self.clock, self.poll_seconds = clock, poll_seconds
        self._open: dict[str, int] = {}  # streams open now, by caller key

    async def listen(self, ctx: ServerRequestContext[Any, Any],
                     params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
        wanted = requested_ids(params.notifications)
        if wanted is not None and not extension.declares(ctx):
            raise MCPError(code=types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                           message=f"task notifications need the {extension.EXTENSION} extension in this "
                                   "request's capabilities",
                           data={"requiredCapabilities": {"extensions": {extension.EXTENSION: {}}}})
        principal = self.principal_of()
        if principal is None:
            raise MCPError(code=types.INVALID_REQUEST,
                           message="this request carries no authenticated caller; send a bearer token")
        if ctx.request_id is None:
            raise MCPError(code=types.INVALID_REQUEST, message="subscriptions/listen needs a request id")
        caller = str(key_of(principal))
        if self._open.get(caller, 0) >= MAX_STREAMS_PER_CALLER or sum(self._open.values()) >= MAX_STREAMS:
            raise MCPError(code=types.INVALID_REQUEST,
                           message=f"too many listen streams open (at most {MAX_STREAMS_PER_CALLER} per "
                                   "caller); close one, or poll tasks/get")
        self._open[caller] = self._open.get(caller, 0) + 1
        try:
            return await self._serve(ctx, principal, wanted or [], ctx.request_id)
        finally:
            self._open[caller] -= 1
            if not self._open[caller]:
                del self._open[caller]

    async def _serve(self, ctx: ServerRequestContext[Any, Any], principal: Principal, wanted: list[str],
                     subscription: types.RequestId) -> types.SubscriptionsListenResult:
        meta = {SUBSCRIPTION_ID_META_KEY: subscription}
        found = await off_loop(self._read, wanted[:MAX_TASK_IDS])
        honored = [task_id for task_id, rec in found.items()
                   if rec is not None and extension.owned_by(rec, principal)]
        if len(honored) < len(wanted):
            await self.trail.record({"phase": "refused", "tool": "subscriptions/listen",
                                     **caller_fields(principal), "task_ids": len(wanted) - len(honored),
                                     "error_code": "not_found", "reason_code": "not_your_task",
                                     "outcome": "refused", "correlation_id": correlation_id_var.get()})
        await ctx.session.send_notification(
            types.SubscriptionsAcknowledgedNotification(params=types.SubscriptionsAcknowledgedNotificationParams(
                notifications=types.SubscriptionFilter(taskIds=honored), _meta=meta)),  # type: ignore[call-arg]
            related_request_id=subscription)
        shown: dict[str, tuple[Any, ...]] = {}
        following = {task_id: found[task_id] for task_id in honored}
        while following:
            for task_id, rec in list(following.items()):
                if rec is None:  # no longer kept: nothing more to say of it
                    del following[task_id]
                    continue
                if shown.get(task_id) != _shown(rec):
                    shown[task_id] = _shown(rec)
                    await ctx.session.send_notification(notice_of(rec, meta),  # type: ignore[arg-type]
                                                        related_request_id=subscription)
                if rec.terminal:
                    del following[task_id]
            if not following:
                break
            await asyncio.sleep(self.poll_seconds)
            following = await off_loop(self._read, list(following))
        return types.SubscriptionsListenResult(_meta=meta)

    def _read(self, task_ids: list[str]) -> dict[str, TaskRecord | None]:
        now = self.clock()
        return {task_id: self.table.get(task_id, now) for task_id in task_ids}
