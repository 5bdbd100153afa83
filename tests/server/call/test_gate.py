"""``Gate``: where the call path asks the decision and enforces its verdict; every refusal one audit row
(a burst of ``busy`` refusals one row); the rate limits and the runaway breaker. Plain values over SQLite
and the audit file."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from support.server_parts import AGENT, PERMISSIVE, READER, Parts, plan_of

from gateway.auth.tokens import Principal
from gateway.errors import AuditUnavailable, Busy, NotFound, PolicyDenied, RateLimited
from gateway.guard.decision import Entry, Facts
from gateway.guard.limits import RateLimiter, RunawayBreaker
from gateway.server.call.busy_audit import BusyAudit
from gateway.server.call.gate import Gate

pytestmark = pytest.mark.anyio


def gate_of(parts: Parts, *, dry_run: bool = False, breaker: RunawayBreaker | None = None) -> Gate:
    return Gate(facts=parts.facts, trail=parts.trail, busy=BusyAudit(parts.trail), rate_limiter=RateLimiter(),
                dry_run=dry_run, breaker=breaker)


@pytest.fixture
def gate(parts: Parts) -> Iterator[Gate]:
    yield gate_of(parts)


def write_facts(parts: Parts, principal: Principal = AGENT, tool: str = "power_off_vm") -> Facts:
    """The gate's facts about a change of vc1 before anything is resolved."""
    spec = parts.registry.get(tool)
    assert spec is not None
    return parts.facts.facts(Entry.WRITE, parts.facts.party(principal), spec, {"target": "vc1"},
                             target="vc1", resolved=False)


def test_the_decision_allows_a_role_that_covers_the_tool(parts: Parts, gate: Gate) -> None:
    assert gate.decide(write_facts(parts), "power_off_vm").allowed


def test_the_decision_refuses_a_role_that_does_not(parts: Parts, gate: Gate) -> None:
    verdict = gate.decide(write_facts(parts, READER), "power_off_vm")
    assert not verdict.allowed


async def test_an_allowed_verdict_is_enforced_silently(parts: Parts, gate: Gate) -> None:
    facts = write_facts(parts)
    ctx = parts.ctx(AGENT, "power_off_vm")
    verdict = await gate.enforce(ctx, gate.decide(facts, "power_off_vm"), facts, {})
    assert verdict.allowed and parts.rows() == []


async def test_a_refused_verdict_is_its_error_after_one_denied_row(parts: Parts, gate: Gate) -> None:
    facts = write_facts(parts, READER)
    ctx = parts.ctx(READER, "power_off_vm")
    with pytest.raises(NotFound) as refused:  # a tool outside the role is as unknown to its caller
        await gate.check(ctx, facts, {"target": "vc1", "vm": "web-1"})
    (row,) = parts.rows(phase="denied")
    assert (row["tool"], row["caller"], row["target"], row["error_code"]) == \
        ("power_off_vm", "watcher", "vc1", refused.value.code)


async def test_every_refusal_names_its_arguments_and_error(parts: Parts, gate: Gate) -> None:
    with pytest.raises(NotFound):
        await gate.refused(parts.ctx(AGENT, "get_vm_details"), {"target": "vc1", "vm": "x"}, NotFound("no x"))
    (row,) = parts.rows(phase="denied")
    assert (row["args"], row["error"], row["target"]) == ({"target": "vc1", "vm": "x"}, "no x", "vc1")


async def test_busy_refusals_are_one_row_per_burst(parts: Parts, gate: Gate) -> None:
    ctx = parts.ctx(AGENT, "get_vm_details")
    for _ in range(3):
        with pytest.raises(Busy):
            await gate.refused(ctx, {"target": "vc1"}, Busy("vc1 is busy", retry_after=1.0, target="vc1"))
    assert parts.rows() == [], "counted, not written one by one"
    await gate.busy.flush()
    (row,) = parts.rows(phase="busy")
    assert (row["count"], row["target"], row["error_code"], row["tools"]) == \
        (3, "vc1", "busy", ["get_vm_details"])


async def test_a_change_is_refused_while_the_audit_cannot_take_rows(parts: Parts, gate: Gate) -> None:
    ctx = parts.ctx(AGENT, "power_off_vm")
    await gate.refuse_unless_audit_writable(ctx, {"target": "vc1"}, target="vc1")  # writable: passes
    parts.backends.audit.close()
    with pytest.raises(AuditUnavailable):
        await gate.refuse_unless_audit_writable(ctx, {"target": "vc1"}, target="vc1")
    assert [(r["phase"], r["error_code"]) for r in parts.trail.waiting] == [("refused", "audit_unavailable")]


async def test_a_rate_limit_refuses_the_call_past_it(parts: Parts, gate: Gate) -> None:
    parts.write_rules({"defaults": {**PERMISSIVE["defaults"], "max_calls_per_minute": {"write": 1}}})
    ctx = parts.ctx(AGENT, "power_off_vm")
    await gate.rate_limit(ctx, {"target": "vc1"}, "vc1", ctx.spec.kind)
    with pytest.raises(RateLimited):
        await gate.rate_limit(ctx, {"target": "vc1"}, "vc1", ctx.spec.kind)
    assert [r["error_code"] for r in parts.rows(phase="denied")] == ["rate_limited"]


async def test_a_change_refused_again_and_again_trips_the_breaker(parts: Parts) -> None:
    gate = gate_of(parts, breaker=RunawayBreaker(max_repeats=2))
    ctx = parts.ctx(READER, "power_off_vm")
    args = {"target": "vc1", "vm": "web-1"}
    await gate.count_refused_change(ctx, "vc1", args)
    await gate.count_refused_change(ctx, "vc1", args)
    with pytest.raises(RateLimited):
        await gate.count_refused_change(ctx, "vc1", args)
    assert [r["error_code"] for r in parts.rows(phase="denied")] == ["rate_limited"]


async def test_a_resolved_plan_is_decided_on_its_objects(parts: Parts, gate: Gate) -> None:
    parts.write_rules({**PERMISSIVE, "protected": [{"name": "keep-db", "vm_patterns": ["db-*"]}]})
    ctx = parts.ctx(AGENT, "delete_vm")
    target = parts.targets["vc1"]
    args = {"target": "vc1", "vm": "web-1"}
    verdict = await gate.authorize_plan(ctx, Entry.WRITE, ctx.party, args, target, plan_of("web-1"))
    assert verdict.allowed
    with pytest.raises(PolicyDenied, match="protected by 'keep-db'"):
        await gate.authorize_plan(ctx, Entry.WRITE, ctx.party, args, target, plan_of("db-1"))
    (row,) = parts.rows(phase="denied")
    assert row["target"] == "vc1" and row["decision"]["allowed"] is False


def test_the_decision_is_a_dry_run_when_the_gateway_or_the_target_says_so(parts: Parts) -> None:
    target = parts.targets["vc1"]
    verdict = gate_of(parts).decide(write_facts(parts), "power_off_vm")
    assert not gate_of(parts).decision_of(verdict, target).dry_run
    assert gate_of(parts, dry_run=True).decision_of(verdict, target).dry_run
    assert gate_of(parts).decision_of(verdict, replace(target, dry_run=True)).dry_run
