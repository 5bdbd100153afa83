"""The execution of a decided change: the intent row before vSphere, the change, the outcome row after.

Used by ``Writes`` (a change that needs no one's confirmation) and by the proposal flow (a claimed
proposal, whose intent row its claim wrote)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gateway.answer import Answer
from gateway.audit.redact import displayable, displayable_text
from gateway.config import Target
from gateway.errors import GatewayError, OutcomeUnknown
from gateway.guard.policy.model import Decision
from gateway.proposals import Proposal
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.context import CallContext, ProgressSink, redact_args, truncate
from gateway.server.base.moves import Moves
from gateway.vocabulary import Plan
from gateway.vsphere.scheduler import Scheduler

#: what a tool resolves its objects with (``ToolSpec.plan``): the session, the call's arguments
PlanFn = Callable[[Any, Mapping[str, Any]], Plan]


class Execution:
    """Runs a decided change on its target, each step audited (a proposal's steps as its moves)."""

    def __init__(self, *, trail: AuditTrail, scheduler: Scheduler, moves: Moves) -> None:
        self.trail = trail
        self.scheduler = scheduler
        self.moves = moves

    async def plan(self, target: Target, plan_fn: PlanFn, args: Mapping[str, Any]) -> Plan:
        """Resolve a change's objects on ``target`` (nothing changes), within the target's deadline."""
        return await self.scheduler.run(target.name, lambda s: plan_fn(s, args),
                                        deadline=target.timeout_seconds)

    async def execute(
        self,
        ctx: CallContext,
        target: Target,
        plan: Plan,
        decision: Decision,
        args: Mapping[str, Any],
        progress: ProgressSink | None,
        proposal: Proposal | None = None,
    ) -> Answer:
        """Audit the intent durably, then (only then) run the change, then audit its outcome. The answer
        is encoded once, in a worker thread, and the outcome row fingerprints those very bytes (for a
        proposal: the answer naming it that its confirm or approval sends)."""
        spec = ctx.spec
        execute = spec.execute
        assert execute is not None
        base = {
            "target": target.name,
            "args": redact_args(spec, args),
            "decision": decision.to_dict(),
            "proposal_id": proposal.id if proposal else None,
        }
        if decision.dry_run:
            would = {
                "dry_run": True,
                "target": target.name,
                "would": displayable_text(plan.summary),
                "affected": displayable([a.to_dict() for a in plan.affected]),
            }
            answer = await asyncio.to_thread(Answer.cleaned, _sent(would, target, proposal))
            await self.trail.record(ctx.row("dry_run", outcome="ok", result=answer, **base))
            if proposal is not None:
                await self.moves.move(
                    proposal,
                    ["executing"],
                    "executed",
                    actor=ctx.principal,
                    outcome="ok",
                    result={"dry_run": True},
                )
            return answer
        params = dict(plan.params)
        params["auto_snapshot"] = decision.auto_snapshot and spec.snapshot_before
        plan = replace(plan, params=params)
        relay = self._progress_relay(progress)
        if proposal is None:  # a claimed proposal's intent row was written by its claim
            await self.trail.intent(ctx.row("executing", **base))
        try:
            # admitted when planned: after its intent row a change is never refused as busy
            result = await self.scheduler.run(target.name, lambda s: execute(s, plan, relay), bounded=False)
        except BaseException as exc:
            # a refusal or fault of vSphere, or anything unforeseen (cancellation included): the outcome
            # is recorded either way; only a typed error says the change surely did not finish
            known = isinstance(exc, GatewayError) and exc.code != "outcome_unknown"
            error = (
                exc
                if isinstance(exc, GatewayError)
                else OutcomeUnknown(
                    "the change was interrupted; check the objects and get_tasks before doing anything again"
                )
            )
            state = "failed" if known else "outcome_unknown"
            if proposal is not None:
                await asyncio.shield(
                    self.moves.move(
                        proposal,
                        ["executing"],
                        state,
                        actor=ctx.principal,
                        outcome=error.code,
                        error=error.to_wire(),
                        reason=truncate(error.message, 512),
                    )
                )
            else:
                await asyncio.shield(
                    self.trail.record_outcome(
                        ctx.row(
                            state,
                            outcome=error.code,
                            error_code=error.code,
                            error=truncate(error.message, 512),
                            **base,
                        )
                    )
                )
            raise
        sent = await asyncio.to_thread(Answer.cleaned, _sent(result, target, proposal))
        if proposal is not None:
            await self.moves.move(
                proposal,
                ["executing"],
                "executed",
                actor=ctx.principal,
                outcome="ok",
                result={"summary": proposal.plan_summary},
                result_row=sent,
            )
        else:
            await self.trail.record_outcome(ctx.row("executed", outcome="ok", result=sent, **base))
        return sent

    def _progress_relay(self, sink: ProgressSink | None) -> Callable[[float, str], None]:
        if sink is None:
            return lambda _f, _m: None
        return _Relay(sink, asyncio.get_running_loop())



class _Relay:
    """Progress from a worker thread to ``sink`` on the loop; the sink's ``task_started`` (an MCP task
    that may be cancelled, ``gateway.server.edge.mcp_tasks``) learns each vSphere task the change starts."""

    def __init__(self, sink: ProgressSink, loop: asyncio.AbstractEventLoop) -> None:
        self.sink, self.loop = sink, loop
        self.task_started = getattr(sink, "task_started", None)

    def __call__(self, fraction: float, message: str) -> None:
        asyncio.run_coroutine_threadsafe(self.sink(fraction, message), self.loop)


def _sent(result: dict[str, Any], target: Target, proposal: Proposal | None) -> dict[str, Any]:
    """What the caller is sent for a change: its result; for a proposal, the result naming the proposal."""
    if proposal is None:
        return result
    return {"state": "executed", "proposal_id": proposal.id, "target": target.name, **result}
