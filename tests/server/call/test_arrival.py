"""``Calls``: a tool call from its arrival to its handler: unstorable text refused first, the caller as the
store says now, the gate, argument validation, then the handler the tool is routed to (wrapped by
``around``); every call one metric. The handlers are recording ones: what they answer is not the subject."""

from __future__ import annotations

from typing import Any

import pytest
from support.server_parts import AGENT, READER, Parts

from gateway.answer import Answer
from gateway.auth.tokens import Principal, create_token
from gateway.errors import InvalidArgument, NotFound
from gateway.guard.limits import RateLimiter
from gateway.server.base.audit_trail import reading
from gateway.server.base.context import CallContext, Handler, ProgressSink
from gateway.server.base.metrics import Metrics
from gateway.server.call.arrival import Calls
from gateway.server.call.busy_audit import BusyAudit
from gateway.server.call.gate import Gate
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Kind

pytestmark = pytest.mark.anyio


class Handlers:
    """Handlers that record which of them answered, with the context they were given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, CallContext, dict[str, Any]]] = []
        self.wrapped: list[str] = []

    def named(self, name: str) -> Handler:
        async def handle(ctx: CallContext, args: dict[str, Any], _p: ProgressSink | None) -> dict[str, Any]:
            self.seen.append((name, ctx, args))
            return {"answered_by": name}

        return handle

    def around(self, spec: ToolSpec, handler: Handler) -> Handler:
        self.wrapped.append(spec.name)
        return handler


def calls_of(parts: Parts, handlers: Handlers, metrics: Metrics | None = None) -> Calls:
    gate = Gate(facts=parts.facts, trail=parts.trail, busy=BusyAudit(parts.trail), rate_limiter=RateLimiter(),
                dry_run=False)
    return Calls(parts.targets, facts=parts.facts, gate=gate, metrics=metrics or Metrics(targets=["vc1"]),
                 read=handlers.named("read"), write=handlers.named("write"),
                 local={"list_targets": handlers.named("local")}, around=handlers.around)


async def test_each_tool_goes_to_the_handler_it_is_routed_to(parts: Parts) -> None:
    handlers = Handlers()
    calls = calls_of(parts, handlers)
    read = await calls.answer(AGENT, "get_vm_details", {"target": "vc1", "vm": "web-1"})
    write = await calls.answer(AGENT, "power_off_vm", {"target": "vc1", "vm": "web-1"})
    local = await calls.answer(AGENT, "list_targets", {})
    assert [a.value for a in (read, write, local)] == \
        [{"answered_by": "read"}, {"answered_by": "write"}, {"answered_by": "local"}]
    assert isinstance(read, Answer)
    assert handlers.wrapped == ["get_vm_details", "power_off_vm", "list_targets"], "around wraps each"


async def test_call_is_the_answer_as_plain_values(parts: Parts) -> None:
    calls = calls_of(parts, Handlers())
    assert await calls.call(AGENT, "list_targets", {}, correlation_id="c-9") == {"answered_by": "local"}


async def test_an_unknown_tool_is_refused_and_audited(parts: Parts) -> None:
    handlers = Handlers()
    with pytest.raises(NotFound, match="unknown tool 'no_such_tool'"):
        await calls_of(parts, handlers).answer(AGENT, "no_such_tool", {})
    (row,) = parts.rows(phase="denied")
    assert (row["tool"], row["error_code"]) == ("no_such_tool", "not_found") and handlers.seen == []


async def test_unstorable_text_is_refused_before_anything_else(parts: Parts) -> None:
    handlers = Handlers()
    with pytest.raises(InvalidArgument):
        await calls_of(parts, handlers).answer(AGENT, "get_vm_details", {"target": "vc1", "vm": "web\x00"})
    (row,) = parts.rows(phase="invalid")
    assert row["error_code"] == "invalid_argument" and handlers.seen == []


async def test_arguments_are_validated_past_the_gate(parts: Parts) -> None:
    handlers = Handlers()
    with pytest.raises(InvalidArgument):
        await calls_of(parts, handlers).answer(AGENT, "get_vm_details", {"target": "vc1", "vm": 7})
    assert [r["phase"] for r in parts.rows()] == ["invalid"] and handlers.seen == []


async def test_a_tool_outside_the_role_is_refused_at_the_gate(parts: Parts) -> None:
    handlers = Handlers()
    with pytest.raises(NotFound):
        await calls_of(parts, handlers).answer(READER, "power_off_vm", {"target": "vc1", "vm": "web-1"})
    (row,) = parts.rows(phase="denied")
    assert row["caller"] == "watcher" and handlers.seen == []


async def test_the_handler_sees_the_caller_as_the_store_says_now(parts: Parts) -> None:
    _plain, record = create_token(parts.backends.store, "olga", "admin", expires_in=None, now=parts.clock(),
                                  kind=Kind.PERSON)
    handlers = Handlers()
    caller = Principal(name="olga", role="admin", token_id=record.token_id, surface="test")  # says: agent
    await calls_of(parts, handlers).answer(caller, "get_vm_details", {"target": "vc1", "vm": "web-1"},
                                           correlation_id="c-1", client="probe/1.0")
    ((_name, ctx, _args),) = handlers.seen
    assert (ctx.principal.kind, ctx.party.kind, ctx.correlation_id, ctx.client) == \
        (Kind.PERSON, Kind.PERSON, "c-1", "probe/1.0")


async def test_every_call_is_one_metric_by_outcome(parts: Parts) -> None:
    metrics = Metrics(targets=["vc1"], tools=["get_vm_details", "power_off_vm"])
    calls = calls_of(parts, Handlers(), metrics)
    await calls.answer(AGENT, "get_vm_details", {"target": "vc1", "vm": "web-1"})
    with pytest.raises(NotFound):
        await calls.answer(READER, "power_off_vm", {"target": "vc1", "vm": "web-1"})
    text = metrics.render()
    assert 'gateway_tool_calls_total{outcome="ok",target="vc1",tool="get_vm_details"} 1.0' in text
    assert 'gateway_tool_calls_total{outcome="error",target="vc1",tool="power_off_vm"} 1.0' in text


async def test_a_read_tools_call_runs_as_a_read_for_the_audit_and_a_change_does_not(parts: Parts) -> None:
    seen: dict[str, bool] = {}

    def noting(name: str) -> Handler:
        async def handle(ctx: CallContext, args: dict[str, Any], _p: ProgressSink | None) -> dict[str, Any]:
            seen[ctx.spec.name] = reading.get()
            return {"answered_by": name}

        return handle

    gate = Gate(facts=parts.facts, trail=parts.trail, busy=BusyAudit(parts.trail), rate_limiter=RateLimiter(),
                dry_run=False)
    calls = Calls(parts.targets, facts=parts.facts, gate=gate, metrics=Metrics(targets=["vc1"]),
                  read=noting("read"), write=noting("write"), local={"list_pending_actions": noting("local")})
    await calls.answer(AGENT, "get_vm_details", {"target": "vc1", "vm": "web-1"})
    await calls.answer(AGENT, "list_pending_actions", {})
    await calls.answer(AGENT, "power_off_vm", {"target": "vc1", "vm": "web-1"})
    assert seen == {"get_vm_details": True, "list_pending_actions": True, "power_off_vm": False}
    assert reading.get() is False, "reset once the call is answered"
