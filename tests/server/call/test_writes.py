"""``Writes``: a change names one explicit target, passes the audit's readiness, the breaker and the rate
limit, is planned and decided on its objects, then goes to the proposal flow (destructive, or a target
that wants a human) or straight to the execution. The vSphere side (planning, running) is a stand-in."""

from __future__ import annotations

from typing import Any

import pytest
from support.server_parts import AGENT, PERMISSIVE, Parts, StandInExecution, plan_of

from gateway.config import Target
from gateway.errors import AuditUnavailable, NotFound, PolicyDenied, RateLimited
from gateway.guard import confirm
from gateway.guard.limits import RateLimiter, RunawayBreaker
from gateway.guard.policy.model import Decision
from gateway.server.base.context import CallContext, ProgressSink
from gateway.server.call.busy_audit import BusyAudit
from gateway.server.call.gate import Gate
from gateway.server.call.writes import Writes
from gateway.vocabulary import Plan

pytestmark = pytest.mark.anyio


class RecordingProposer:
    """Records the changes handed to the proposal flow."""

    def __init__(self) -> None:
        self.proposed: list[tuple[str, str, Decision]] = []

    async def propose(self, ctx: CallContext, target: Target, args: dict[str, Any], plan: Plan,
                      decision: Decision, digest: str,
                      progress: ProgressSink | None = None) -> dict[str, Any]:
        self.proposed.append((ctx.spec.name, digest, decision))
        return {"state": "pending"}


def writes_of(parts: Parts, execution: StandInExecution, proposer: RecordingProposer,
              breaker: RunawayBreaker | None = None) -> Writes:
    gate = Gate(facts=parts.facts, trail=parts.trail, busy=BusyAudit(parts.trail), rate_limiter=RateLimiter(),
                dry_run=False)
    return Writes(parts.targets, gate=gate, breaker=breaker or RunawayBreaker(),
                  execution=execution, proposer=proposer)  # type: ignore[arg-type]


ARGS = {"target": "vc1", "vm": "web-1"}


async def test_a_write_is_planned_decided_and_executed(parts: Parts) -> None:
    execution, proposer = StandInExecution(plan_of("web-1")), RecordingProposer()
    writes = writes_of(parts, execution, proposer)
    answer = await writes.write(parts.ctx(AGENT, "power_off_vm"), dict(ARGS), None)
    assert answer.value == {"state": "done"}  # type: ignore[union-attr]
    ((target, plan, decision),) = execution.ran
    assert (target, plan.summary, decision.allowed, decision.dry_run) == ("vc1", "delete web-1", True, False)
    assert execution.planned == [ARGS] and proposer.proposed == []


async def test_a_destructive_change_becomes_a_proposal_and_runs_nothing(parts: Parts) -> None:
    execution, proposer = StandInExecution(plan_of("web-1")), RecordingProposer()
    writes = writes_of(parts, execution, proposer)
    assert await writes.write(parts.ctx(AGENT, "delete_vm"), dict(ARGS), None) == {"state": "pending"}
    ((tool, digest, decision),) = proposer.proposed
    assert (tool, digest, decision.allowed) == ("delete_vm", confirm.args_digest("delete_vm", "vc1", ARGS),
                                                True)
    assert execution.ran == []


async def test_a_target_that_wants_a_human_says_so_in_the_proposal(parts: Parts) -> None:
    parts.write_rules({**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    execution, proposer = StandInExecution(plan_of("web-1")), RecordingProposer()
    await writes_of(parts, execution, proposer).write(parts.ctx(AGENT, "delete_vm"), dict(ARGS), None)
    ((tool, _digest, decision),) = proposer.proposed
    assert (tool, decision.require_approval) == ("delete_vm", True) and execution.ran == []


@pytest.mark.parametrize("ref", ["all", ["vc1", "vc2"]])
async def test_a_change_names_exactly_one_target(parts: Parts, ref: Any) -> None:
    execution = StandInExecution(plan_of("web-1"))
    with pytest.raises(PolicyDenied, match="exactly one explicit target"):
        await writes_of(parts, execution, RecordingProposer()).write(
            parts.ctx(AGENT, "power_off_vm"), {"target": ref, "vm": "web-1"}, None)
    (row,) = parts.rows(phase="denied")
    assert row["decision"]["rule"] == "target:single" and execution.planned == []


async def test_nothing_is_planned_while_the_audit_cannot_take_rows(parts: Parts) -> None:
    execution = StandInExecution(plan_of("web-1"))
    parts.backends.audit.close()
    with pytest.raises(AuditUnavailable):
        await writes_of(parts, execution, RecordingProposer()).write(
            parts.ctx(AGENT, "power_off_vm"), dict(ARGS), None)
    assert execution.planned == []


async def test_the_same_change_repeated_trips_the_breaker(parts: Parts) -> None:
    execution = StandInExecution(plan_of("web-1"))
    writes = writes_of(parts, execution, RecordingProposer(), breaker=RunawayBreaker(max_repeats=2))
    ctx = parts.ctx(AGENT, "power_off_vm")
    await writes.write(ctx, dict(ARGS), None)
    await writes.write(ctx, dict(ARGS), None)
    with pytest.raises(RateLimited):
        await writes.write(ctx, dict(ARGS), None)
    assert len(execution.ran) == 2
    assert [r["error_code"] for r in parts.rows(phase="denied")] == ["rate_limited"]


async def test_a_plan_that_fails_is_refused_and_audited(parts: Parts) -> None:
    execution = StandInExecution(plan_of("web-1"), plan_fails=NotFound("no VM named 'web-1'"))
    with pytest.raises(NotFound):
        await writes_of(parts, execution, RecordingProposer()).write(
            parts.ctx(AGENT, "power_off_vm"), dict(ARGS), None)
    (row,) = parts.rows(phase="denied")
    assert (row["error_code"], row["target"], row["error"]) == ("not_found", "vc1", "no VM named 'web-1'")
    assert execution.ran == []


async def test_the_resolved_objects_are_decided_before_anything_runs(parts: Parts) -> None:
    parts.write_rules({**PERMISSIVE, "protected": [{"name": "keep-db", "vm_patterns": ["db-*"]}]})
    execution, proposer = StandInExecution(plan_of("db-1")), RecordingProposer()
    with pytest.raises(PolicyDenied, match="keep-db"):
        await writes_of(parts, execution, proposer).write(
            parts.ctx(AGENT, "delete_vm"), {"target": "vc1", "vm": "db-1"}, None)
    assert execution.ran == [] and proposer.proposed == []
