"""The MCP surface's HTTP answer form (``AnswerAsJson``) and result building, in-process.

A POST whose event stream would carry only its answer gets that answer as one JSON body; any other
stream passes unchanged. Checked against scripted ASGI apps (exact bytes in, exact bytes out) and
against the SDK's own streamable HTTP server with a result larger than the SDK client's 1 MiB event
limit, driven through httpx2's ASGI transport.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import Receive, Scope, Send
from support.answers import answer_of

from gateway.answer import Answer
from gateway.auth.tokens import Principal
from gateway.config import Target
from gateway.server.edge.mcp import (
    AnswerAsJson,
    ProgressSink,
    _event_end,
    _lone_answer,
    build_mcp_server,
    error_result,
    may_stream,
    success_result,
    wire_text,
)
from gateway.tools.spec import TARGETS, ToolSpec
from gateway.vocabulary import Category, Risk

pytestmark = pytest.mark.anyio

BOTH = "application/json, text/event-stream"
ANSWER = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}'
PROGRESS = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":0.5}}'
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
               (b"connection", b"keep-alive"), (b"x-accel-buffering", b"no"), (b"mcp-session-id", b"abc")]


def event(data: bytes, *extra: bytes) -> bytes:
    return b"".join(extra) + b"event: message\r\ndata: " + data + b"\r\n\r\n"


class Scripted:
    """An ASGI app answering every request with the given start headers, status and body chunks."""

    def __init__(self, chunks: Sequence[bytes], headers: list[tuple[bytes, bytes]] | None = None,
                 status: int = 200) -> None:
        self.chunks, self.headers, self.status = chunks, SSE_HEADERS if headers is None else headers, status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def post(app: Any, accept: str = BOTH, method: str = "POST") -> httpx2.Response:
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as http:
        return await http.request(method, "/mcp", headers={"accept": accept}, content=b"{}")


async def test_a_stream_holding_only_its_answer_becomes_a_json_body() -> None:
    response = await post(AnswerAsJson(Scripted([event(ANSWER)])))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-length"] == str(len(ANSWER))
    assert response.headers["mcp-session-id"] == "abc" and "x-accel-buffering" not in response.headers
    assert response.content == ANSWER


async def test_an_answer_split_over_chunks_is_joined() -> None:
    whole = event(ANSWER)
    response = await post(AnswerAsJson(Scripted([whole[:10], whole[10:30], whole[30:]])))
    assert response.headers["content-type"] == "application/json" and response.content == ANSWER


@pytest.mark.parametrize("chunks", [
    pytest.param([event(PROGRESS), event(ANSWER)], id="progress-first"),
    pytest.param([event(PROGRESS) + event(ANSWER)], id="two-events-in-one-chunk"),
    pytest.param([b": ping - 2026-01-01\r\n\r\n", event(ANSWER)], id="keep-alive-ping-first"),
    pytest.param([event(ANSWER, b"id: 42\r\n")], id="resumable-event-id"),
    pytest.param([b"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{}}\r\n\r\n"],
                 id="answer-to-no-request"),
    pytest.param([event(ANSWER)[:20]], id="stream-ends-mid-event"),
    pytest.param([], id="stream-ends-empty"),
])
async def test_any_other_stream_passes_unchanged(chunks: list[bytes]) -> None:
    response = await post(AnswerAsJson(Scripted(chunks)))
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["mcp-session-id"] == "abc"
    assert response.content == b"".join(chunks)


@pytest.mark.parametrize(("app", "accept", "method"), [
    pytest.param(Scripted([ANSWER], headers=[(b"content-type", b"application/json")]), BOTH, "POST",
                 id="json"),
    pytest.param(Scripted([b""], headers=[], status=202), BOTH, "POST", id="accepted"),
    pytest.param(Scripted([event(ANSWER)]), "text/event-stream", "POST", id="client-wants-sse-only"),
    pytest.param(Scripted([event(ANSWER)]), BOTH, "GET", id="standalone-stream"),
])
async def test_requests_and_answers_it_does_not_concern_pass_unchanged(app: Scripted, accept: str,
                                                                      method: str) -> None:
    direct = await post(app, accept, method)
    wrapped = await post(AnswerAsJson(app), accept, method)
    assert (wrapped.status_code, wrapped.headers.get("content-type"), wrapped.content) == (
        direct.status_code, direct.headers.get("content-type"), direct.content)


# ---------------------------------------------------------------------------- the SDK's own server

ROWS = 9000  # about 1.2 MB as the answer travels: more than the SDK client's default 1 MiB per event
BIG = ToolSpec("list_vms", "List VMs.", Category.READ, Risk.LOW, params=(TARGETS,), target_mode="fanout")


class _Role:
    all_targets = False
    tools = "*"


class BigGateway:
    """A pipeline answering list_vms with thousands of rows, reporting progress when asked."""

    @property
    def facts(self) -> BigGateway:  # what the caller may see and use: this stand-in answers it
        return self

    @property
    def calls(self) -> BigGateway:  # where tool calls are answered: this stand-in too
        return self

    def tools_of(self, role: Any) -> list[ToolSpec]:
        return [BIG]

    async def answer(self, principal: Principal, name: str, args: Mapping[str, Any] | None, *,
                     progress: ProgressSink | None = None, correlation_id: str | None = None) -> Answer:
        if progress is not None:
            await progress(0.5, "halfway")
        rows = [{"moid": f"vm-{i}", "name": f"web-{i:05d}", "power_state": "poweredOn", "cpu": 2,
                 "memory_mb": 4096, "guest_ip": f"10.0.{i // 250}.{i % 250}"} for i in range(ROWS)]
        return Answer.of({"vms": rows, "count": ROWS})

    async def role_now(self, principal: Principal) -> _Role:
        return _Role()

    def visible_targets(self, role: Any) -> list[Target]:
        return []


HELLO = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}


async def _rpc(http: httpx2.AsyncClient, session: str | None, body: dict[str, Any]) -> httpx2.Response:
    headers = {"accept": BOTH, "content-type": "application/json", "mcp-protocol-version": "2025-11-25"}
    if session:
        headers["mcp-session-id"] = session
    return await http.post("/mcp", headers=headers, content=json.dumps(body))


@pytest.mark.parametrize("with_progress", [False, True])
async def test_the_sdk_servers_large_answer_arrives_as_json_and_progress_still_streams(
        with_progress: bool) -> None:
    principal = Principal(name="tester", role="reader", surface="https")
    server = build_mcp_server(BigGateway(), lambda: principal)
    manager = StreamableHTTPSessionManager(
        app=server, json_response=False, stateless=False,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    app = AnswerAsJson(StreamableHTTPASGIApp(manager))
    call: dict[str, Any] = {"name": "list_vms", "arguments": {"target": "vc1"}}
    if with_progress:
        call["_meta"] = {"progressToken": "p1"}
    async with manager.run(), httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                                                 base_url="http://localhost") as http:
        hello = await _rpc(http, None, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": HELLO})
        session = hello.headers["mcp-session-id"]
        await _rpc(http, session, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        answer = await _rpc(http, session, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                            "params": call})
    assert hello.headers["content-type"] == "application/json"
    if with_progress:
        assert answer.headers["content-type"] == "text/event-stream"
        assert answer.text.index('"notifications/progress"') < answer.text.index('"result"')
        return
    assert answer.headers["content-type"] == "application/json"
    assert len(answer.content) > 1024 * 1024
    message = types.jsonrpc_message_adapter.validate_json(answer.content, by_name=False)
    assert isinstance(message, types.JSONRPCResponse) and message.id == 2
    result = types.CallToolResult.model_validate(message.result)
    assert answer_of(result)["count"] == ROWS


# ---------------------------------------------------------------------------- result building


def test_a_result_is_its_answer_text_in_one_block() -> None:
    answer = Answer.of({"vms": [{"name": "web-1", "cpu": 2}], "count": 1})
    result = success_result(answer)
    assert result.structured_content is None and not result.is_error
    assert isinstance(result.content[0], types.TextContent) and len(result.content) == 1
    assert result.content[0].text is answer.text == '{"vms":[{"name":"web-1","cpu":2}],"count":1}'


def test_an_answer_says_the_same_as_its_text_when_something_had_to_become_text() -> None:
    dated = Answer.of({"at": datetime(2024, 1, 2, tzinfo=UTC), "name": "wéb"})
    assert dated.value == {"at": "2024-01-02 00:00:00+00:00", "name": "wéb"}
    assert json.loads(dated.text) == dated.value and "wéb" in dated.text  # UTF-8, not \u escapes
    plain = {"a": [1, {"b": None}]}
    assert Answer.of(plain).value is plain, "nothing converted: the value itself, not a copy"


def test_an_error_result_is_the_error_object_as_text() -> None:
    result = error_result({"code": "not_found", "message": "no VM named web-9"})
    assert result.is_error and result.structured_content is None
    assert answer_of(result) == {"error": {"code": "not_found", "message": "no VM named web-9"}}


@pytest.mark.parametrize(("stream", "found"), [
    (b"event: message\r\ndata: {}\r\n\r\n", (24, 28)),
    (b"event: message\ndata: {}\n\n", (23, 25)),
    (b"event: message\rdata: {}\r\r", (23, 25)),
    (b"data: a\n\ndata: b\r\n\r\n", (7, 9)),
    (b"data: a\r\n\r\ndata: b\n\n", (7, 11)),
    (b"event: message\r\ndata: {}\r\n", None),
    (b"", None),
])
def test_the_first_event_ends_at_its_first_blank_line(stream: bytes, found: tuple[int, int] | None) -> None:
    assert _event_end(stream) == found


_RESULT = b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}'


@pytest.mark.parametrize(("stream", "answer"), [
    (b"event: message\r\ndata: " + _RESULT + b"\r\n\r\n", _RESULT),  # what the SDK sends
    (b"event: message\ndata: " + _RESULT + b"\n\n", _RESULT),
    (b'event: message\r\ndata: {"jsonrpc":"2.0","id":7,"result":{"a":\r\ndata: 1}}\r\n\r\n',
     b'{"jsonrpc":"2.0","id":7,"result":{"a":\n1}}'),  # two data lines: one message, joined by a newline
    (b'event: message\r\ndata: {"jsonrpc":"2.0","id":7,"method":"elicitation/create"}\r\n\r\n', None),
    (b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\r\n\r\n', None),
    (b"event: message\r\ndata: " + _RESULT + b"\r\n\r\nevent: message\r\ndata: {}\r\n\r\n", None),
    (b"id: 3\r\nevent: message\r\ndata: " + _RESULT + b"\r\n\r\n", None),  # resumable: stays a stream
    (b": ping\r\n\r\n", None),
    (b"event: message\r\ndata: " + _RESULT + b"\r\n", None),  # not ended yet
])
def test_only_a_stream_of_exactly_one_answer_becomes_a_json_body(stream: bytes, answer: bytes | None) -> None:
    assert _lone_answer(stream) == answer


# ---------------------------------------------------------------------------- answers spliced in


BIG = Answer.of({"vms": [{"name": f'vm-{i} "quoted" \\ é', "n": i} for i in range(2000)], "count": 2000})


class Carrying:
    """An app that answers with a tool result holding ``wire_text(BIG)``, encoded as the SDK's modern
    transport does (``json.dumps``, a JSON body with its length) or as one event of a stream."""

    def __init__(self, form: str) -> None:
        self.form, self.texts = form, list[str]()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        text = wire_text(BIG)
        self.texts.append(text)
        result = {"content": [{"type": "text", "text": text}]}
        body = json.dumps({"jsonrpc": "2.0", "id": 3, "result": result}, separators=(",", ":")).encode()
        if self.form == "json":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        if self.form == "progress-first":
            await send({"type": "http.response.body", "body": event(PROGRESS), "more_body": True})
        await send({"type": "http.response.body", "body": event(body), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.mark.parametrize("form", ["json", "sse", "progress-first"])
async def test_a_large_answer_is_spliced_in_as_encoded_once_and_reads_the_same(form: str) -> None:
    app = Carrying(form)
    response = await post(AnswerAsJson(app))
    assert app.texts[0] != BIG.text and len(app.texts[0]) < 100, "the SDK encoded a placeholder"
    if form == "progress-first":
        lines = response.content.split(b"\r\n")
        events = [line[len(b"data: "):] for line in lines if line.startswith(b"data: ")]
        message = json.loads(events[-1])
    else:
        assert response.headers["content-type"] == "application/json"
        assert int(response.headers["content-length"]) == len(response.content)
        message = json.loads(response.content)
    assert message["result"]["content"][0]["text"] == BIG.text
    assert BIG.json_string() is BIG.json_string(), "encoded once"


async def test_no_placeholder_outside_a_post_or_after_its_answer() -> None:
    assert wire_text(BIG) == BIG.text, "no request in progress: the text itself"
    small = Answer.of({"count": 0})
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(wire_text(small))  # a small answer is left to the SDK
        await Scripted([event(ANSWER)])(scope, receive, send)

    await post(AnswerAsJson(app))
    assert seen == [small.text]
    assert wire_text(BIG) == BIG.text


async def test_a_placeholder_is_never_made_once_its_request_has_answered() -> None:
    held: list[Any] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        held.append(contextvars.copy_context())  # what a task started by the call would inherit
        await Scripted([event(ANSWER)])(scope, receive, send)

    await post(AnswerAsJson(app))
    assert held[0].run(wire_text, BIG) == BIG.text


async def test_a_tool_result_carries_a_large_answer_as_a_placeholder_inside_a_post() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(success_result(BIG).content[0].text)  # type: ignore[union-attr]
        await Scripted([event(ANSWER)])(scope, receive, send)

    await post(AnswerAsJson(app))
    assert seen[0] != BIG.text and seen[0].startswith("gateway-answer-")
    assert success_result(BIG).content[0].text == BIG.text  # type: ignore[union-attr]


# ------------------------------------------------------------------- which 2026-07-28 requests stream

LISTING = ToolSpec("list_vms", "List VMs.", Category.READ, Risk.LOW, params=(TARGETS,), target_mode="fanout")
CHANGE = ToolSpec("power_off_vm", "Power off.", Category.WRITE, Risk.MEDIUM, params=(TARGETS,))
PENDING = ToolSpec("list_pending_actions", "Pending.", Category.READ, Risk.LOW, target_mode="none")


class ToolsByName:
    """The part of the gateway ``may_stream`` and the input schemas read: its tools, by name."""

    def __init__(self, *specs: ToolSpec) -> None:
        self.registry = {spec.name: spec for spec in specs}

    @property
    def facts(self) -> ToolsByName:
        return self


def _call(name: object, meta: dict[str, Any] | None = None) -> bytes:
    params: dict[str, Any] = {"name": name, "arguments": {}}
    if meta is not None:
        params["_meta"] = meta
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()


@pytest.mark.parametrize(("body", "streams"), [
    (_call("list_pending_actions"), False),  # a read the gateway answers itself: one JSON body
    (_call("list_pending_actions", {"progressToken": "p"}), True),  # progress travels on the stream
    (_call("list_pending_actions", {"progressToken": 7}), True),
    (_call("list_vms"), True),  # a vSphere read: a slow one is kept alive by the stream's pings
    (_call("power_off_vm"), True),  # a change: closing its stream cancels it
    (_call("no_such_tool"), True),
    (_call(["list_vms"]), True),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}', False),
    (b'{"jsonrpc":"2.0","id":1,"method":"server/discover"}', False),
    (b"not json", True),  # what it cannot read is the SDK's to refuse, as before
    (b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]', True),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1]}', True),
])
def test_only_a_request_that_may_send_something_first_keeps_its_event_stream(body: bytes,
                                                                             streams: bool) -> None:
    assert may_stream(ToolsByName(LISTING, CHANGE, PENDING), body) is streams  # type: ignore[arg-type]


def test_the_sdk_takes_each_tools_input_schema_from_the_registry_without_reading_the_caller() -> None:
    """The schema lookup is a synchronous SDK callback on the event loop: it reads no role (``ToolsByName``
    has no role to give), and a tool the caller may not use is refused, audited, by the call's decision."""
    server = build_mcp_server(ToolsByName(LISTING, CHANGE), lambda: None)  # type: ignore[arg-type]
    assert server.get_tool_input_schema is not None
    assert server.get_tool_input_schema("list_vms") == LISTING.input_schema()
    assert server.get_tool_input_schema("power_off_vm") == CHANGE.input_schema()
    assert server.get_tool_input_schema("no_such_tool") is None
