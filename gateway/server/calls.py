"""The call path: one tool call from the gate to its answer. Reads (single target, fan-out, read
rules), writes (gate, breaker, rate limits, plan, the resolved decision) and execution (intent row
before vSphere, outcome row after), every refusal audited; a destructive call goes to the proposer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, NoReturn, Protocol

from gateway.answer import Answer
from gateway.auth.tokens import Principal
from gateway.config import Target
from gateway.errors import (
    Forbidden,
    GatewayError,
    InvalidArgument,
    NotFound,
    OutcomeUnknown,
    PolicyDenied,
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
    read_rules,
)
from gateway.guard.limits import RateLimiter, RunawayBreaker
from gateway.guard.policy import Decision, TargetPolicy
from gateway.guard.policy_store import PolicyStore
from gateway.guard.read_filter import Filtered, ReadFilter, read_args
from gateway.guard.redact import shown, shown_text
from gateway.guard.sanitize import clean
from gateway.server.audit_trail import AuditTrail
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
from gateway.server.moves import Moves
from gateway.server.read_rules import ReadRules, denial
from gateway.settings import Settings
from gateway.store.base import Proposal
from gateway.tools.read import summarize_targets, target_about
from gateway.tools.registry import Registry
from gateway.tools.spec import Category, Plan, ToolSpec
from gateway.vsphere.mirror import Mirrors
from gateway.vsphere.pool import VSphereSession
from gateway.vsphere.scheduler import Scheduler

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
        "confirmation_invalid",
        "confirmation_expired",
    }
)


class Proposer(Protocol):
    """Where a change needing a confirmation or a human's approval goes (``server.proposal_flow``)."""

    async def propose(self, ctx: CallContext, target: Target, args: dict[str, Any], plan: Plan,
                      decision: Decision, digest: str) -> dict[str, Any]: ...


class Calls:
    """Runs tool calls: the gate, reads, writes and the execution of a change, every refusal audited."""

    def __init__(self, settings: Settings, targets: Mapping[str, Target], registry: Registry, *,
                 scheduler: Scheduler, mirrors: Mirrors, read_rules: ReadRules, policy: PolicyStore,
                 facts: FactsNow, trail: AuditTrail, moves: Moves, metrics: Metrics,
                 rate_limiter: RateLimiter, breaker: RunawayBreaker) -> None:
        self.settings = settings
        self.targets = targets
        self.registry = registry
        self.scheduler = scheduler
        self.mirrors = mirrors
        self.read_rules = read_rules
        self.policy = policy
        self.facts = facts
        self.trail = trail
        self.moves = moves
        self.metrics = metrics
        self.rate_limiter = rate_limiter
        self.breaker = breaker
        self.proposer: Proposer | None = None
        #: the tools answered by the gateway itself (list_targets here; the proposal tools by the flow)
        self.local: dict[str, Handler] = {"list_targets": self._list_targets}

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
        spec = self.registry.get(name)
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
        try:
            gate = self.facts.facts(
                Entry.LOCAL if spec.target_mode == "none" else entry_of(spec),
                actor,
                spec,
                args or {},
                resolved=False,
            )
            await self.check(ctx, gate, args)
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
            label = (
                "-" if target is None else target if target in self.targets or target == ALL else "unknown"
            )
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
        spec = self.registry.get(name) if where != "tool" else None
        party = Party(principal.name, TokenState.USABLE, None)  # the row names the principal's role
        ctx = CallContext(principal, party, spec or unknown_tool(name), correlation_id, client)
        await self.refused(ctx, args, InvalidArgument(where, inputs.UNSTORABLE_MESSAGE))

    async def check(
        self, ctx: CallContext, facts: Facts, args: Mapping[str, Any] | None, **row: Any
    ) -> Verdict:
        """``authorize`` and, on a refusal, its audited error."""
        return await self.enforce(ctx, authorize(facts), facts, args, **row)

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
        """Audit a refused call (bounded arguments, the decision if any), then raise ``exc``."""
        fields.setdefault("target", target_label(args))
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
        if spec.name in self.local:
            return self.local[spec.name]
        return self._read if spec.kind is Category.READ else self._write

    async def _read_targets(
        self, ctx: CallContext, args: dict[str, Any]
    ) -> tuple[list[str], dict[str, dict[str, Any]], dict[str, ReadFilter | None]]:
        """The targets a read goes to, each authorized (role, policy) and rate limited, every refusal
        audited, with what the read may show on each (read rules). A single target's refusal is
        raised; in a fan-out a target the policy or a rate limit refuses answers its own error, and the
        others still answer (a target outside the role is refused for the whole call, like an unknown
        one)."""
        ref = args["target"]
        single = isinstance(ref, str) and ref != ALL
        if ref == ALL:
            names = [t.name for t in self.facts.visible_targets(ctx.role)]
            if not names:
                await self.refused(ctx, args, Forbidden("your role covers no configured target"))
        else:
            names = [ref] if isinstance(ref, str) else list(ref)
        refused: dict[str, dict[str, Any]] = {}
        filters: dict[str, ReadFilter | None] = {}
        for name in names:
            facts, limits = await off_loop(self._read_facts, ctx, args, name)
            filters[name] = read_rules(facts)
            try:
                await self.check(ctx, facts, args, target=name)
                await self._rate_limit(ctx, args, name, Category.READ, limits)
            except (PolicyDenied, RateLimited) as exc:
                if single:
                    raise
                refused[name] = {"error": {k: v for k, v in exc.to_wire().items() if k != "decision"}}
        if not single and len(refused) == len(names):
            raise PolicyDenied(f"the policy refuses this read on every target named: {', '.join(refused)}")
        return names, refused, filters

    def _read_facts(
        self, ctx: CallContext, args: Mapping[str, Any], target: str
    ) -> tuple[Facts, TargetPolicy]:
        """A read's facts on ``target`` and the target's limits: one trip off the event loop for both."""
        facts = self.facts.facts(Entry.READ, ctx.party, ctx.spec, args, target=target)
        return facts, self.policy.target_limits(target)

    async def _read(
        self, ctx: CallContext, args: dict[str, Any], _p: ProgressSink | None
    ) -> Answer:
        ref = args["target"]
        names, refused, filters = await self._read_targets(ctx, args)
        # read rules: list_vms is read so that what is hidden can be told and left out (read_args)
        wanted, shaping = read_args(ctx.spec.name, args, any(f is not None for f in filters.values()))
        fn = self._read_fn(ctx.spec, wanted)
        row = {"target": target_label(args), "args": redact_args(ctx.spec, args)}
        hidden: Filtered | None = None
        try:
            if isinstance(ref, str) and ref != ALL:
                target = self.targets[names[0]]
                mirrored = await self.mirrors.answer(target.name, ctx.spec.name, wanted)
                result = mirrored if mirrored is not None else await self.scheduler.run(
                    target.name, fn, deadline=target.timeout_seconds
                )
                if filters[target.name] is not None or shaping.changes:
                    filtered = await self.read_rules.shown(
                        ctx.spec.name, target.name, result, filters[target.name], shaping)
                    hidden, result = (filtered, None) if filtered.answer is None else (None, filtered.answer)
                outcomes = None
            else:
                answered = await self.mirrors.fan_out(
                    [n for n in names if n not in refused],
                    ctx.spec.name,
                    wanted,
                    lambda rest: self.scheduler.fan_out(
                        rest, fn, deadline=self.settings.fanout_timeout_seconds
                    ),
                )
                answered = await self.read_rules.fan_out(ctx.spec.name, answered, filters, shaping)
                result = {n: refused[n] if n in refused else answered[n] for n in dict.fromkeys(names)}
                outcomes = {
                    n: "ok" if "ok" in r else r.get("error", {}).get("code", "error")
                    for n, r in result.items()
                }
        except GatewayError as exc:
            await self.trail.record(ctx.row("call", outcome="error", error_code=exc.code, **row))
            raise
        if hidden is not None:  # read rules hide the one object this read is about
            await self.refused(ctx, args, denial(ctx.spec.name, names[0], hidden), target=names[0])
        outcome = "ok" if not outcomes or all(v == "ok" for v in outcomes.values()) else "partial"
        done = ctx.row("call", outcome=outcome, outcomes=outcomes, **row)
        return await self.trail.record_answer(done, result)

    def _read_fn(self, spec: ToolSpec, args: Mapping[str, Any]) -> Callable[[VSphereSession], Any]:
        """What a read runs on a target's worker thread: the tool's read, given the target's mirror as a
        name index when the tool takes one (the answer is still read live)."""
        with_lookup, read = spec.read_with_lookup, spec.read
        if with_lookup is not None:
            return lambda s: with_lookup(s, args, self.mirrors.lookup(s.target.name))
        assert read is not None
        return lambda s: read(s, args)

    async def refuse_unless_audit_writable(
        self, ctx: CallContext, args: Mapping[str, Any], **fields: Any
    ) -> None:
        """Refuse (the row waits for the audit) a change while the audit cannot take rows."""
        row = ctx.row("refused", args=redact_args(ctx.spec, args), **fields)
        await self.trail.refuse_unless_writable(row)

    async def _rate_limit(
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
            limits = await off_loop(self.policy.target_limits, target)
        per_minute, ceiling = limits.rate_limit(kind), limits.target_rate_limit(kind)
        try:
            await off_loop(self.rate_limiter.check, target, kind, per_minute, time.monotonic(),
                                caller=ctx.principal.name, target_limit=ceiling)  # PostgreSQL: a DB call
        except RateLimited as exc:
            await self.refused(ctx, args, exc, target=target)

    async def _list_targets(
        self, ctx: CallContext, _a: dict[str, Any], _p: ProgressSink | None
    ) -> dict[str, Any]:
        targets = self.facts.visible_targets(ctx.role)
        results = await self.scheduler.fan_out(
            [t.name for t in targets], target_about, deadline=self.settings.fanout_timeout_seconds
        )
        rows = summarize_targets(targets, results)
        if not ctx.role.all_targets:
            for row in rows:
                for key in ("host", "address", "port"):
                    row.pop(key, None)
        out = {"targets": clean(rows), "count": len(rows)}
        await self.trail.record(ctx.row("call", outcome="ok", result=out))
        return out

    async def _write(
        self, ctx: CallContext, args: dict[str, Any], progress: ProgressSink | None
    ) -> dict[str, Any]:
        spec = ctx.spec
        plan_fn = spec.plan
        assert plan_fn is not None and spec.execute is not None
        ref = args["target"]
        if not isinstance(ref, str) or ref == ALL:
            reason = "a change needs exactly one explicit target; 'all' and lists are refused for writes"
            single = {"allowed": False, "reason": reason, "rule": "target:single"}
            await self.refused(ctx, args, PolicyDenied(reason, decision=single))
        gate = self.facts.facts(Entry.WRITE, ctx.party, spec, args, target=ref, resolved=False)
        await self.check(ctx, gate, args)
        target = self.targets[ref]
        await self.refuse_unless_audit_writable(ctx, args, target=target.name)
        digest = confirm.args_digest(spec.name, target.name, args)
        try:
            self.breaker.check(ctx.principal.name, spec.name, digest, spec.kind, time.monotonic())
        except GatewayError as exc:
            await self.refused(ctx, args, exc, target=target.name)
        await self._rate_limit(ctx, args, target.name, spec.kind)
        try:
            plan = await self.scheduler.run(
                target.name, lambda s: plan_fn(s, args), deadline=target.timeout_seconds
            )
        except GatewayError as exc:
            await self.refused(ctx, args, exc, target=target.name)
        verdict = await self.authorize_plan(ctx, Entry.WRITE, ctx.party, args, target, plan)
        decision = self.decision_of(verdict, target)
        if spec.kind is Category.DESTRUCTIVE or decision.require_approval:
            assert self.proposer is not None  # the runtime wires the proposal flow in
            return await self.proposer.propose(ctx, target, args, plan, decision, digest)
        return await self.execute(ctx, target, plan, decision, args, progress)

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
            (name, s.kind, s.risk) for name in ctx.spec.reaches(args) if (s := self.registry.get(name))
        )
        verdict = await off_loop(authorize_resolved, facts, reached)  # a bulk call: many objects
        await self.enforce(ctx, verdict, facts, args, proposal_id=proposal.id if proposal else None)
        return verdict

    def decision_of(self, verdict: Verdict, target: Target) -> Decision:
        decision = verdict.decision or Decision(True, verdict.reason, verdict.rule)
        decision = replace(decision, require_approval=verdict.require_approval)
        if self.settings.dry_run or target.dry_run:
            decision = replace(decision, dry_run=True)
        return decision

    async def execute(
        self,
        ctx: CallContext,
        target: Target,
        plan: Plan,
        decision: Decision,
        args: Mapping[str, Any],
        progress: ProgressSink | None,
        proposal: Proposal | None = None,
    ) -> dict[str, Any]:
        """Audit the intent durably, then (only then) run the change, then audit its outcome."""
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
                "would": shown_text(plan.summary),
                "affected": shown([a.to_dict() for a in plan.affected]),
            }
            await self.trail.record(ctx.row("dry_run", outcome="ok", result=would, **base))
            if proposal is not None:
                await self.moves.move(
                    proposal,
                    ["executing"],
                    "executed",
                    actor=ctx.principal,
                    outcome="ok",
                    result={"dry_run": True},
                )
            return would
        params = dict(plan.params)
        params["auto_snapshot"] = decision.auto_snapshot and spec.snapshot_before
        plan = replace(plan, params=params)
        relay = self._progress_relay(progress)
        if proposal is None:  # a claimed proposal's intent row was written by its claim
            await self.trail.intent(ctx.row("executing", **base))
        try:
            result = await self.scheduler.run(target.name, lambda s: execute(s, plan, relay))
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
                        reason=cut(error.message, 512),
                    )
                )
            else:
                await asyncio.shield(
                    self.trail.record_outcome(
                        ctx.row(
                            state,
                            outcome=error.code,
                            error_code=error.code,
                            error=cut(error.message, 512),
                            **base,
                        )
                    )
                )
            raise
        result = await asyncio.to_thread(clean, result)
        if proposal is not None:
            await self.moves.move(
                proposal,
                ["executing"],
                "executed",
                actor=ctx.principal,
                outcome="ok",
                result={"summary": proposal.plan_summary},
                result_row=result,
            )
        else:
            await self.trail.record_outcome(ctx.row("executed", outcome="ok", result=result, **base))
        return result  # type: ignore[no-any-return]

    def _progress_relay(self, sink: ProgressSink | None) -> Callable[[float, str], None]:
        if sink is None:
            return lambda _f, _m: None
        loop = asyncio.get_running_loop()

        def relay(fraction: float, message: str) -> None:
            asyncio.run_coroutine_threadsafe(sink(fraction, message), loop)

        return relay
