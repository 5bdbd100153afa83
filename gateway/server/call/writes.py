"""Writes: a change's gate, breaker, rate limit and plan, the resolved decision, then either a
proposal (``Proposer``) or the execution: the intent row before vSphere, the outcome row after."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from gateway.answer import Answer
from gateway.audit.redact import displayable, displayable_text
from gateway.config import Target
from gateway.errors import GatewayError, OutcomeUnknown, PolicyDenied
from gateway.guard import confirm
from gateway.guard.callers import scope_of
from gateway.guard.decision import Entry
from gateway.guard.limits import RunawayBreaker
from gateway.guard.policy.model import Decision
from gateway.proposals import Proposal
from gateway.server.base.context import ALL, CallContext, ProgressSink, redact_args, truncate
from gateway.server.base.moves import Moves
from gateway.server.call.gate import Gate
from gateway.vocabulary import Category, Plan
from gateway.vsphere.scheduler import Scheduler


class Proposer(Protocol):
    """Where a change needing a confirmation or a human's approval goes (``server.proposals.flow``)."""

    async def propose(self, ctx: CallContext, target: Target, args: dict[str, Any], plan: Plan,
                      decision: Decision, digest: str,
                      progress: ProgressSink | None = None) -> dict[str, Any] | Answer: ...


class Writes:
    """Runs changes through the gate (``call.gate``): one explicit target, planned, decided, executed."""

    def __init__(self, gate: Gate, *, scheduler: Scheduler, moves: Moves, breaker: RunawayBreaker) -> None:
        self.gate = gate
        self.facts = gate.facts
        self.targets = gate.targets
        self.trail = gate.trail
        self.scheduler = scheduler
        self.moves = moves
        self.breaker = breaker
        self.proposer: Proposer | None = None

    async def write(
        self, ctx: CallContext, args: dict[str, Any], progress: ProgressSink | None
    ) -> dict[str, Any] | Answer:
        spec = ctx.spec
        plan_fn = spec.plan
        assert plan_fn is not None and spec.execute is not None
        ref = args["target"]
        if not isinstance(ref, str) or ref == ALL:
            reason = "a change needs exactly one explicit target; 'all' and lists are refused for writes"
            single = {"allowed": False, "reason": reason, "rule": "target:single"}
            await self.gate.refused(ctx, args, PolicyDenied(reason, decision=single))
        target = self.targets[ref]  # known: the gate (``Calls.answer``) refused any other
        await self.gate.refuse_unless_audit_writable(ctx, args, target=target.name)
        digest = confirm.args_digest(spec.name, target.name, args)
        try:
            self.breaker.check(scope_of(ctx.principal), spec.name, digest, spec.kind, time.monotonic(),
                               shown=ctx.principal.name)
        except GatewayError as exc:
            await self.gate.refused(ctx, args, exc, target=target.name)
        await self.gate.rate_limit(ctx, args, target.name, spec.kind)
        try:
            plan = await self.scheduler.run(
                target.name, lambda s: plan_fn(s, args), deadline=target.timeout_seconds
            )
        except GatewayError as exc:
            await self.gate.refused(ctx, args, exc, target=target.name)
        verdict = await self.gate.authorize_plan(ctx, Entry.WRITE, ctx.party, args, target, plan)
        decision = self.gate.decision_of(verdict, target)
        if spec.kind is Category.DESTRUCTIVE or decision.require_approval:
            assert self.proposer is not None  # the runtime wires the proposal flow in
            return await self.proposer.propose(ctx, target, args, plan, decision, digest, progress)
        return await self.execute(ctx, target, plan, decision, args, progress)

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
