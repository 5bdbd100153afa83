"""The tasks extension (``io.modelcontextprotocol/tasks``) as the 2026-07-28 revision speaks it.

A client that declares the extension on a request may get a task handle (``resultType: "task"``) for
the call; ``tasks/get`` shows it, with the tool's result once it ended; ``tasks/cancel`` stops it and
``tasks/update`` answers its input requests (this gateway's tasks never ask). No ``tasks/result`` or
``tasks/list``. ``mcp_tasks.TaskRunner`` serves both revisions from one store; this is what differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import mcp_types as types
from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

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
