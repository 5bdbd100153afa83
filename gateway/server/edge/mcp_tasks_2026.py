"""The tasks extension (``io.modelcontextprotocol/tasks``) as the 2026-07-28 revision speaks it.

A client that declares the extension on a request may get a task handle (``resultType: "task"``) for
the call; ``tasks/get`` shows it, with the tool's result once it ended; ``tasks/cancel`` stops it and
``tasks/update`` answers its input requests (this gateway's tasks never ask). No ``tasks/result`` or
``tasks/list``. ``mcp_tasks.TaskRunner`` serves both revisions from one store; this is what differs.

A call that must ask the person at the client asks before any task is made, as the extension composes
the multi-round-trip pattern with tasks: its first answer is ``input_required`` (``asked``: an
elicitation and the sealed ``requestState``, never a ``taskId``), and only the retry carrying the
person's accepting answer is made a task (``resultType: "task"``, never a ``requestState``): a confirmed
proposal runs in it, and a gated one, whose person was sent to its card, is followed (``follow``) until a
human decides it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple, Protocol

import mcp_types as types
from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from gateway.answer import Answer
from gateway.auth.principal import Principal
from gateway.guard.callers import key_of, same
from gateway.proposals import FINAL_STATES, OPEN_STATES, Proposal
from gateway.server.base.context import off_loop
from gateway.server.proposals.elicitation import ROUND_KEY, Ask
from gateway.server.proposals.views import proposal_view
from gateway.store.task_records import TaskRecord

EXTENSION: Final = "io.modelcontextprotocol/tasks"
#: how often a client should poll a task (``pollIntervalMs``; ``pollInterval`` on 2025-11-25)
POLL_MS: Final = 500


class UpdateTaskParams(types.RequestParams):
    """``tasks/update``: the task and the client's answers to its input requests."""

    task_id: str
    input_responses: dict[str, Any] = Field(default_factory=dict)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def modern(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the request speaks a revision with tasks as the extension (2026-07-28 on)."""
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def declares(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the request's own capabilities name the extension (a 2026-07-28 client declares per
    request; a task is never made for a request that does not)."""
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities is not None else None
    return extensions is not None and EXTENSION in extensions


def require_declared(ctx: ServerRequestContext[Any, Any]) -> None:
    """Refuse a tasks/* request that does not declare the extension, as the extension says."""
    if not declares(ctx):
        raise MCPError(code=types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                       message=f"tasks/* needs the {EXTENSION} extension in this request's capabilities",
                       data={"requiredCapabilities": {"extensions": {EXTENSION: {}}}})


def check_routing(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    """Refuse a tasks/* request whose ``Mcp-Name`` header is not its ``taskId`` (the extension's routing
    header, which proxies route on; the SDK checks it only for tools, prompts and resources)."""
    headers = getattr(ctx.request, "headers", None)
    named = headers.get("mcp-name") if headers is not None else None
    if named is not None and named != task_id:
        raise MCPError(code=types.HEADER_MISMATCH, message=f"the Mcp-Name header ({named[:64]!r}) is not "
                       f"this request's taskId")


def not_on_this_revision(method: str, protocol_version: str) -> MCPError:
    return MCPError(code=types.METHOD_NOT_FOUND, message=f"{method} is not a method of the "
                    f"{protocol_version} revision", data=method)


def advertise(result: HandlerResult) -> HandlerResult:
    """A ``server/discover`` answer offering the extension (no settings: an empty object)."""
    if isinstance(result, dict) and isinstance(result.get("capabilities"), dict):
        capabilities = result["capabilities"]
        given = capabilities.get("extensions")
        capabilities["extensions"] = {**(given if isinstance(given, Mapping) else {}), EXTENSION: {}}
    return result


def asks_for_input(params: Mapping[str, Any]) -> bool:
    """A multi-round-trip retry (``inputResponses``, ``requestState``): answered in the call, never as a
    task (the extension resolves those rounds before a task is made)."""
    return params.get("inputResponses") is not None or params.get("requestState") is not None


def owned_by(rec: TaskRecord, principal: Principal) -> bool:
    """Whether ``rec`` is ``principal``'s task: by key (``callers.same``), never by the name it shows."""
    return same(rec.caller_key, key_of(principal))


def status_of(rec: TaskRecord) -> str:
    """The extension's status of a task."""
    # a tool's error (the gateway's ``{"error": ...}`` answer) is a completed call with ``isError``:
    # ``failed`` is for JSON-RPC errors only, and a task here never ends in one
    return "completed" if rec.status == "failed" else rec.status


def _task(rec: TaskRecord) -> dict[str, Any]:
    wire: dict[str, Any] = {"taskId": rec.task_id, "status": status_of(rec), "createdAt": iso(rec.created_at),
                            "lastUpdatedAt": iso(rec.updated_at), "pollIntervalMs": POLL_MS,
                            "ttlMs": round((rec.keep_until - rec.created_at) * 1000)}
    message = rec.status_message
    if message is None and rec.status == "working" and rec.progress is not None:
        message = f"{round(rec.progress * 100)}%"
    if message:
        wire["statusMessage"] = message
    return wire


def created(rec: TaskRecord, server_info: dict[str, Any]) -> dict[str, Any]:
    """The answer to a tools/call made a task (``CreateTaskResult``), stamped as the SDK stamps every
    2026-07-28 result."""
    return {"resultType": "task", **_task(rec), "_meta": {types.SERVER_INFO_META_KEY: server_info}}


def detailed(rec: TaskRecord) -> dict[str, Any]:
    """``tasks/get``'s answer: the task, and once it completed the tool's result (``CallToolResult``)."""
    wire = {"resultType": "complete", **_task(rec)}
    if wire["status"] == "completed":
        wire["result"] = {"content": [{"type": "text", "text": rec.result or "{}"}], "isError": rec.failed}
    return wire


def input_required(asked: Ask, request_state: str) -> types.InputRequiredResult:
    """The first round's answer on 2026-07-28: the question for the person, and the sealed state."""
    params: types.ElicitRequestParams
    if asked.mode == "url" and asked.url is not None:
        params = types.ElicitRequestURLParams(message=asked.message, url=asked.url)
    else:
        params = types.ElicitRequestFormParams(message=asked.message,
                                               requested_schema=asked.schema or {"type": "object"})
    return types.InputRequiredResult(input_requests={ROUND_KEY: types.ElicitRequest(params=params)},
                                     request_state=request_state)


def asked(question: Ask, request_state: str, server_info: dict[str, Any]) -> dict[str, Any]:
    """``input_required`` as the answer of a task tool's call (the edge's middleware answers it, so it is
    stamped here, as the SDK stamps every 2026-07-28 result)."""
    wire = input_required(question, request_state).model_dump(by_alias=True, mode="json", exclude_none=True)
    return {**wire, "_meta": {types.SERVER_INFO_META_KEY: server_info}}


class Proposals(Protocol):
    """Where a followed proposal is read (the state store)."""

    def get_proposal(self, proposal_id: str) -> Proposal | None: ...


class Seen(NamedTuple):
    """The end of following a proposal: the proposal as shown, whether that is an error (its run failed,
    or its outcome is unknown), and whether the proposal still waits (the following was stopped)."""

    answer: Answer
    failed: bool
    waits: bool = False


async def look(store: Proposals, proposal_id: str, now: float, *, stopped: bool, note: str) -> Seen | str:
    """One look at a followed proposal: its end, once a human decided it on its card (through any replica),
    it expired or ``stopped`` (then as it is, with ``note``); else the message of its wait."""
    proposal = await off_loop(store.get_proposal, proposal_id)
    if proposal is None:
        gone = {"error": {"code": "not_found", "message": f"proposal {proposal_id} is gone"}}
        return Seen(await off_loop(Answer.of, gone), True)
    overdue = proposal.state in OPEN_STATES and now >= proposal.expires_at
    if proposal.state not in FINAL_STATES and not overdue and not stopped:
        return f"proposal {proposal_id} is {proposal.state}: waiting for its approval on its card"
    view = await off_loop(proposal_view, proposal, now)  # redacted: regexes, never on the loop
    if proposal.state not in FINAL_STATES:
        view.update({"state": "expired"} if overdue else {"note": note})  # the sweeper moves it so soon
    return Seen(await off_loop(Answer.cleaned, view), proposal.state in ("failed", "outcome_unknown"),
                waits=proposal.state not in FINAL_STATES and not overdue)


async def follow(store: Proposals, proposal_id: str, *, clock: Callable[[], float],
                 stopped: Callable[[], bool], waiting: Callable[[str], Awaitable[None]],
                 note: str) -> tuple[Answer, bool]:
    """``look`` at a gated proposal every ``POLL_MS`` until it ends (or ``stopped()``); ``waiting`` is told
    each new state it waits in."""
    shown = ""
    while True:
        seen = await look(store, proposal_id, clock(), stopped=stopped(), note=note)
        if not isinstance(seen, str):
            return seen.answer, seen.failed
        if seen != shown:
            shown = seen
            await waiting(seen)
        await asyncio.sleep(POLL_MS / 1000)
