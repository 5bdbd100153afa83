"""The MCP server: tools/list and tools/call mapped onto the gateway, the same for every transport.

``build_mcp_server(gateway, principal_of)`` returns an ``mcp`` low-level ``Server``. Who is calling
comes from ``principal_of()``: over HTTP the authenticated token (``edge.current_principal``), over
stdio the local user (``stdio_principal``). A request without a caller is refused, never served.

tools/call answers with one text block holding the result's JSON (``gateway.answer``: encoded once,
in a worker thread, and the same bytes the audit row fingerprints), in three shapes:
- success: the tool's JSON object;
- an expected failure (``GatewayError``): ``isError`` with ``{"error": {"code", "message", ...}}``,
  written for the model to act on;
- anything else: ``isError`` with a generic message naming the correlation id; the traceback goes
  to the server log only.

On the 2026-07-28 revision a call whose proposal needs the person at the client answers
``input_required`` instead (an elicitation and a sealed ``requestState``), and the client's retry with
the person's answer goes to ``Rounds`` (``gateway.server.proposals.request_state``); on the handshake
revisions the person is asked by a request on the call's stream. Each request is served as its own
revision says.

No ``structuredContent`` block: the tools declare no output schema, so the protocol does not ask for
one, and sending the JSON twice (as text for the model, as an object for programs) doubled every
answer on both ends: at 3,000 VMs it made list_vms about twice as slow. Programs parse the text.

Over HTTP, ``AnswerAsJson`` (around the SDK's /mcp endpoint) sends an answer that needs no stream as
one JSON body: large results stay within what clients accept, and cost less on both ends.
"""

from __future__ import annotations

import contextvars
import getpass
import json
import logging
import os
import re
import secrets
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import tracing
from gateway.answer import Answer
from gateway.auth.tokens import Principal
from gateway.config import Target
from gateway.errors import GatewayError, Unauthorized
from gateway.guard.decision import sees_target_addresses
from gateway.server.base.context import client_of, mcp_client_var
from gateway.server.call.idempotency import key_from_meta
from gateway.server.edge.mcp_task_notices import TaskNotices
from gateway.server.edge.mcp_tasks import TASK_TOOLS, TaskRunner
from gateway.server.edge.mcp_tasks_2026 import input_required
from gateway.server.edge.middleware import correlation_id_var
from gateway.server.proposals.elicitation import asker_of, asker_var, is_stateless
from gateway.server.proposals.request_state import Rounds
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Category

log = logging.getLogger(__name__)

SERVER_NAME = "vsphere-mcp-gateway"
#: (fraction 0..1, message); a coroutine function, so a worker thread can hand it to the loop
ProgressSink = Callable[[float, str], Coroutine[Any, Any, None]]
PrincipalSource = Callable[[], Principal | None]


class RoleLike(Protocol):
    @property
    def all_targets(self) -> bool: ...


class Registry(Protocol):
    def get(self, name: str) -> ToolSpec | None: ...


class CallerFacts(Protocol):
    """What the MCP surface asks about its caller (``gateway.server.base.facts.FactsNow``)."""

    @property
    def registry(self) -> Registry: ...

    def tools_of(self, role: Any) -> list[ToolSpec]: ...

    async def role_now(self, principal: Principal) -> Any: ...

    def visible_targets(self, role: Any) -> list[Target]: ...


class Answers(Protocol):
    """Where a tool call is answered (``gateway.server.call.arrival.Calls``)."""

    async def answer(
        self, principal: Principal, name: str, args: Mapping[str, Any] | None, *,
        progress: ProgressSink | None = None, correlation_id: str | None = None,
    ) -> Answer: ...

    def observed(self, tool: str, args: Mapping[str, Any] | None) -> AbstractContextManager[None]: ...


class McpGateway(Protocol):
    """The parts of ``gateway.server.runtime.Gateway`` the MCP surface uses."""

    @property
    def facts(self) -> CallerFacts: ...

    @property
    def calls(self) -> Answers: ...


class StdioGateway(McpGateway, Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


class InFlightCalls:
    """Counts tool calls in progress (on the event loop), so a stop can wait for them (``GatewayServer``)."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> None:
        self.count += 1

    def __exit__(self, *exc: object) -> None:
        self.count -= 1


def may_stream(gateway: McpGateway, body: bytes) -> bool:
    """Whether a 2026-07-28 request may need its answer's event stream: it asks for progress, or it is a
    call of a tool that reaches vSphere (a slow answer is kept alive behind a proxy by the stream's pings)
    or changes something (closing that stream cancels the call, as the revision says). Only the reads
    the gateway answers itself (``target_mode: none``) and the other methods answer as one JSON body.
    Anything this cannot read is left to the SDK's event-stream mode, as before."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return True
    if not isinstance(request, dict) or not isinstance(params := request.get("params") or {}, dict):
        return True
    if progress_token_from_params(params) is not None:
        return True
    if request.get("method") != "tools/call":
        return False
    spec = gateway.facts.registry.get(name) if isinstance(name := params.get("name"), str) else None
    return spec is None or spec.kind is not Category.READ or spec.target_mode != "none"


def stdio_principal() -> Principal:
    """The caller over stdio: the local OS user, who already holds the configuration and credentials."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.getuid()}"
    return Principal(name=f"stdio:{user}", role="admin", surface="stdio")


_GUIDE = (
    "This gateway operates VMware vSphere and ESXi through named targets. Every tool takes a `target` "
    "argument naming a configured target; call list_targets to see the ones you may use. Read tools also "
    'accept a list of names or "all" and answer per target with {"ok": ...} or {"error": {...}}, so one '
    "unreachable target never hides the others. A change names exactly one target. Destructive tools never "
    "act on the first call: they return a proposal with a token. Re-read its target and affected objects, "
    "then call confirm_action with the token before it expires, or cancel_action to drop it; some targets "
    "need a human to approve the proposal instead. Errors carry a stable code and a message saying what "
    "to do next; queue_timeout and unreachable are worth a retry, policy_denied is not."
)


def instructions_for(targets: Sequence[Target] | None) -> str:
    """The usage guide; ``targets`` (name and address) are listed only for a role that has them all."""
    if not targets:
        return _GUIDE
    listed = "; ".join(f"{t.name} ({t.address})" for t in targets)
    return f"{_GUIDE}\n\nTargets: {listed}."


def tool_of(spec: ToolSpec) -> types.Tool:
    return types.Tool(
        name=spec.name, description=spec.description, input_schema=spec.input_schema(),
        annotations=types.ToolAnnotations.model_validate(spec.annotations()),
        execution=types.ToolExecution(task_support="optional") if spec.name in TASK_TOOLS else None,
    )


def success_result(answer: Answer) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=wire_text(answer))])


def error_result(wire: dict[str, Any]) -> types.CallToolResult:
    text = Answer.of({"error": wire}).text
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def internal_error_result(correlation_id: str) -> types.CallToolResult:
    return error_result({"code": "internal",
                         "message": f"internal error (see server log, correlation id {correlation_id})",
                         "correlation_id": correlation_id})


def rounds_of(gateway: Any) -> Rounds | None:
    """The 2026-07-28 confirmation rounds of the runtime's ``Gateway`` (``ProposalPath.rounds``); None for
    a gateway without them, whose 2026-07-28 clients then confirm with the token."""
    rounds = getattr(gateway, "rounds", None)
    return rounds if isinstance(rounds, Rounds) else None


def _is_retry(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> bool:
    """Whether a call is the retry of a round (2026-07-28: it carries a ``requestState`` or answers)."""
    return is_stateless(ctx) and (params.request_state is not None or bool(params.input_responses))


@dataclass
class _Handlers:
    gateway: McpGateway
    principal_of: PrincipalSource
    in_flight: InFlightCalls
    #: 2026-07-28 confirmation rounds (None: such clients confirm with the token)
    rounds: Rounds | None = None

    def caller(self) -> Principal:
        principal = self.principal_of()
        if principal is None:
            raise Unauthorized("this request carries no authenticated caller; send a bearer token")
        return principal

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            principal = self.caller()
        except Unauthorized as exc:
            raise MCPError(code=types.INVALID_REQUEST, message=exc.message) from None
        facts = self.gateway.facts
        tools = facts.tools_of(await facts.role_now(principal))
        return types.ListToolsResult(tools=[tool_of(spec) for spec in tools])

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        correlation_id = correlation_id_var.get() or uuid.uuid4().hex
        try:
            principal = self.caller()
        except Unauthorized as exc:
            return error_result(exc.to_wire())
        sink = _progress_sink(ctx) if _wants_progress(ctx) else None
        client = client_of(ctx)
        mcp_client_var.set(client)  # the client's declared name/version, for the audit rows
        asker = asker_of(ctx, rounds=self.rounds is not None)
        asker_var.set(asker)  # whether (and how) the person at the client can be asked
        with self.in_flight, tracing.call_span("tools/call", params.name, ctx.meta):
            try:
                if self.rounds is not None and _is_retry(ctx, params):
                    with self.gateway.calls.observed(params.name, params.arguments):  # the call's 2nd round
                        again = await self.rounds.answer(
                            principal, params.name, params.arguments, params.request_state,
                            params.input_responses, correlation_id=correlation_id, client=client,
                            progress=sink, base_url=asker.base_url if asker is not None else "")
                    return success_result(again if isinstance(again, Answer) else Answer.cleaned(again))
                arguments = key_from_meta(ctx.meta, params.arguments or {})  # the argument wins
                answer = await self.gateway.calls.answer(principal, params.name, arguments,
                                                         progress=sink, correlation_id=correlation_id)
                asked = asker.rounds.asked if asker is not None and asker.rounds is not None else None
                if asked is not None and self.rounds is not None:  # 2026-07-28: the person is asked now
                    state = await self.rounds.seal(principal, params.name, params.arguments, asked)
                    return input_required(asked, state)
                return success_result(answer)
            except GatewayError as exc:
                return error_result(exc.to_wire())
            except Exception:
                log.exception("tool %r failed for %s (correlation id %s)", params.name, principal.name,
                              correlation_id)
                return internal_error_result(correlation_id)

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        """The inputSchema of the tool ``name`` (the SDK checks a 2026-07-28 call's Mcp-Param headers against
        it), None for a tool this gateway does not have. Whoever the caller: this is a synchronous callback
        on the event loop, so it reads no roles file; the call's own decision refuses (and audits) a tool
        its caller may not use."""
        spec = self.gateway.facts.registry.get(name)
        return spec.input_schema() if spec is not None else None

    async def instructions(self) -> str:
        principal = self.principal_of()
        role = await self.gateway.facts.role_now(principal) if principal is not None else None
        if not sees_target_addresses(role):
            return instructions_for(None)
        return instructions_for(self.gateway.facts.visible_targets(role))


def _wants_progress(ctx: ServerRequestContext[Any]) -> bool:
    meta = ctx.meta
    return meta is not None and meta.get("progress_token") is not None


def _progress_sink(ctx: ServerRequestContext[Any]) -> ProgressSink:
    """Progress is best effort: a client that went away must not fail the call it started."""

    async def report(fraction: float, message: str) -> None:
        try:
            await ctx.session.report_progress(min(max(fraction, 0.0), 1.0), 1.0, message)
        except Exception:
            log.debug("progress notification not delivered", exc_info=True)

    return report


class _PerCallerInstructions:
    """Server middleware: the initialize and server/discover answers carry the caller's instructions."""

    def __init__(self, handlers: _Handlers) -> None:
        self._handlers = handlers

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        result = await call_next(ctx)
        if ctx.method in ("initialize", "server/discover") and isinstance(result, dict):
            return {**_no_list_changes(result), "instructions": await self._handlers.instructions()}
        return result


def _no_list_changes(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` saying the tool list never changes during a session: the SDK derives ``listChanged``
    on 2026-07-28 from serving ``subscriptions/listen``, which this gateway serves for task notices
    only (``mcp_task_notices``); it sends no list changes."""
    capabilities = result.get("capabilities")
    if not isinstance(capabilities, dict):
        return result
    tools = capabilities.get("tools")
    if not isinstance(tools, dict) or not tools.get("listChanged"):
        return result
    return {**result, "capabilities": {**capabilities, "tools": {**tools, "listChanged": False}}}


def build_mcp_server(
    gateway: McpGateway, principal_of: PrincipalSource, *, version: str = "",
    in_flight: InFlightCalls | None = None,
) -> Server[Any]:
    """An MCP server whose tools/list and tools/call go through ``gateway`` for ``principal_of()``."""
    handlers = _Handlers(gateway, principal_of, in_flight or InFlightCalls(), rounds_of(gateway))
    server: Server[Any] = Server(
        SERVER_NAME, version=version, instructions=instructions_for(None),
        on_list_tools=handlers.list_tools, on_call_tool=handlers.call_tool,
        get_tool_input_schema=handlers.input_schema,
    )
    # the SDK's own span per message is replaced by ``tracing.call_span`` (the same name, nested in the
    # HTTP request's span, its traceparent header first)
    server.middleware[:] = [m for m in server.middleware if type(m).__name__ != "OpenTelemetryMiddleware"]
    server.middleware.append(_PerCallerInstructions(handlers))
    backends, settings = getattr(gateway, "backends", None), getattr(gateway, "settings", None)
    trail = getattr(gateway, "trail", None)
    if backends is not None and settings is not None and trail is not None:  # the runtime's Gateway
        TaskRunner(gateway.calls.answer, backends.tasks, principal_of, instance=backends.instance,
                   trail=trail, keep_seconds=settings.task_keep_seconds,
                   rounds=handlers.rounds, observed=gateway.calls.observed).install(server)
        # 2026-07-28: task status notifications on a listen stream (the handshake revisions have no such
        # method: the SDK answers it method-not-found there)
        server.add_request_handler("subscriptions/listen", types.SubscriptionsListenRequestParams,
                                   TaskNotices(backends.tasks, principal_of, trail).listen)
    return server


async def serve_stdio(gateway: StdioGateway, *, version: str = "") -> None:
    """Serve MCP over this process's stdin/stdout as the local user; the gateway starts and stops here."""
    principal = stdio_principal()
    server = build_mcp_server(gateway, lambda: principal, version=version)
    await gateway.start()
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await gateway.close()


# ------------------------------------------------------------------------------------------------------
# HTTP answers


class AnswerAsJson:
    """ASGI wrapper for the /mcp endpoint: a POST whose event stream would carry nothing but its answer
    gets that answer as one ``application/json`` body instead.

    Both are valid answers to a request (the 2025-11-25 revision lets the server choose per request,
    and the SDK's 2026-07-28 transport chooses the same way). The SDK's legacy transport always
    opens an event stream, and its client refuses an event over 1 MiB unless configured otherwise:
    list_vms on about 3,000 VMs is larger. A JSON body has no such limit and costs less to frame
    and to parse. The stream is held back until its first event: the answer becomes the JSON
    body; anything else first (progress, a keep-alive ping after a long wait, a request to the
    client, an event id for resumption) sends the stream on unchanged from its start.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not _accepts_json(scope):
            await self.app(scope, receive, send)
            return
        splices = _Splices()
        held = _spliced.set(splices)
        try:
            await self.app(scope, receive, _HeldStream(send, splices).send)
        finally:
            splices.close()
            _spliced.reset(held)


#: an answer at least this long is carried by the SDK as a placeholder and spliced into the body as
#: the bytes it was encoded to once (``wire_text``)
SPLICE_MIN_CHARS = 16 * 1024


class _Splices:
    """The answers one POST's body carries as placeholders (``wire_text``), and their encoded bytes.

    A placeholder names a random 128-bit nonce of this request, so no caller's text can match one; it
    is a plain ASCII string, which every JSON encoder writes as it is, between its quotes."""

    def __init__(self) -> None:
        self.nonce = ""  # drawn with the first placeholder: most answers are too short to need one
        self.parts: dict[bytes, bytes] = {}
        self.open = True

    def close(self) -> None:
        """The request has answered: no placeholder is made any more (a task it started may go on)."""
        self.open = False

    def placeholder(self, answer: Answer) -> str | None:
        encoded = answer.json_string()
        if encoded is None or not self.open:
            return None
        self.nonce = self.nonce or secrets.token_hex(16)
        key = f"gateway-answer-{self.nonce}-{len(self.parts)}"
        self.parts[f'"{key}"'.encode("ascii")] = encoded
        return key

    def apply(self, body: bytes) -> bytes:
        """``body`` with each placeholder (its quotes included) replaced by its answer's JSON string."""
        return b"".join(self.pieces(body))

    def pieces(self, body: bytes) -> list[bytes]:
        """``apply``'s bytes as the pieces they are made of (the answers' own bytes, never copied: the
        pieces are sent one after the other)."""
        out = [body]
        for key, encoded in self.parts.items():
            spliced: list[bytes] = []
            for piece in out:
                if piece is encoded or key not in piece:
                    spliced.append(piece)
                    continue
                head, *tails = piece.split(key)
                spliced.append(head)
                for tail in tails:
                    spliced += [encoded, tail]
            out = spliced
        return [piece for piece in out if piece]


_spliced: contextvars.ContextVar[_Splices | None] = contextvars.ContextVar("gateway_spliced", default=None)


def wire_text(answer: Answer) -> str:
    """The text a tool result carries for ``answer``: the answer's text, or, for a large answer inside
    a POST to /mcp (``AnswerAsJson``), a placeholder that ``AnswerAsJson`` replaces in the body with
    the answer's JSON string, encoded once (``Answer.json_string``: a mirror's kept answer is encoded
    once per change of the inventory, never per call). The SDK then encodes a short string instead
    of the whole answer; the client reads the same message either way."""
    splices = _spliced.get()
    if splices is None or len(answer.text) < SPLICE_MIN_CHARS:
        return answer.text
    return splices.placeholder(answer) or answer.text


_SSE_ONLY_HEADERS = frozenset({b"content-type", b"content-length", b"transfer-encoding", b"connection",
                               b"x-accel-buffering"})
#: a JSON-RPC answer as the SDK encodes it: its id, then its result or error
_ANSWER = re.compile(rb'\{"jsonrpc":"2\.0","id":(?:"(?:[^"\\]|\\.)*"|-?[0-9]+),"(?:result|error)":')
_EVENT_ENDS = (b"\r\n\r\n", b"\n\n", b"\r\r")


def _event_end(stream: bytes) -> tuple[int, int] | None:
    """Where the blank line ending the first event of ``stream`` starts and ends, None if it has not ended.

    ``bytes.find`` per separator, the earliest wins: a regex alternation scans a 1 MB answer several
    times slower. No two separators can start at the same place, so this is the leftmost match.
    """
    ends = [(at, len(sep)) for sep in _EVENT_ENDS if (at := stream.find(sep)) >= 0]
    if not ends:
        return None
    at, size = min(ends)
    return at, at + size


def _accepts_json(scope: Scope) -> bool:
    accept = b",".join(v for k, v in scope["headers"] if k == b"accept").lower()
    return b"application/json" in accept or b"*/*" in accept


def _is_event_stream(message: Message) -> bool:
    content_type = b"".join(v for k, v in message.get("headers", ()) if k.lower() == b"content-type")
    return message.get("status") == 200 and content_type.lower().startswith(b"text/event-stream")


#: how the SDK's event stream (sse-starlette) frames one message of one line: a JSON-RPC message has no
#: line break of its own (JSON escapes them), so an answer's event is exactly this
_ONE_LINE_HEAD, _ONE_LINE_END = b"event: message\r\ndata: ", b"\r\n\r\n"


def _lone_answer(stream: bytes) -> bytes | None:
    """The data of ``stream`` when it is exactly one complete ``message`` event carrying a JSON-RPC
    answer (nothing before or after it), else None.

    The usual framing (``_ONE_LINE_HEAD``, one line, ``_ONE_LINE_END``) is recognised by its ends and
    two byte searches (a large answer is never scanned line by line); anything else is parsed field by
    field."""
    if stream.startswith(_ONE_LINE_HEAD) and stream.endswith(_ONE_LINE_END):
        line = stream[len(_ONE_LINE_HEAD): -len(_ONE_LINE_END)]
        if b"\n" not in line and b"\r" not in line:
            return line if _ANSWER.match(line) else None
    end = _event_end(stream)
    if end is None or end[1] != len(stream):
        return None
    event, data = b"", []
    for line in stream[: end[0]].splitlines():
        field, _, value = line.partition(b":")
        value = value.removeprefix(b" ")
        if field == b"event":
            event = value
        elif field == b"data":
            data.append(value)
        else:  # a comment (ping), an id, a retry hint: the stream has more to say than its answer
            return None
    body = b"\n".join(data)
    return body if event == b"message" and _ANSWER.match(body) else None


class _HeldStream:
    """``send`` for one POST: holds an event stream's start until its first event decides its form, and
    puts the spliced answers (``_Splices``) into what it sends."""

    def __init__(self, send: Send, splices: _Splices | None = None) -> None:
        self._send = send
        self._splices = splices or _Splices()
        self._start: Message | None = None
        self._buffer = b""
        # then "stream" (sent on as is, answers spliced in), "answered" (sent as JSON) or "body" (a
        # JSON body held whole to splice its answer in and count its length again)
        self._mode = "undecided"

    async def send(self, message: Message) -> None:
        if self._mode == "stream":
            await self._send(self._spliced(message))
        elif self._mode == "undecided":
            await self._decide(message)
        elif self._mode == "body":
            await self._body(message)
        # "answered": what follows is the end of the stream that was not opened

    def _spliced(self, message: Message) -> Message:
        """An event of the stream with its answers spliced in (each event is one message, whole)."""
        if not self._splices.parts or message["type"] != "http.response.body":
            return message
        return {**message, "body": self._splices.apply(message.get("body", b""))}

    async def _body(self, message: Message) -> None:
        """A JSON body held whole (its answers were registered before it started): sent once complete,
        its answers spliced in and its length counted again."""
        assert self._start is not None
        if message["type"] != "http.response.body":
            self._mode = "stream"
            await self._send(self._start)
            await self._send({"type": "http.response.body", "body": self._splices.apply(self._buffer),
                              "more_body": True})
            await self._send(message)
            return
        self._buffer += message.get("body", b"")
        if message.get("more_body", False):
            return
        self._mode = "answered"
        headers = [(k, v) for k, v in self._start.get("headers", ()) if k.lower() != b"content-length"]
        await self._send_body(self._start, headers, self._splices.pieces(self._buffer))

    async def _send_body(self, start: Message, headers: list[tuple[bytes, bytes]],
                         pieces: list[bytes]) -> None:
        """``start`` with ``headers`` and the length of ``pieces``, then the pieces, one message each."""
        headers = [*headers, (b"content-length", str(sum(map(len, pieces))).encode())]
        await self._send({**start, "headers": headers})
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            await self._send({"type": "http.response.body", "body": piece, "more_body": not last})
        if not pieces:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _decide(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if _is_event_stream(message):
                self._start = message
                return
            if self._splices.parts:  # the answer is in this body: held whole (``_body``)
                self._start, self._mode = message, "body"
                return
            self._mode = "stream"
            await self._send(message)
            return
        if self._start is None or message["type"] != "http.response.body":
            self._mode = "stream"
            await self._send(message)
            return
        self._buffer += message.get("body", b"")
        answer = _lone_answer(self._buffer)
        if answer is not None:
            await self._answer(self._start, answer)
        elif _event_end(self._buffer) is not None or not message.get("more_body", False):
            await self._open_stream(self._start, message.get("more_body", False))

    async def _answer(self, start: Message, body: bytes) -> None:
        self._mode = "answered"
        headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() not in _SSE_ONLY_HEADERS]
        headers.append((b"content-type", b"application/json"))
        await self._send_body(start, headers, self._splices.pieces(body))

    async def _open_stream(self, start: Message, more_body: bool) -> None:
        self._mode = "stream"
        await self._send(start)
        await self._send({"type": "http.response.body", "body": self._splices.apply(self._buffer),
                          "more_body": more_body})
