"""MCP tasks for long vSphere work (clone, migrate, snapshots, confirmed runs), on both revisions.

A task-augmented tools/call is answered at once and runs through the same path as a blocking one; its
progress and outcome live in the store, so any replica answers tasks/* for its caller (2025-11-25: get,
result, list, cancel; 2026-07-28, the extension of ``mcp_tasks_2026``: get, update, cancel), and
tasks/cancel asks vSphere to cancel (through the store on another replica).

On 2026-07-28 the person at the client is asked before a task is made. A call from a client that can be
asked (it declares elicitation) runs until it asks (then its answer is ``input_required``, and no task
exists), ends, or starts its vSphere work (then it is a task from there on: the handle comes once vSphere
has the task, not at once). The retry carrying the person's accepting answer is the task: a confirmed
proposal runs in it, and a gated one (the person was sent to its card) is followed until it is decided
and run, or denied, or expires. Any other retry is answered in the call."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from gateway.answer import Answer
from gateway.auth.tokens import Principal, caller_fields
from gateway.errors import GatewayError, OutcomeUnknown
from gateway.guard import confirm
from gateway.guard.callers import key_of
from gateway.guard.idempotency_rules import KEY_FIELD
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.context import client_of, mcp_client_var, off_loop
from gateway.server.call.idempotency import key_from_meta, key_id
from gateway.server.edge import mcp_tasks_2026 as extension
from gateway.server.edge.mcp_tasks_2026 import POLL_MS, iso
from gateway.server.edge.middleware import correlation_id_var
from gateway.server.proposals.elicitation import Asker, asker_of, asker_var, person_action
from gateway.server.proposals.request_state import Rounds, RoundState
from gateway.store.task_records import TaskRecord, TaskTable
from gateway.vsphere.task_waiter import cancel_task

log = logging.getLogger(__name__)

#: the tools a client may run as tasks (long vSphere work)
TASK_TOOLS: Final = frozenset({"clone_vm", "migrate_vm", "create_snapshot", "confirm_action"})
TASKS_REVISION: Final = "2025-11-25"
CAPABILITY: Final[dict[str, Any]] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
#: how many tasks start between two sweeps of tasks past their keeping time
SWEEP_EVERY: Final = 64
RELATED: Final = "io.modelcontextprotocol/related-task"
#: why a task could not be cancelled yet: its call has started no vSphere task (queued or planning)
NOT_STARTED: Final = "the vSphere task has not started yet (the call is queued or planning); ask again"

#: why a followed proposal's task stopped when cancelled (the proposal itself stays as it is)
STOPPED_FOLLOWING: Final = ("stopped following the proposal; it still waits for its approval: "
                            "cancel_action withdraws it")
#: the wait of a followed proposal's task, shown by a replica after the process following it died
ORPHAN_FOLLOWED: Final = ("the gateway process that followed it stopped; each look at this task reads the "
                          "proposal")

AnswerFn = Callable[..., Awaitable[Answer]]
#: ``Calls.observed``: counts what runs inside as one call of a tool in the call metric
Observed = Callable[[str, Mapping[str, Any] | None], contextlib.AbstractContextManager[None]]
#: (status, the result's text, whether it is an error, the status message)
Outcome = tuple[str, str, bool, str | None]


class Instances(Protocol):
    def acquire(self) -> str: ...

    def alive(self, instance_id: str) -> bool: ...


def task_wire(rec: TaskRecord) -> dict[str, Any]:
    """A task as the protocol shows it (``Task``)."""
    wire: dict[str, Any] = {"taskId": rec.task_id, "status": rec.status, "createdAt": iso(rec.created_at),
                            "lastUpdatedAt": iso(rec.updated_at),
                            "ttl": round((rec.keep_until - rec.created_at) * 1000), "pollInterval": POLL_MS}
    message = rec.status_message  # while working, the last progress message ("...: 40%")
    if message is None and rec.status == "working" and rec.progress is not None:
        message = f"{round(rec.progress * 100)}%"
    if message:
        wire["statusMessage"] = message
    return wire


class _Progress:
    """The progress sink of one task: its row's progress, and the vSphere tasks it started (to cancel)."""

    def __init__(self, runner: TaskRunner, task_id: str, *, stored: bool = True) -> None:
        self.runner, self.task_id = runner, task_id
        self.started: list[tuple[Any, str]] = []
        self.lock = threading.Lock()
        self.cancel_asked = False
        #: whether the task's row exists (a call that may still ask its person has none yet)
        self.stored = stored
        #: set once the call's vSphere work has begun (progress, or a vSphere task started)
        self.began = asyncio.Event()
        #: the task follows a gated proposal decided elsewhere (it runs no vSphere work of its own)
        self.following = False
        self._loop = asyncio.get_running_loop()
        self._last = -1.0
        self._unstored: tuple[float, str] | None = None

    async def __call__(self, fraction: float, message: str) -> None:
        self.began.set()
        if fraction < 1.0 and fraction - self._last < 0.05:
            return
        self._last = fraction
        if not self.stored:  # written once the row is (``store``)
            self._unstored = (fraction, message)
            return
        await self._write(fraction, message)

    async def _write(self, fraction: float, message: str) -> None:
        try:
            await off_loop(self.runner.table.progress, self.task_id, fraction, message, self.runner.clock())
        except GatewayError:
            log.warning("progress of task %s not recorded", self.task_id)

    async def store(self, rec: TaskRecord) -> None:
        """The task's row, made now, with the progress reported before it existed."""
        await off_loop(self.runner.table.add, rec)
        self.stored = True
        if self._unstored is not None:
            await self._write(*self._unstored)

    def follow_proposal(self) -> None:
        """From now on the task follows a proposal decided elsewhere: a cancel stops following."""
        self.following = True

    def task_started(self, task: Any, target: str) -> None:
        """Called in the worker thread for each vSphere task the call starts."""
        with self.lock:
            self.started.append((task, target))
        self._loop.call_soon_threadsafe(self.began.set)

    async def cancel(self) -> str | None:
        """Cancel the vSphere task running now; None when vSphere accepted, else why not (``NOT_STARTED``:
        none runs yet, and nothing is asked of vSphere). A task following a proposal stops following."""
        if self.following:
            self.cancel_asked = True
            return None
        with self.lock:
            current = self.started[-1] if self.started else None
        if current is None:
            return NOT_STARTED
        self.cancel_asked = True
        return await asyncio.to_thread(cancel_task, *current)


class TaskRunner:
    """Runs task-augmented tool calls and answers the tasks/* requests from the store."""

    def __init__(self, answer: AnswerFn, table: TaskTable, principal_of: Callable[[], Principal | None], *,
                 instance: Instances, trail: AuditTrail, keep_seconds: float,
                 clock: Callable[[], float] = time.time, rounds: Rounds | None = None,
                 observed: Observed | None = None) -> None:
        self.answer, self.table, self.principal_of = answer, table, principal_of
        #: how a round's retry counts in the call metric (``Calls.observed``, as the edge's retry counts)
        self.observed: Observed = observed or (lambda _tool, _args: contextlib.nullcontext())
        self.instance, self.trail = instance, trail
        self.keep_seconds, self.clock = keep_seconds, clock
        #: 2026-07-28 confirmation rounds (None: such a client's person is never asked before a task)
        self.rounds = rounds
        self._started = 0
        self._local: dict[str, tuple[asyncio.Task[None], _Progress]] = {}
        self._server_info: Callable[[], dict[str, Any]] = dict

    def install(self, server: Server[Any]) -> None:
        """The tasks/* methods of both revisions (each refuses what its revision lacks) and the middleware
        that offers tasks and starts them."""
        server.add_request_handler("tasks/get", types.GetTaskRequestParams, self.get)
        server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, self.result)
        server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self.cancel)
        server.add_request_handler("tasks/list", types.PaginatedRequestParams, self.list)
        server.add_request_handler("tasks/update", extension.UpdateTaskParams, self.update)
        server.middleware.append(self.middleware)
        self._server_info = lambda: server.server_info_stamp

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "initialize":
            result = await call_next(ctx)
            if isinstance(result, dict) and isinstance(result.get("capabilities"), dict):
                result["capabilities"]["tasks"] = CAPABILITY
            return result
        if ctx.method == "server/discover":
            return extension.advertise(await call_next(ctx))
        params = ctx.params
        if (ctx.method != "tools/call" or not isinstance(params, Mapping)
                or params.get("name") not in TASK_TOOLS):
            return await call_next(ctx)
        if extension.modern(ctx):  # the server decides; only for a request declaring the extension
            if not extension.declares(ctx):
                return await call_next(ctx)
        elif params.get("task") is None or ctx.protocol_version != TASKS_REVISION:
            return await call_next(ctx)
        principal = self.principal_of()
        if principal is None:
            return await call_next(ctx)  # refused there, as any call without a caller
        if not extension.modern(ctx):
            asked = params.get("task")
            ttl = asked.get("ttl") if isinstance(asked, dict) else None
            return {"task": task_wire(await self._start(ctx, principal, params, ttl))}
        return await self._modern_call(ctx, call_next, principal, params)

    async def _modern_call(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext,
                           principal: Principal, params: Mapping[str, Any]) -> HandlerResult:
        """A 2026-07-28 call of a task tool declaring the extension: a task, or first its person's round."""
        if extension.asks_for_input(params):  # a round's retry: a task only for an accepting answer
            state = await self._accepted(principal, params)
            if state is None:
                return await call_next(ctx)  # answered (or refused and audited) in the call
            return extension.created(await self._start(ctx, principal, params, None, accepted=state),
                                     self._server_info())
        asker = asker_of(ctx, rounds=self.rounds is not None)
        if asker is not None and asker.rounds is not None:  # its person may be asked first
            return await self._start_or_ask(ctx, principal, params, asker)
        return extension.created(await self._start(ctx, principal, params, None), self._server_info())

    async def _accepted(self, principal: Principal, params: Mapping[str, Any]) -> RoundState | None:
        """The state of a retry whose person accepted, when ``Rounds.answer`` would take it; else None."""
        if self.rounds is None or person_action(params.get("inputResponses")) != "accept":
            return None
        arguments = params.get("arguments")
        return await self.rounds.peek(principal, str(params["name"]),
                                      arguments if isinstance(arguments, Mapping) else None,
                                      params.get("requestState"))

    async def _start_or_ask(self, ctx: ServerRequestContext[Any, Any], principal: Principal,
                            params: Mapping[str, Any], asker: Asker) -> dict[str, Any]:
        """Run a call whose person may be asked: ``input_required`` (and no task) when it asks, else a task
        from the moment its vSphere work begins (or it ends)."""
        rec, sink, call = await self._begin(ctx, principal, params, None, asker=asker)
        if isinstance(call, TaskRecord):  # a retry with the idempotency key: the task its first call made
            return extension.created(call, self._server_info())
        began = asyncio.ensure_future(sink.began.wait())
        try:
            await asyncio.wait({call, began}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the request went away before a task was made: as a blocking call
            call.cancel()
            raise
        finally:
            began.cancel()
        question = asker.rounds.asked if asker.rounds is not None else None
        if call.done() and question is not None and self.rounds is not None:
            arguments = params.get("arguments")
            state = await self.rounds.seal(principal, rec.tool,
                                           arguments if isinstance(arguments, Mapping) else None, question)
            return extension.asked(question, state, self._server_info())
        await sink.store(rec)
        self._track(rec, sink, call)
        return extension.created(rec, self._server_info())

    async def _start(self, ctx: ServerRequestContext[Any, Any], principal: Principal,
                     params: Mapping[str, Any], ttl: Any, *,
                     accepted: RoundState | None = None) -> TaskRecord:
        """Record the task and start its call (``accepted``: the retry of a round, its person's accepting
        answer); ``ttl``: how long the client asks its result be kept (ms; 2025-11-25 only: on 2026-07-28
        the server says)."""
        rec, sink, call = await self._begin(ctx, principal, params, ttl, accepted=accepted)
        if isinstance(call, TaskRecord):
            return call
        self._track(rec, sink, call)
        return rec

    async def _begin(self, ctx: ServerRequestContext[Any, Any], principal: Principal,
                     params: Mapping[str, Any], ttl: Any, *, asker: Asker | None = None,
                     accepted: RoundState | None = None,
                     ) -> tuple[TaskRecord, _Progress, asyncio.Task[Outcome] | TaskRecord]:
        """The task's record (stored at once unless the call may still ask its person: ``asker``) and its
        call, started; or the task a first call with the same idempotency key made."""
        now = self.clock()
        keep = self.keep_seconds
        if isinstance(ttl, int | float) and ttl > 0:
            keep = min(ttl / 1000, keep)
        if accepted is not None:  # a followed proposal may wait until it expires: kept that long, and after
            keep = max(keep, accepted.expires_at - now + self.keep_seconds)
        given = params.get("arguments")
        arguments: dict[str, Any] = dict(given) if isinstance(given, dict) else {}
        target = arguments.get("target") if isinstance(arguments.get("target"), str) else None
        self._started += 1
        if self._started % SWEEP_EVERY == 1:
            await off_loop(self.table.sweep, now)  # tasks past the time their results are kept
        arguments = key_from_meta(ctx.meta, arguments)
        given_key, tool = arguments.get(KEY_FIELD), str(params["name"])
        key = digest = None
        if isinstance(given_key, str):  # a retry with the key gets the task its first call started
            key = key_id(given_key)  # the store never holds the key (``server.call.idempotency``)
            plain = {k: v for k, v in arguments.items() if k != KEY_FIELD}
            digest = confirm.args_digest(tool, str(target), plain)
            again = await off_loop(self.table.by_key, key_of(principal), key, digest, now)
            if again is not None:
                return again, _Progress(self, again.task_id), again
        owner = await off_loop(self.instance.acquire)
        follows = accepted.proposal_id if accepted is not None and accepted.mode == "url" else None
        rec = TaskRecord(uuid.uuid4().hex, principal.name, tool, target, "working", now, now, now + keep,
                         owner=owner, idempotency_key=key, digest=digest, caller_key=key_of(principal),
                         follows=follows)
        sink = _Progress(self, rec.task_id, stored=asker is None)
        if asker is None:
            await off_loop(self.table.add, rec)
        correlation_id = correlation_id_var.get() or uuid.uuid4().hex
        context = contextvars.copy_context()  # the call's own: its client, and how its person is asked
        context.run(mcp_client_var.set, client_of(ctx))
        context.run(asker_var.set, asker)
        if accepted is not None:
            base_url = str(getattr(ctx.request, "base_url", "") or "")
            work = self._round(principal, params, accepted, sink, correlation_id, base_url)
        else:
            work = self._call(principal, rec.tool, arguments, sink, correlation_id)
        call = asyncio.get_running_loop().create_task(self._outcome(rec, work, sink, correlation_id),
                                                      context=context)
        return rec, sink, call

    def _track(self, rec: TaskRecord, sink: _Progress, call: asyncio.Task[Outcome]) -> None:
        """Record ``call``'s outcome in the task's (stored) row when it ends; cancellations act on it."""
        job = asyncio.get_running_loop().create_task(self._run(rec, sink, call))
        self._local[rec.task_id] = (job, sink)
        job.add_done_callback(lambda _job: self._local.pop(rec.task_id, None))

    async def _call(self, principal: Principal, tool: str, arguments: dict[str, Any], sink: _Progress,
                    correlation_id: str) -> tuple[Answer, bool]:
        answer = await self.answer(principal, tool, arguments, progress=sink, correlation_id=correlation_id)
        return answer, False

    async def _round(self, principal: Principal, params: Mapping[str, Any], state: RoundState,
                     sink: _Progress, correlation_id: str, base_url: str) -> tuple[Answer, bool]:
        """A round's accepting retry: answered as the call would answer it (``Rounds.answer``: spent,
        audited, a confirmed proposal run); a person sent to a gated proposal's card is then followed
        until the proposal is decided."""
        assert self.rounds is not None
        given = params.get("arguments")
        arguments = given if isinstance(given, Mapping) else None
        with self.observed(str(params["name"]), arguments):  # the call's second round
            answer = await self.rounds.answer(
                principal, str(params["name"]), arguments, params.get("requestState"),
                params.get("inputResponses"), correlation_id=correlation_id, client=mcp_client_var.get(),
                progress=sink, base_url=base_url)
        if state.mode != "url":
            return (answer if isinstance(answer, Answer) else await off_loop(Answer.cleaned, answer)), False
        return await self._follow(state.proposal_id, sink)

    async def _follow(self, proposal_id: str, sink: _Progress) -> tuple[Answer, bool]:
        """Follow a gated proposal until a human decides it (``mcp_tasks_2026.follow``), its wait shown as
        the task's status message."""
        assert self.rounds is not None
        sink.follow_proposal()

        async def waiting(message: str) -> None:
            if sink.stored:
                await off_loop(self.table.progress, sink.task_id, 0.0, message, self.clock())

        return await extension.follow(self.rounds.flow.store, proposal_id, clock=self.clock,
                                      stopped=lambda: sink.cancel_asked, waiting=waiting,
                                      note=STOPPED_FOLLOWING)

    async def _outcome(self, rec: TaskRecord, work: Awaitable[tuple[Answer, bool]], sink: _Progress,
                       correlation_id: str) -> Outcome:
        """What the task's call came to, as its row records it (errors are the tool's result)."""
        try:
            answer, failed = await work
            if sink.following and sink.cancel_asked:
                return "cancelled", answer.text, False, STOPPED_FOLLOWING
            return "completed", answer.text, failed, None
        except GatewayError as exc:
            status = "cancelled" if sink.cancel_asked else "failed"
            return status, Answer.of({"error": exc.to_wire()}).text, True, exc.message[:512]
        except Exception:
            log.exception("task %s (%s) failed (correlation id %s)", rec.task_id, rec.tool, correlation_id)
            message = f"internal error (see server log, correlation id {correlation_id})"
            text = Answer.of({"error": {"code": "internal", "message": message}}).text
            return "failed", text, True, message

    async def _run(self, rec: TaskRecord, sink: _Progress, call: asyncio.Task[Outcome]) -> None:
        watcher = asyncio.get_running_loop().create_task(self._watch_cancel(rec.task_id, sink))
        try:
            status, text, failed, message = await call
            await off_loop(self.table.finish, rec.task_id, status, text, failed=failed, message=message,
                           now=self.clock())
        finally:
            watcher.cancel()

    async def _audit_cancel(self, rec: TaskRecord, outcome: str, why: str | None) -> None:
        """Every tasks/cancel is a row: cancelled in vSphere, refused by it, or passed to the replica
        running the task."""
        principal = self.principal_of()
        who = caller_fields(principal) if principal else {"caller": rec.caller, "caller_key": rec.caller_key}
        await self.trail.record({"phase": "task_cancel", "tool": rec.tool, "target": rec.target, **who,
                                 "task_id": rec.task_id, "outcome": outcome, "error": why,
                                 "correlation_id": correlation_id_var.get()})

    async def _watch_cancel(self, task_id: str, sink: _Progress) -> None:
        """Act on a cancellation stored in the task's row: asked through another replica, or (2026-07-28)
        before vSphere ran the task, done once it runs."""
        while not sink.cancel_asked:
            await asyncio.sleep(1.0)
            try:
                rec = await off_loop(self.table.get, task_id, self.clock())
            except GatewayError:
                continue
            if rec is not None and rec.cancel_requested and not sink.cancel_asked:
                why = await sink.cancel()
                if why != NOT_STARTED:  # else asked again on the next look
                    await self._audit_cancel(rec, "refused" if why else "cancelled", why)

    async def _mine(self, task_id: str, request: str, *, modern: bool = False) -> TaskRecord:
        """The caller's task ``task_id`` (``_owned``), settled first when its process died (``_orphaned``)."""
        rec = await self._owned(task_id, request, modern=modern)
        return await self._orphaned(rec) if await self._orphan(rec) else rec

    async def _owned(self, task_id: str, request: str, *, modern: bool) -> TaskRecord:
        """The caller's task ``task_id`` (``callers.same`` on its key); any other answer is refused, and
        the refusal is a row (``request``: tasks/get, tasks/result, tasks/cancel, tasks/update)."""
        principal = self.principal_of()
        rec = await off_loop(self.table.get, task_id, self.clock())
        if principal is None or rec is None or not extension.owned_by(rec, principal):
            who = caller_fields(principal) if principal else {"caller": "-"}
            await self.trail.record({"phase": "refused", "tool": request, **who, "task_id": task_id[:64],
                                     "error_code": "not_found", "reason_code": "not_your_task",
                                     "outcome": "refused", "correlation_id": correlation_id_var.get()})
            where = "its ttlMs is how long it is kept" if modern else "call tasks/list"
            raise MCPError(code=types.INVALID_PARAMS, message=f"no task '{task_id[:64]}' of yours (never "
                           f"made, someone else's, or its results expired); {where}")
        return rec

    async def _orphan(self, rec: TaskRecord) -> bool:
        """Whether ``rec`` is working with nobody running it: the process that did is gone."""
        return (rec.status == "working" and rec.task_id not in self._local and rec.owner is not None
                and not await off_loop(self.instance.alive, rec.owner))

    async def _orphaned(self, rec: TaskRecord, *, stop: bool = False) -> TaskRecord:
        """A working task whose process is gone. One that ran a call: failed, its outcome unknown. One that
        followed a proposal (``follows``) ran nothing itself: the proposal is read in its stead, so the
        task ends as the proposal did, or (``stop``) is cancelled while the proposal still waits, or works
        on, showing its wait, for whoever asks next."""
        now = self.clock()
        if rec.follows is not None and self.rounds is not None:
            seen = await extension.look(self.rounds.flow.store, rec.follows, now, stopped=stop,
                                        note=STOPPED_FOLLOWING)
            if isinstance(seen, str):
                waits = f"{seen} ({ORPHAN_FOLLOWED})"
                if waits == rec.status_message:
                    return rec  # as the last look left it: nothing to write
                await off_loop(self.table.progress, rec.task_id, 0.0, waits, now)
            else:  # as the proposal ended; or, still waiting, no longer followed
                status, message = ("cancelled", STOPPED_FOLLOWING) if seen.waits else ("completed", None)
                await off_loop(self.table.finish, rec.task_id, status, seen.answer.text, failed=seen.failed,
                               message=message, now=now)
        else:
            unknown = OutcomeUnknown("the gateway process running this task stopped before it finished; "
                                     "whether the change happened is unknown: check the objects and "
                                     "get_tasks")
            await off_loop(self.table.finish, rec.task_id, "failed",
                           Answer.of({"error": unknown.to_wire()}).text, failed=True, message=unknown.message,
                           now=now)
        found = await off_loop(self.table.get, rec.task_id, self.clock())
        return found or rec

    async def get(self, ctx: ServerRequestContext[Any], params: types.GetTaskRequestParams) -> dict[str, Any]:
        if extension.modern(ctx):
            extension.require_declared(ctx)
            extension.check_routing(ctx, params.task_id)
            return extension.detailed(await self._mine(params.task_id, "tasks/get", modern=True))
        return task_wire(await self._mine(params.task_id, "tasks/get"))

    async def update(self, ctx: ServerRequestContext[Any],
                     params: extension.UpdateTaskParams) -> dict[str, Any]:
        """2026-07-28: answers to a task's input requests. This gateway's tasks never ask (confirmation is
        asked before a task is made), so every answer is for a request never made: ignored, as the
        extension says, once the task is known to be the caller's."""
        if not extension.modern(ctx):
            raise extension.not_on_this_revision("tasks/update", ctx.protocol_version)
        extension.require_declared(ctx)
        extension.check_routing(ctx, params.task_id)
        await self._mine(params.task_id, "tasks/update", modern=True)
        return {}

    async def list(self, ctx: ServerRequestContext[Any],
                   params: types.PaginatedRequestParams) -> dict[str, Any]:
        if extension.modern(ctx):  # the extension has none: no caller learns of another's tasks
            raise extension.not_on_this_revision("tasks/list", ctx.protocol_version)
        principal = self.principal_of()
        if principal is None:
            raise MCPError(code=types.INVALID_REQUEST, message="this request carries no authenticated caller")
        found = await off_loop(self.table.of_caller, key_of(principal), self.clock())
        return {"tasks": [task_wire(r) for r in found]}

    async def result(self, ctx: ServerRequestContext[Any],
                     params: types.GetTaskPayloadRequestParams) -> dict[str, Any]:
        """The tool's result once the task ended (waits for it)."""
        if extension.modern(ctx):  # tasks/get carries the result there
            raise extension.not_on_this_revision("tasks/result", ctx.protocol_version)
        rec = await self._mine(params.task_id, "tasks/result")
        while not rec.terminal:
            local = self._local.get(rec.task_id)
            if local is not None:
                await asyncio.wait({local[0]}, timeout=30)
            else:
                await asyncio.sleep(POLL_MS / 1000)
            rec = await self._mine(params.task_id, "tasks/result")
        return {"content": [{"type": "text", "text": rec.result or "{}"}], "isError": rec.failed,
                "_meta": {RELATED: {"taskId": rec.task_id}}}

    async def cancel(self, ctx: ServerRequestContext[Any],
                     params: types.CancelTaskRequestParams) -> dict[str, Any]:
        """Ask vSphere to cancel the task's running vSphere task (or the replica running it, through the
        store). 2025-11-25 answers with the task once it ended; 2026-07-28 with the extension's empty
        acknowledgement (the status follows on tasks/get), also for a task that already ended (the
        extension keeps -32602 for an unknown task) and for one whose vSphere task has not started yet
        (cancelled once it has). A refusal by vSphere is an error on both."""
        modern = extension.modern(ctx)
        if modern:
            extension.require_declared(ctx)
            extension.check_routing(ctx, params.task_id)
        rec = await self._owned(params.task_id, "tasks/cancel", modern=modern)
        if await self._orphan(rec):
            if rec.follows is not None:  # stops following here: nobody else does
                rec = await self._orphaned(rec, stop=True)
                await self._audit_cancel(rec, "cancelled" if rec.status == "cancelled" else "ended_already",
                                         None)
                return {} if modern else task_wire(rec)
            rec = await self._orphaned(rec)
        if rec.terminal and modern:
            await self._audit_cancel(rec, "ended_already", None)
            return {}
        if rec.terminal:
            status = extension.status_of(rec) if modern else rec.status
            raise MCPError(code=types.INVALID_PARAMS, message=f"task {rec.task_id} is {status} already")
        local = self._local.get(rec.task_id)
        if local is None:
            await off_loop(self.table.request_cancel, rec.task_id, self.clock())
            await self._audit_cancel(rec, "passed_on", None)
            return {} if modern else task_wire(rec)
        why = await local[1].cancel()
        if why == NOT_STARTED and modern:  # acknowledged; the watcher cancels once vSphere runs it
            await off_loop(self.table.request_cancel, rec.task_id, self.clock())
            await self._audit_cancel(rec, "deferred", None)
            return {}
        await self._audit_cancel(rec, "refused" if why else "cancelled", why)
        if why is not None:
            raise MCPError(code=types.INVALID_PARAMS,
                           message=f"{why}; the task runs on: poll it with tasks/get")
        if modern:
            return {}
        await asyncio.wait({local[0]}, timeout=10)
        return task_wire(await self._mine(rec.task_id, "tasks/cancel"))
