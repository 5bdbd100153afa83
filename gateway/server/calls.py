"""The call path's gate: one tool call from its arrival to the handler that answers it (``Reads``,
``Writes``, the proposal flow): unstorable text, the caller now, the gate decision, argument validation,
rate limits, the resolved decision on a plan; every refusal audited, every call a metric."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, NoReturn

from gateway import tracing
from gateway.answer import Answer
from gateway.auth.tokens import Principal
from gateway.config import Target
from gateway.errors import (
    Busy,
    GatewayError,
    InvalidArgument,
    NotFound,
    RateLimited,
)
from gateway.guard import confirm, inputs
from gateway.guard.decision import (
    Entry,
    Facts,
    Party,
    TokenState,
    Verdict,
    authorize,
    authorize_resolved,
)
from gateway.guard.limits import RateLimiter, RunawayBreaker
from gateway.guard.policy.model import Decision, TargetPolicy
from gateway.proposals import Proposal
from gateway.server.audit_trail import AuditTrail
from gateway.server.busy_audit import BusyAudit
from gateway.server.context import (
    ALL,
    CallContext,
    ProgressSink,
    cut,
    entry_of,
    mcp_client_var,
    off_loop,
    redact_args,
    target_label,
    unknown_tool,
)
from gateway.server.facts import FactsNow
from gateway.server.metrics import Metrics
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Category, Plan
from gateway.vsphere.lane import queue_as

Handler = Callable[[CallContext, dict[str, Any], ProgressSink | None], Awaitable[dict[str, Any] | Answer]]
#: refusals counted as ``denied`` in the call metric (anything else a caller did wrong is an ``error``)
_METRIC_DENIALS = frozenset({"policy_denied", "forbidden", "rate_limited"})
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


class Calls:
    """Runs tool calls: the gate, reads, writes and the execution of a change, every refusal audited."""

    def __init__(self, targets: Mapping[str, Target], *, facts: FactsNow, trail: AuditTrail, metrics: Metrics,
                 rate_limiter: RateLimiter, dry_run: bool, breaker: RunawayBreaker | None = None) -> None:
        self.targets = targets
        self.breaker = breaker
        self.facts = facts
        self.trail = trail
        self.metrics = metrics
        self.rate_limiter = rate_limiter
        self.dry_run = dry_run
        #: calls refused as busy, audited once per burst (not one row each)
        self.busy = BusyAudit(trail)
        #: what answers a tool past the gate: the tools the gateway answers itself (by name), else a
        #: read or a write (``route``: the runtime wires ``Reads``, ``Writes`` and the proposal flow in)
        self.local: dict[str, Handler] = {}
        self._read: Handler | None = None
        self._write: Handler | None = None
        #: what every handler is wrapped in (the idempotency keys of changes, ``server.idempotency``)
        self.around: Callable[[ToolSpec, Handler], Handler] | None = None

    def route(self, *, read: Handler, write: Handler, local: Mapping[str, Handler]) -> None:
        self._read, self._write = read, write
        self.local.update(local)

    async def answer(
        self,
        principal: Principal,
        name: str,
        args: Mapping[str, Any] | None,
        *,
        progress: ProgressSink | None = None,
        correlation_id: str | None = None,
        client: str | None = None,
    ) -> Answer:
        """Run one tool call for ``principal``; raises GatewayError subclasses for expected failures.
        The answer is encoded once (``gateway.answer``): its text goes to the caller as is.

        ``client`` is the MCP client's declared ``name/version`` (from initialize), for audit rows."""
        client = client or mcp_client_var.get()
        await self._refuse_unstorable(principal, name, args, correlation_id, client)
        spec = self.facts.registry.get(name)
        actor = await off_loop(self.facts.party, principal)
        principal = replace(principal, kind=actor.kind)  # rows name the kind the store has now
        if spec is None:
            ctx = CallContext(principal, actor, unknown_tool(name), correlation_id, client)
            await self.refused(
                ctx,
                args,
                NotFound(f"unknown tool '{cut(name)}'; call tools/list to see the tools available to you"),
            )
        assert spec is not None
        ctx = CallContext(principal, actor, spec, correlation_id, client)
        outcome, target = "error", target_label(args)
        # every vSphere call this tool call makes queues as this caller, on every target it reaches
        with queue_as(principal.name, actor.role.queue_weight if actor.role else None):
            try:
                # the gate, once: a change names its one target here (reads decide per target once resolved)
                ref = (args or {}).get("target")
                single = spec.kind is not Category.READ and isinstance(ref, str) and ref != ALL
                gate = self.facts.facts(
                    Entry.LOCAL if spec.target_mode == "none" else entry_of(spec),
                    actor,
                    spec,
                    args or {},
                    target=ref if single else None,
                    resolved=False,
                )
                with tracing.span("gateway.decision",
                                  **{"gateway.entry": gate.entry.value, "gateway.tool": spec.name}):
                    verdict = authorize(gate)
                if not verdict.allowed and single:
                    await self.count_refused_change(ctx, str(ref), args)
                await self.enforce(ctx, verdict, gate, args)
                try:
                    valid = spec.validate(args)
                except InvalidArgument as exc:
                    await self.refused(ctx, args, exc)
                result = await self._handler_for(spec)(ctx, valid, progress)
                outcome = "ok"
                return result if isinstance(result, Answer) else Answer.cleaned(result)
            except GatewayError as exc:
                outcome = "denied" if exc.code in _METRIC_DENIALS else "error"
                raise
            finally:
                # metric labels only from configured names: raw caller input never becomes a label value
                known = target in self.targets or target == ALL
                label = "-" if target is None else target if known else "unknown"
                self.metrics.observe_call(spec.name, label, outcome, time.monotonic() - ctx.started)

    async def _refuse_unstorable(
        self,
        principal: Principal,
        name: str,
        args: Mapping[str, Any] | None,
        correlation_id: str | None,
        client: str | None,
    ) -> None:
        """Before anything else: a call holding text no engine can store (``guard.inputs``) is an
        invalid argument, audited with that text escaped (the audit's bounding step escapes it)."""
        where = inputs.unstorable_field(name, args)
        if where is None:
            return
        spec = self.facts.registry.get(name) if where != "tool" else None
        party = Party(principal.name, TokenState.USABLE, None)  # the row names the principal's role
        ctx = CallContext(principal, party, spec or unknown_tool(name), correlation_id, client)
        await self.refused(ctx, args, InvalidArgument(where, inputs.UNSTORABLE_MESSAGE))

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
            await off_loop(self.breaker.check, ctx.principal.name, ctx.spec.name, digest, ctx.spec.kind,
                           time.monotonic())
        except GatewayError as exc:
            await self.refused(ctx, args, exc, target=target)

    async def check(
        self, ctx: CallContext, facts: Facts, args: Mapping[str, Any] | None, **row: Any
    ) -> Verdict:
        """``authorize`` and, on a refusal, its audited error."""
        with tracing.span("gateway.decision",
                          **{"gateway.entry": facts.entry.value, "gateway.tool": ctx.spec.name}):
            verdict = authorize(facts)
        return await self.enforce(ctx, verdict, facts, args, **row)

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
                error=cut(exc.message, 512),
                **fields,
            )
        )
        raise exc

    def _handler_for(self, spec: ToolSpec) -> Handler:
        handler = self.local.get(spec.name) or (self._read if spec.kind is Category.READ else self._write)
        assert handler is not None  # the runtime routes reads and writes before the first call
        return self.around(spec, handler) if self.around is not None else handler

    async def refuse_unless_audit_writable(
        self, ctx: CallContext, args: Mapping[str, Any], **fields: Any
    ) -> None:
        """Refuse (the row waits for the audit) a change while the audit cannot take rows."""
        row = ctx.row("refused", args=redact_args(ctx.spec, args), **fields)
        await self.trail.refuse_unless_writable(row)

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
        per_minute, ceiling = limits.rate_limit(kind), limits.target_rate_limit(kind)
        try:
            await off_loop(self.rate_limiter.check, target, kind, per_minute, time.monotonic(),
                                caller=ctx.principal.name, target_limit=ceiling)  # PostgreSQL: a DB call
        except RateLimited as exc:
            await self.refused(ctx, args, exc, target=target)

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
