"""The guarded call pipeline: the one path every tool call takes.

    role check -> argument validation -> runaway breaker -> rate limit
      -> scheduler slot on the target -> session -> resolve (plan, read-only)
      -> policy decision -> execute / dry run / proposal -> audit row

``Gateway`` is also the composition root of one process: it owns the scheduler, the state store,
the audit sink, the policy and role books and the token authenticator, and starts and stops them
in the server's lifespan. Every surface (stdio, HTTPS, the web page, the CLI's ``pending``
commands) goes through the same methods, so a decision never depends on how a call arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gateway.auth.roles import Role, RoleBook
from gateway.auth.tokens import Principal, TokenVerifier
from gateway.config import Target, load_targets
from gateway.errors import (
    Ambiguous,
    AuditUnavailable,
    ConfirmationInvalid,
    Forbidden,
    GatewayError,
    NotFound,
    PolicyDenied,
    Stale,
)
from gateway.guard import confirm, names
from gateway.guard.audit import AuditSink
from gateway.guard.limits import RateLimiter, RunawayBreaker
from gateway.guard.policy import CallFacts, Decision, PolicyStore
from gateway.guard.sanitize import clean
from gateway.notify import Notifier, notifier_for
from gateway.server.metrics import Metrics
from gateway.settings import Settings
from gateway.store.sqlite import Proposal, SqliteStore
from gateway.tools.read import summarize_targets, target_about
from gateway.tools.registry import Registry, build_registry
from gateway.tools.spec import Category, Plan, ToolSpec
from gateway.vsphere.scheduler import Scheduler

log = logging.getLogger(__name__)

ProgressSink = Callable[[float, str], Coroutine[Any, Any, None]]
#: fn(event, proposal): told of every proposal lifecycle transition; must not block (may run in a thread)
LifecycleListener = Callable[[str, Proposal], None]
ALL = "all"
#: a proposal still ``executing`` this long after it was claimed belongs to a process that died
EXECUTION_GRACE_SECONDS = 2 * 86400.0
#: tools the pipeline answers itself; a role gets them with its first write or destructive tool
_PROPOSAL_TOOLS = frozenset({"list_pending_actions", "confirm_action", "cancel_action"})


@dataclass
class CallContext:
    """Who is calling what, carried through one call for audit rows and decisions."""

    principal: Principal
    role: Role
    spec: ToolSpec
    correlation_id: str | None
    started: float = field(default_factory=time.monotonic)

    def row(self, phase: str, **fields: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "phase": phase,
            "tool": self.spec.name,
            "caller": self.principal.name,
            "role": self.principal.role,
            "surface": self.principal.surface,
            "correlation_id": self.correlation_id,
            "duration_ms": round((time.monotonic() - self.started) * 1000, 2),
        }
        base.update({k: v for k, v in fields.items() if v is not None})
        return base


class Gateway:
    """One gateway process's runtime: every surface calls ``call``, ``tools_for`` and the approval API."""

    def __init__(
        self,
        settings: Settings,
        targets: Sequence[Target],
        registry: Registry,
        *,
        scheduler: Scheduler,
        store: SqliteStore,
        audit: AuditSink,
        policy: PolicyStore,
        roles: RoleBook,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.targets = {t.name: t for t in targets}
        self.registry = registry
        self.scheduler = scheduler
        self.store = store
        self.audit = audit
        self.policy = policy
        self.roles = roles
        self.clock = clock
        self.authenticator = TokenVerifier(store)
        self.metrics = Metrics(targets=self.targets, tools=[spec.name for spec in registry])
        self.rate_limiter = RateLimiter()
        self.breaker = RunawayBreaker()
        self.draining = False
        self._sweeper: asyncio.Task[None] | None = None
        self._lifecycle_listeners: list[LifecycleListener] = []
        # notifications.yaml: loaded (ConfigError on a bad file) and attached now, delivering from start()
        self.notifier: Notifier | None = None
        if settings.notifications_file is not None:
            self.notifier = notifier_for(
                settings.notifications_file, settings.notify_env, audit.write, [self]
            )

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    def build(cls, settings: Settings) -> Gateway:
        """Load configuration and open the stores; raises ConfigError on anything fatal."""
        targets = load_targets(settings.targets_file, settings.credentials)
        registry = build_registry(destructive=settings.enable_destructive, read_only=settings.read_only)
        settings.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        audit = AuditSink.for_settings(settings)

        def audit_roles_reload(sha256: str, names: list[str]) -> None:
            with contextlib.suppress(AuditUnavailable):
                audit.write(
                    {
                        "phase": "roles_reload",
                        "caller": "gateway",
                        "surface": "server",
                        "roles_sha256": sha256,
                        "roles": names,
                    }
                )

        policy = PolicyStore(settings.rules_file)
        roles = RoleBook(settings.roles_file, on_reload=audit_roles_reload)
        names.watch(policy, roles, targets)  # a name in rules.yaml or roles.yaml matching nothing: WARNING
        return cls(
            settings,
            targets,
            registry,
            scheduler=Scheduler(targets, settings.credentials, queue_timeout=settings.queue_timeout_seconds),
            store=SqliteStore(settings.state_db),
            audit=audit,
            policy=policy,
            roles=roles,
        )

    def add_lifecycle_listener(self, fn: LifecycleListener) -> None:
        """Call ``fn(event, proposal)`` on every transition: proposed, approved, denied, cancelled, expired,
        stale, executing, executed, failed, outcome_unknown."""
        self._lifecycle_listeners.append(fn)

    def _lifecycle(self, event: str, proposal: Proposal, **changes: Any) -> None:
        current = replace(proposal, **changes) if changes else proposal
        for fn in self._lifecycle_listeners:
            try:
                fn(event, current)
            except Exception:  # a listener never breaks a decision
                log.exception("lifecycle listener failed on %s of proposal %s", event, proposal.id)

    async def start(self) -> None:
        await self.start_notifier()
        self.settle_interrupted()
        self._sweeper = asyncio.create_task(self._sweep_expired_forever())

    def settle_interrupted(self, older_than: float = EXECUTION_GRACE_SECONDS) -> list[str]:
        """Mark proposals left ``executing`` by a process that died as failed with an unknown outcome.

        Only proposals claimed longer ago than any task may run are touched, so a CLI approval that
        is executing right now in another process is left alone. They are never retried: whether
        vSphere finished the change is unknown, and the audit row says how to find out.
        """
        settled = []
        cutoff = self.clock() - older_than
        for p in self.store.list_proposals(["executing"]):
            if (p.decided_at or p.created_at) > cutoff:
                continue
            error = {
                "code": "outcome_unknown",
                "message": "the gateway stopped while this change was running; "
                "check the objects and get_tasks on the target before doing anything again",
            }
            if self.store.transition(p.id, ["executing"], "failed", outcome="outcome_unknown", error=error):
                self._audit(
                    {
                        "phase": "failed",
                        "tool": p.tool,
                        "target": p.target,
                        "caller": p.caller,
                        "role": p.role,
                        "surface": "server",
                        "proposal_id": p.id,
                        "error_code": "outcome_unknown",
                        "outcome": "outcome_unknown",
                    }
                )
                self._lifecycle("outcome_unknown", p, state="failed", outcome="outcome_unknown", error=error)
                settled.append(p.id)
        return settled

    async def start_notifier(self) -> None:
        """Begin telling humans about lifecycle events (channels loaded when the gateway was built)."""
        if self.notifier is not None:
            await self.notifier.start()

    async def close(self) -> None:
        self.draining = True
        if self.notifier is not None:
            await self.notifier.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await asyncio.to_thread(self.scheduler.close)
        self.store.close()
        self.audit.close()

    def readiness(self) -> list[str]:
        """Reasons this process should not take traffic; empty when ready."""
        reasons = []
        if self.draining:
            reasons.append("shutting down")
        if not self.audit.writable():
            reasons.append("audit log not writable")
        if not self.store.ping():
            reasons.append("state store not answering")
        return reasons

    # ----------------------------------------------------------------- listing
    def role_of(self, principal: Principal) -> Role | None:
        return self.roles.get(principal.role)

    def permits(self, role: Role, spec: ToolSpec) -> bool:
        if spec.name in _PROPOSAL_TOOLS:
            return any(
                role.permits_tool(s.name, s.kind)
                for s in self.registry
                if s.kind is not Category.READ and s.name not in _PROPOSAL_TOOLS
            )
        return role.permits_tool(spec.name, spec.kind)

    def tools_for(self, principal: Principal) -> list[ToolSpec]:
        role = self.role_of(principal)
        if role is None:
            return []
        return [spec for spec in self.registry if self.permits(role, spec)]

    def visible_targets(self, role: Role) -> list[Target]:
        return [t for t in self.targets.values() if role.permits_target(t.name)]

    # ----------------------------------------------------------------- calls
    async def call(
        self,
        principal: Principal,
        name: str,
        args: Mapping[str, Any] | None,
        *,
        progress: ProgressSink | None = None,
        correlation_id: str | None = None,
    ) -> dict[str, Any]:
        """Run one tool call for ``principal``; raises GatewayError subclasses for expected failures."""
        spec = self.registry.get(name)
        role = self.role_of(principal)
        if spec is None or role is None or not self.permits(role, spec):
            if spec is not None:
                rule = f"role:{principal.role}"
                ctx = CallContext(principal, role or _NO_ROLE, spec, correlation_id)
                self._audit(
                    ctx.row(
                        "denied",
                        args=dict(args or {}),
                        target=_target_label(args),
                        decision={"allowed": False, "reason": "tool not permitted for role", "rule": rule},
                        error_code="not_found",
                    )
                )
                self.metrics.observe_call(name, _target_label(args) or "-", "denied", 0.0)
            raise NotFound(f"unknown tool '{name}'; call tools/list to see the tools available to you")
        ctx = CallContext(principal, role, spec, correlation_id)
        handler = self._handler_for(spec)
        outcome, target = "error", _target_label(args)
        try:
            valid = spec.validate(args)
            result = await handler(ctx, valid, progress)
            outcome = "ok"
            return result
        except GatewayError as exc:
            outcome = "denied" if exc.code in ("policy_denied", "forbidden", "rate_limited") else "error"
            raise
        finally:
            self.metrics.observe_call(name, target or "-", outcome, time.monotonic() - ctx.started)

    def _handler_for(
        self, spec: ToolSpec
    ) -> Callable[[CallContext, dict[str, Any], ProgressSink | None], Awaitable[dict[str, Any]]]:
        local = {
            "list_targets": self._list_targets,
            "list_pending_actions": self._list_pending,
            "confirm_action": self._confirm,
            "cancel_action": self._cancel,
        }
        if spec.name in local:
            return local[spec.name]
        return self._read if spec.kind is Category.READ else self._write

    # -- reads
    def _expand_targets(self, ctx: CallContext, ref: str | list[str]) -> list[str]:
        if ref == ALL:
            names = [t.name for t in self.visible_targets(ctx.role)]
            if not names:
                raise Forbidden("your role covers no configured target")
            return names
        names = [ref] if isinstance(ref, str) else list(ref)
        for n in names:
            self._check_target(ctx, n)
        return names

    def _check_target(self, ctx: CallContext, name: str) -> Target:
        """The named target if the caller's role covers it; a target outside the role is refused exactly
        like an unknown one, and audited as denied."""
        target = self.targets.get(name)
        if target is not None and ctx.role.permits_target(name):
            return target
        if target is not None:
            reason = "target not permitted for role"
            self._audit(
                ctx.row(
                    "denied",
                    target=name,
                    error_code="not_found",
                    decision={"allowed": False, "reason": reason, "rule": f"role:{ctx.role.name}"},
                )
            )
        known = ", ".join(t.name for t in self.visible_targets(ctx.role)) or "none"
        raise NotFound(f"unknown target '{name}'; targets you may use: {known}")

    async def _read(self, ctx: CallContext, args: dict[str, Any], _p: ProgressSink | None) -> dict[str, Any]:
        assert ctx.spec.read is not None
        ref = args["target"]
        fn = ctx.spec.read
        audit_args = _redact_args(ctx.spec, args)
        self._require_audit()
        try:
            names = self._expand_targets(ctx, ref)
            single = isinstance(ref, str) and ref != ALL
            if single:
                target = self.targets[names[0]]
                result = await self.scheduler.run(
                    target.name, lambda s: fn(s, args), deadline=target.timeout_seconds
                )
            else:
                result = await self.scheduler.fan_out(
                    names, lambda s: fn(s, args), deadline=self.settings.fanout_timeout_seconds
                )
            result = clean(result)
        except GatewayError as exc:
            self._audit(
                ctx.row(
                    "call", target=_target_label(args), args=audit_args, outcome="error", error_code=exc.code
                )
            )
            raise
        self._audit(ctx.row("call", target=_target_label(args), args=audit_args, outcome="ok", result=result))
        return result  # type: ignore[no-any-return]

    async def _list_targets(
        self, ctx: CallContext, _a: dict[str, Any], _p: ProgressSink | None
    ) -> dict[str, Any]:
        targets = self.visible_targets(ctx.role)
        results = await self.scheduler.fan_out(
            [t.name for t in targets], target_about, deadline=self.settings.fanout_timeout_seconds
        )
        rows = summarize_targets(targets, results)
        if not ctx.role.all_targets:
            for row in rows:
                for key in ("host", "address", "port"):
                    row.pop(key, None)
        out = {"targets": clean(rows), "count": len(rows)}
        self._audit(ctx.row("call", outcome="ok", result=out))
        return out

    # -- writes and destructive proposals
    async def _write(
        self, ctx: CallContext, args: dict[str, Any], progress: ProgressSink | None
    ) -> dict[str, Any]:
        spec = ctx.spec
        plan_fn = spec.plan
        assert plan_fn is not None and spec.execute is not None
        audit_args = _redact_args(spec, args)
        ref = args["target"]
        if not isinstance(ref, str) or ref == ALL:
            reason = "a change needs exactly one explicit target; 'all' and lists are refused for writes"
            self._audit(
                ctx.row(
                    "denied",
                    target=_target_label(args),
                    args=audit_args,
                    decision={"allowed": False, "reason": reason, "rule": "target:single"},
                    error_code="policy_denied",
                )
            )
            raise PolicyDenied(reason)
        self._require_audit()
        target = self._check_target(ctx, ref)
        now = self.clock()
        digest = confirm.args_digest(spec.name, target.name, args)
        try:
            self.breaker.check(ctx.principal.name, spec.name, digest, spec.kind, time.monotonic())
            per_minute = self.policy.target_limits(target.name).rate_limit(spec.kind)
            self.rate_limiter.check(target.name, spec.kind, per_minute, time.monotonic())
            plan = await self.scheduler.run(
                target.name, lambda s: plan_fn(s, args), deadline=target.timeout_seconds
            )
            decision = self._decide(ctx, target, plan, args, now)
        except GatewayError as exc:
            phase = "denied" if exc.code in ("policy_denied", "rate_limited") else "failed"
            self._audit(
                ctx.row(
                    phase,
                    target=target.name,
                    args=audit_args,
                    error_code=exc.code,
                    decision=exc.details.get("decision"),
                )
            )
            raise
        if spec.kind is Category.DESTRUCTIVE or decision.require_approval:
            return self._propose(ctx, target, args, plan, decision, digest)
        return await self._execute(ctx, target, plan, decision, audit_args, progress)

    def _decide(
        self, ctx: CallContext, target: Target, plan: Plan, args: Mapping[str, Any], now: float
    ) -> Decision:
        facts = CallFacts(
            tool=ctx.spec.name,
            category=ctx.spec.kind,
            risk=ctx.spec.risk,
            target=target.name,
            target_tags=target.tags,
            affected=plan.affected,
            caller=ctx.principal.name,
            role=ctx.principal.role,
            override=bool(args.get("override", False)),
            object_count=plan.count,
        )
        decision = self.policy.decide(facts, datetime.fromtimestamp(now, UTC))
        if self.settings.dry_run or target.dry_run:
            decision = replace(decision, dry_run=True)
        if not decision.allowed:
            raise PolicyDenied(decision.reason, decision=decision.to_dict())
        return decision

    def _propose(
        self,
        ctx: CallContext,
        target: Target,
        args: dict[str, Any],
        plan: Plan,
        decision: Decision,
        digest: str,
    ) -> dict[str, Any]:
        token = confirm.new_confirmation_token()
        now = self.clock()
        ttl = target.proposal_ttl_seconds or self.settings.confirm_ttl_seconds
        proposal = Proposal(
            id=confirm.new_proposal_id(),
            token_hash=confirm.token_hash(token),
            caller=ctx.principal.name,
            role=ctx.principal.role,
            surface=ctx.principal.surface,
            target=target.name,
            target_host=target.address,
            tool=ctx.spec.name,
            args=args,
            args_digest=digest,
            plan_summary=plan.summary,
            affected=[a.to_dict() for a in plan.affected],
            plan_params=dict(plan.params),
            created_at=now,
            expires_at=now + ttl,
            state="pending",
            require_web_approval=decision.require_approval,
            correlation_id=ctx.correlation_id,
        )
        self._audit(
            ctx.row(
                "proposed",
                target=target.name,
                args=_redact_args(ctx.spec, args),
                decision=decision.to_dict(),
                proposal_id=proposal.id,
                affected=proposal.affected,
            )
        )
        self.store.add_proposal(proposal)
        self._lifecycle("proposed", proposal)
        how = (
            f"a human must approve proposal {proposal.id} on the web page (/ui) or with "
            f"`gateway pending approve {proposal.id}`; confirm_action is refused until then"
            if decision.require_approval
            else f'confirm_action(token="{token}") within {int(ttl)}s'
        )
        return {
            "state": "pending",
            "proposal_id": proposal.id,
            "target": target.name,
            "target_host": target.address,
            "tool": ctx.spec.name,
            "summary": plan.summary,
            "affected": proposal.affected,
            "token": token,
            "expires_in_seconds": int(ttl),
            "requires_human_approval": decision.require_approval,
            "dry_run": decision.dry_run,
            "confirm_with": how,
            "note": f"Nothing has changed yet. This proposal acts on target '{target.name}' "
            f"({target.address}): check the target and the affected objects before confirming.",
        }

    async def _execute(
        self,
        ctx: CallContext,
        target: Target,
        plan: Plan,
        decision: Decision,
        audit_args: Mapping[str, Any],
        progress: ProgressSink | None,
        proposal_id: str | None = None,
    ) -> dict[str, Any]:
        spec = ctx.spec
        execute = spec.execute
        assert execute is not None

        def record(phase: str, **fields: Any) -> None:
            self._audit(
                ctx.row(
                    phase,
                    target=target.name,
                    args=audit_args,
                    decision=decision.to_dict(),
                    proposal_id=proposal_id,
                    **fields,
                )
            )

        if decision.dry_run:
            would = {
                "dry_run": True,
                "target": target.name,
                "would": plan.summary,
                "affected": [a.to_dict() for a in plan.affected],
            }
            record("dry_run", outcome="ok", result=would)
            return would
        params = dict(plan.params)
        params["auto_snapshot"] = decision.auto_snapshot and spec.snapshot_before
        plan = replace(plan, params=params)
        relay = self._progress_relay(progress)
        self._require_audit()
        try:
            result = await self.scheduler.run(target.name, lambda s: execute(s, plan, relay))
        except GatewayError as exc:
            record("failed", outcome=exc.code, error_code=exc.code, error=exc.message)
            raise
        result = clean(result)
        record("executed", outcome="ok", result=result)
        return result  # type: ignore[no-any-return]

    def _progress_relay(self, sink: ProgressSink | None) -> Callable[[float, str], None]:
        if sink is None:
            return lambda _f, _m: None
        loop = asyncio.get_running_loop()

        def relay(fraction: float, message: str) -> None:
            asyncio.run_coroutine_threadsafe(sink(fraction, message), loop)

        return relay

    # -- the proposal lifecycle
    async def _list_pending(
        self, ctx: CallContext, _a: dict[str, Any], _p: ProgressSink | None
    ) -> dict[str, Any]:
        self.expire_due()
        rows = [
            proposal_view(p, self.clock())
            for p in self.store.list_proposals(["pending"])
            if ctx.role.permits_target(p.target)
            and (p.caller == ctx.principal.name or ctx.role.approve != "none")
        ]
        return {"pending": rows, "count": len(rows)}

    async def _confirm(
        self, ctx: CallContext, args: dict[str, Any], progress: ProgressSink | None
    ) -> dict[str, Any]:
        self._require_audit()
        proposal = self.store.proposal_by_token_hash(confirm.token_hash(args["token"]))
        try:
            confirm.check_confirmable(proposal, caller=ctx.principal.name, now=self.clock(), via="agent")
        except GatewayError as exc:
            self._audit(
                ctx.row(
                    "denied",
                    proposal_id=proposal.id if proposal else None,
                    target=proposal.target if proposal else None,
                    tool=proposal.tool if proposal else None,  # rows name the change, not the verb
                    via=ctx.spec.name,
                    error_code=exc.code,
                )
            )
            raise
        assert proposal is not None
        return await self.execute_proposal(
            proposal, ctx.principal, progress=progress, correlation_id=ctx.correlation_id
        )

    async def _cancel(
        self, ctx: CallContext, args: dict[str, Any], _p: ProgressSink | None
    ) -> dict[str, Any]:
        self._require_audit()
        proposal = self.store.proposal_by_token_hash(confirm.token_hash(args["token"]))
        if proposal is None or proposal.caller != ctx.principal.name:
            raise ConfirmationInvalid(
                "that token matches no proposal of yours; list_pending_actions shows them"
            )
        if not self.store.transition(proposal.id, ["pending"], "cancelled", decided_at=self.clock()):
            raise ConfirmationInvalid(f"proposal {proposal.id} is no longer pending; nothing to cancel")
        self._audit(
            ctx.row(
                "cancelled",
                target=proposal.target,
                proposal_id=proposal.id,
                tool=proposal.tool,
                via=ctx.spec.name,
            )
        )
        self._lifecycle("cancelled", proposal, state="cancelled")
        return {"state": "cancelled", "proposal_id": proposal.id, "target": proposal.target}

    async def approve(
        self, proposal_id: str, human: Principal, *, correlation_id: str | None = None
    ) -> dict[str, Any]:
        """A human's approval (web page or CLI): checks the approve right, then executes the proposal."""
        proposal = self._human_decision(proposal_id, human, "approve", correlation_id)
        return await self.execute_proposal(proposal, human, correlation_id=correlation_id, approved=True)

    def _human_decision(
        self, proposal_id: str, human: Principal, verb: str, correlation_id: str | None
    ) -> Proposal:
        """The proposal a human may approve or deny; a refusal is audited before it is raised."""
        role = self.role_of(human)
        proposal = self.store.get_proposal(proposal_id)
        if role is None or proposal is None or not role.permits_target(proposal.target):
            raise NotFound(f"no proposal {proposal_id} that you may see")
        try:
            confirm.check_confirmable(
                proposal, caller=human.name, now=self.clock(), via="human", approver_role_approve=role.approve
            )
        except GatewayError as exc:
            reason = f"{verb} refused: {exc.message}"
            self._audit(
                _human_row(
                    proposal, human, correlation_id, reason, f"approve:{role.approve}", error_code=exc.code
                )
            )
            raise
        return proposal

    def deny(
        self, proposal_id: str, human: Principal, *, correlation_id: str | None = None
    ) -> dict[str, Any]:
        proposal = self._human_decision(proposal_id, human, "deny", correlation_id)
        self._require_audit()
        if not self.store.transition(
            proposal.id, ["pending"], "denied", approved_by=human.name, decided_at=self.clock()
        ):
            raise ConfirmationInvalid(f"proposal {proposal.id} is no longer pending")
        self._audit(_human_row(proposal, human, correlation_id, f"denied by {human.name}", "human"))
        self._lifecycle("denied", proposal, state="denied", approved_by=human.name)
        return {"state": "denied", "proposal_id": proposal.id, "target": proposal.target}

    async def execute_proposal(
        self,
        proposal: Proposal,
        actor: Principal,
        *,
        progress: ProgressSink | None = None,
        correlation_id: str | None = None,
        approved: bool = False,
    ) -> dict[str, Any]:
        """Claim the proposal exactly once, re-resolve and re-check it, then execute it."""
        spec = self.registry.get(proposal.tool)
        target = self.targets.get(proposal.target)
        owner = Principal(name=proposal.caller, role=proposal.role, surface=proposal.surface)
        owner_role = self.roles.get(proposal.role)
        if spec is None or target is None or owner_role is None:
            raise ConfirmationInvalid(
                f"proposal {proposal.id} names a tool, target or role this server no longer has"
            )
        if not self.store.transition(
            proposal.id,
            ["pending"],
            "executing",
            decided_at=self.clock(),
            approved_by=actor.name if approved else None,
        ):
            raise ConfirmationInvalid(f"proposal {proposal.id} was already confirmed, cancelled or expired")
        ctx = CallContext(actor, owner_role, spec, correlation_id or proposal.correlation_id)
        if approved:
            self._audit(
                ctx.row("approved", target=target.name, proposal_id=proposal.id, requested_by=owner.name)
            )
            self._lifecycle("approved", proposal, state="executing", approved_by=actor.name)
        approver = actor.name if approved else None
        self._lifecycle("executing", proposal, state="executing", approved_by=approver)
        try:
            plan_fn = spec.plan
            assert plan_fn is not None
            plan = await self._replan(target, plan_fn, proposal)
            owner_ctx = CallContext(owner, owner_role, spec, ctx.correlation_id)
            decision = self._decide(owner_ctx, target, plan, proposal.args, self.clock())
            result = await self._execute(
                ctx,
                target,
                plan,
                decision,
                _redact_args(spec, proposal.args),
                progress,
                proposal_id=proposal.id,
            )
        except GatewayError as exc:
            if exc.code in ("stale", "policy_denied", "invalid_state", "not_found"):
                self._audit(
                    ctx.row(
                        "failed",
                        target=target.name,
                        proposal_id=proposal.id,
                        error_code=exc.code,
                        error=exc.message,
                    )
                )
            self.store.transition(proposal.id, ["executing"], "failed", outcome=exc.code, error=exc.to_wire())
            event = exc.code if exc.code in ("stale", "outcome_unknown") else "failed"
            self._lifecycle(event, proposal, state="failed", outcome=exc.code, error=exc.to_wire())
            raise
        self.store.transition(
            proposal.id, ["executing"], "executed", outcome="ok", result={"summary": proposal.plan_summary}
        )
        self._lifecycle("executed", proposal, state="executed", outcome="ok")
        return {"state": "executed", "proposal_id": proposal.id, "target": target.name, **result}

    async def _replan(
        self, target: Target, plan_fn: Callable[[Any, Mapping[str, Any]], Plan], proposal: Proposal
    ) -> Plan:
        """Resolve the proposal's objects again; anything that no longer matches makes it stale."""
        try:
            plan = await self.scheduler.run(
                target.name, lambda s: plan_fn(s, proposal.args), deadline=target.timeout_seconds
            )
        except (NotFound, Ambiguous) as exc:
            raise Stale(
                f"proposal {proposal.id} no longer matches vSphere ({exc.message}); make a fresh "
                "proposal and check it again"
            ) from exc
        _check_not_stale(proposal, plan)
        return plan

    def expire_due(self) -> None:
        for proposal in confirm.expire_due(self.store, self.clock()):
            self._audit(
                {
                    "phase": "expired",
                    "tool": proposal.tool,
                    "target": proposal.target,
                    "caller": proposal.caller,
                    "role": proposal.role,
                    "proposal_id": proposal.id,
                    "surface": "server",
                }
            )
            self._lifecycle("expired", proposal, state="expired")

    async def _sweep_expired_forever(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.expire_due)
            except Exception:  # the sweeper must survive a transient store or audit error
                log.exception("expiring proposals failed; retrying")
            await asyncio.sleep(2.0)

    # ----------------------------------------------------------------- audit
    def _require_audit(self) -> None:
        if not self.audit.writable():
            raise AuditUnavailable(
                f"audit log {self.settings.audit_log} cannot be written; nothing was sent "
                "to vSphere. Free disk space or fix permissions, then retry"
            )

    def _audit(self, row: Mapping[str, Any]) -> None:
        try:
            self.audit.write(row)
        except AuditUnavailable:
            raise
        except Exception as exc:  # any failure to record is a refusal, never a silent pass
            log.exception("audit write failed")
            raise AuditUnavailable(
                f"audit log {self.settings.audit_log} could not record the call; see the server log"
            ) from exc


class _NoRole:
    name = "-"


_NO_ROLE: Any = _NoRole()


def _human_row(
    proposal: Proposal, human: Principal, correlation_id: str | None, reason: str, rule: str, **extra: Any
) -> dict[str, Any]:
    """The audit row of a human's refusal of, or refused attempt at, a proposal decision."""
    return {
        "phase": "denied",
        "tool": proposal.tool,
        "target": proposal.target,
        "caller": human.name,
        "role": human.role,
        "surface": human.surface,
        "proposal_id": proposal.id,
        "correlation_id": correlation_id,
        "decision": {"allowed": False, "reason": reason, "rule": rule},
        **extra,
    }


def _target_label(args: Mapping[str, Any] | None) -> str | None:
    ref = (args or {}).get("target")
    if isinstance(ref, list):
        return ",".join(str(r) for r in ref)
    return ref if isinstance(ref, str) else None


def _redact_args(spec: ToolSpec, args: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ("***" if k in spec.sensitive_params else v) for k, v in args.items()}


def _check_not_stale(proposal: Proposal, plan: Plan) -> None:
    before = sorted((a.get("type"), a.get("moid"), a.get("name")) for a in proposal.affected)
    after = sorted((a.type, a.moid, a.name) for a in plan.affected)
    if before != after:
        raise Stale(
            f"the objects of proposal {proposal.id} changed since it was made (renamed, replaced or "
            "removed); make a fresh proposal and check it again"
        )


def proposal_view(p: Proposal, now: float) -> dict[str, Any]:
    """A proposal as shown to callers and humans: never the token or its hash."""
    return {
        "proposal_id": p.id,
        "state": p.state,
        "target": p.target,
        "target_host": p.target_host,
        "tool": p.tool,
        "summary": p.plan_summary,
        "affected": p.affected,
        "requested_by": p.caller,
        "requires_human_approval": p.require_web_approval,
        "expires_in_seconds": max(0, int(p.expires_at - now)),
        "created_at": p.created_at,
        "approved_by": p.approved_by,
        "outcome": p.outcome,
        "error": p.error,
    }
