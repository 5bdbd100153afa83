"""Writes: a change's one explicit target, breaker, rate limit, plan and resolved decision.

Then either a proposal (``Proposer``) or straight to the execution (``server.call.execution``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from gateway.answer import Answer
from gateway.config import Target
from gateway.errors import GatewayError, PolicyDenied
from gateway.guard import confirm
from gateway.guard.callers import scope_of
from gateway.guard.decision import Entry
from gateway.guard.limits import RunawayBreaker
from gateway.guard.policy.model import Decision
from gateway.server.base.context import ALL, CallContext, ProgressSink
from gateway.server.call.execution import Execution
from gateway.server.call.gate import Gate
from gateway.vocabulary import Category, Plan


class Proposer(Protocol):
    """Where a change needing a confirmation or a human's approval goes (``server.proposals.flow``)."""

    async def propose(self, ctx: CallContext, target: Target, args: dict[str, Any], plan: Plan,
                      decision: Decision, digest: str,
                      progress: ProgressSink | None = None) -> dict[str, Any] | Answer: ...


class Writes:
    """Decides a change on one explicit target, then proposes it or has it executed."""

    def __init__(self, targets: Mapping[str, Target], *, gate: Gate, breaker: RunawayBreaker,
                 execution: Execution, proposer: Proposer) -> None:
        self.targets = targets
        self.gate = gate
        self.breaker = breaker
        self.execution = execution
        self.proposer = proposer

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
            plan = await self.execution.plan(target, plan_fn, args)
        except GatewayError as exc:
            await self.gate.refused(ctx, args, exc, target=target.name)
        verdict = await self.gate.authorize_plan(ctx, Entry.WRITE, ctx.party, args, target, plan)
        decision = self.gate.decision_of(verdict, target)
        if spec.kind is Category.DESTRUCTIVE or decision.require_approval:
            return await self.proposer.propose(ctx, target, args, plan, decision, digest, progress)
        return await self.execution.execute(ctx, target, plan, decision, args, progress)
