"""The gate: where the call path asks the decision and enforces its verdict.

``authorize`` before anything is read, ``authorize_resolved`` on a resolved plan; the rate limits and the
runaway breaker; every refusal one audit row."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NoReturn

from gateway import tracing
from gateway.config import Target
from gateway.errors import Busy, GatewayError, RateLimited
from gateway.guard import confirm
from gateway.guard.callers import scope_of
from gateway.guard.decision import Entry, Facts, Party, Verdict, authorize, authorize_resolved
from gateway.guard.limits import RateLimiter, RunawayBreaker
from gateway.guard.policy.model import Decision, TargetPolicy
from gateway.proposals import Proposal
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.context import CallContext, off_loop, redact_args, target_label, truncate
from gateway.server.base.facts import FactsNow
from gateway.server.call.busy_audit import BusyAudit
from gateway.vocabulary import Category, Plan

_DENIAL_CODES = frozenset(
    {
        "policy_denied",
        "forbidden",
        "rate_limited",
        "not_found",
        "approval_required",
        "reason_required",
        "confirmation_invalid",
        "confirmation_expired",
    }
)


class Gate:
    """Asks the decision, enforces its verdicts and the call limits; every refusal audited."""

    def __init__(self, *, facts: FactsNow, trail: AuditTrail, busy: BusyAudit, rate_limiter: RateLimiter,
                 dry_run: bool, breaker: RunawayBreaker | None = None) -> None:
        self.facts = facts
        self.trail = trail
        #: calls refused as busy, audited once per burst (not one row each)
        self.busy = busy
        self.rate_limiter = rate_limiter
        self.dry_run = dry_run
        self.breaker = breaker

    def decide(self, facts: Facts, tool: str) -> Verdict:
        """``authorize`` on facts gathered before anything is read from vSphere (traced)."""
        with tracing.span("gateway.decision", **{"gateway.entry": facts.entry.value, "gateway.tool": tool}):
            return authorize(facts)

    async def check(
        self, ctx: CallContext, facts: Facts, args: Mapping[str, Any] | None, **row: Any
    ) -> Verdict:
        """``authorize`` and, on a refusal, its audited error."""
        return await self.enforce(ctx, self.decide(facts, ctx.spec.name), facts, args, **row)

    async def enforce(
        self, ctx: CallContext, verdict: Verdict, facts: Facts, args: Mapping[str, Any] | None, **row: Any
    ) -> Verdict:
        """A refused verdict as its audited error (the one place a verdict is enforced)."""
        if not verdict.allowed:
            row.setdefault("target", facts.target)
            try:
                verdict.raise_if_refused()
            except GatewayError as exc:
                await self.refused(ctx, args, exc, **row)
        return verdict

    async def refused(
        self, ctx: CallContext, args: Mapping[str, Any] | None, exc: GatewayError, **fields: Any
    ) -> NoReturn:
        """Audit a refused call (bounded arguments, the decision if any), then raise ``exc``; a call
        refused as ``busy`` is counted in its caller's burst (``BusyAudit``: one row per burst)."""
        fields.setdefault("target", target_label(args))
        if isinstance(exc, Busy):
            self.busy.record(ctx, str(exc.details.get("target") or fields["target"]))
            raise exc
        phase = (
            "denied"
            if exc.code in _DENIAL_CODES
            else "invalid"
            if exc.code == "invalid_argument"
            else "failed"
        )
        await self.trail.record(
            ctx.row(
                phase,
                args=redact_args(ctx.spec, args or {}),
                error_code=exc.code,
                reason_code=exc.details.get("reason_code"),
                decision=exc.details.get("decision"),
                error=truncate(exc.message, 512),
                **fields,
            )
        )
        raise exc

    async def refuse_unless_audit_writable(
        self, ctx: CallContext, args: Mapping[str, Any], **fields: Any
    ) -> None:
        """Refuse (the row waits for the audit) a change while the audit cannot take rows."""
        row = ctx.row("refused", args=redact_args(ctx.spec, args), **fields)
        await self.trail.refuse_unless_writable(row)

    async def count_refused_change(self, ctx: CallContext, target: str,
                                   args: Mapping[str, Any] | None) -> None:
        """A change refused at the gate counts toward the runaway breaker as an allowed one does
        (``Writes.write``): an agent looping on a refusal is told to fix its loop (rate_limited)."""
        if self.breaker is None:
            return
        try:
            digest = confirm.args_digest(ctx.spec.name, target, args or {})
        except (TypeError, ValueError):  # not canonical JSON: validation refuses it anyway
            return
        try:
            await off_loop(self.breaker.check, scope_of(ctx.principal), ctx.spec.name, digest,
                           ctx.spec.kind, time.monotonic(), shown=ctx.principal.name)
        except GatewayError as exc:
            await self.refused(ctx, args, exc, target=target)

    async def rate_limit(
        self,
        ctx: CallContext,
        args: Mapping[str, Any],
        target: str,
        kind: Category,
        limits: TargetPolicy | None = None,
    ) -> None:
        """Refuse (audited) a call over ``target``'s rate limit for ``kind``; ``limits`` when the caller
        already read the target's settings off the loop."""
        if limits is None:
            limits = await off_loop(self.facts.policy.target_limits, target)
        limited = await off_loop(self.over_rate, ctx, target, kind, limits)
        if limited is not None:
            await self.refused(ctx, args, limited, target=target)

    def over_rate(self, ctx: CallContext, target: str, kind: Category,
                  limits: TargetPolicy) -> RateLimited | None:
        """The refusal of a call of ``ctx``'s caller on ``target`` over its rate limit for ``kind``, None
        when it is within it (and now counted). Blocking (PostgreSQL: a DB call): run it off the loop,
        as ``rate_limit`` does, or in the worker trip that read the call's facts (``Reads``)."""
        per_minute, ceiling = limits.rate_limit(kind), limits.target_rate_limit(kind)
        try:
            self.rate_limiter.check(target, kind, per_minute, time.monotonic(),
                                    caller=scope_of(ctx.principal), target_limit=ceiling,
                                    shown=ctx.principal.name)
        except RateLimited as exc:
            return exc
        return None

    async def authorize_plan(
        self,
        ctx: CallContext,
        entry: Entry,
        actor: Party,
        args: Mapping[str, Any],
        target: Target,
        plan: Plan,
        owner: Party | None = None,
        proposal: Proposal | None = None,
    ) -> Verdict:
        """The whole decision on a resolved call, in ``authorize_resolved``'s order (the call, each object
        as each tool the call reaches, then the preconditions), its refusal audited."""
        facts = await off_loop(
            self.facts.facts,
            entry,
            actor,
            ctx.spec,
            args,
            target=target.name,
            plan=plan,
            owner=owner,
            proposal=proposal,
        )
        reached = tuple(
            (name, s.kind, s.risk) for name in ctx.spec.reaches(args) if (s := self.facts.registry.get(name))
        )
        with tracing.span("gateway.decision", **{"gateway.entry": entry.value, "gateway.tool": ctx.spec.name,
                                                 "gateway.target": target.name, "gateway.resolved": True}):
            verdict = await off_loop(authorize_resolved, facts, reached)  # a bulk call: many objects
        await self.enforce(ctx, verdict, facts, args, proposal_id=proposal.id if proposal else None)
        return verdict

    def decision_of(self, verdict: Verdict, target: Target) -> Decision:
        decision = verdict.decision or Decision(True, verdict.reason, verdict.rule)
        decision = replace(decision, require_approval=verdict.require_approval)
        if self.dry_run or target.dry_run:
            decision = replace(decision, dry_run=True)
        return decision
