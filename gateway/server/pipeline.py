"""The guarded call pipeline: the one path every tool call, confirmation and approval takes.

How a call flows (every surface: stdio, HTTPS, the web page, ``gateway pending``)::

    Gateway.call(principal, tool, args)
      -> text no engine can store (NUL, lone surrogates: guard.inputs) refused first, audited escaped
      -> facts about the caller as the store says *now* (token state, current role)
      -> gate: guard.decision.authorize (token -> role), before anything is read from vSphere
      -> argument validation (bounded; NaN/Infinity refused)            every refusal is audited
      -> runaway breaker, rate limit per caller x target x category (reads too), target-wide ceiling
      -> a change while the audit cannot take rows (readiness says so): refused, nothing read
      -> resolve on the target (a Plan: objects + facts, nothing changes)
      -> authorize again with the objects (decision.authorize_resolved): the call, each object as
         each tool it reaches, then the state preconditions; the first refusal wins
      -> read: answer (per-target outcomes in the row)
         write: audit the intent (``executing``, durable) BEFORE vSphere; refuse if it cannot be written
         destructive: persist a proposal; confirm_action / a human's approval re-run authorize on the
         state at that moment (the proposer's current token and role, current rules, re-resolved
         objects), then claim it by compare-and-set, then write ``executing`` (naming this
         process) and run it; every losing attempt is one row
      -> audit the outcome; if the audit cannot take it, it waits in memory (the server reports
         unready) and is appended as soon as the audit is writable again

Every proposal move goes through ``Gateway.move`` (the lifecycle table of guard/lifecycle.py, the
store's compare-and-set, an audit row, then the listeners registered with
``add_lifecycle_listener``). Audit appends and state-store calls run in worker threads with
deadlines, so a stuck audit lock or a slow disk never stops the event loop.

``Gateway`` is also the composition root of one process: it owns the scheduler, the state store,
the audit sink, the policy and role books and the token authenticator, and starts and stops them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final, NoReturn, TypeVar

from gateway.answer import Answer
from gateway.audit.readers import open_audit_reader
from gateway.audit.redact import shown, shown_text
from gateway.auth.roles import RoleBook
from gateway.auth.tokens import Principal, TokenVerifier
from gateway.config import Target, load_targets
from gateway.errors import (
    Ambiguous,
    AuditUnavailable,
    ConfirmationInvalid,
    Forbidden,
    GatewayError,
    InvalidArgument,
    NotFound,
    OutcomeUnknown,
    PolicyDenied,
    RateLimited,
    Stale,
    StateUnavailable,
)
from gateway.guard import confirm, inputs, names
from gateway.guard.decision import (
    PROPOSAL_TOOLS,
    Entry,
    Facts,
    Party,
    Proposed,
    TokenState,
    Verdict,
    authorize,
    authorize_resolved,
    proposal_rights,
    read_rules,
    token_state,
    tool_permitted,
)
from gateway.guard.limits import RateLimiter, RunawayBreaker
from gateway.guard.policy.model import Decision, TargetPolicy
from gateway.guard.policy.read_filter import Filtered, ReadFilter, read_args
from gateway.guard.policy.store import PolicyStore
from gateway.notify import Notifier, notifier_for
from gateway.private_files import make_private_dirs
from gateway.proposals import FINAL_STATES, OPEN_STATES, Proposal
from gateway.role import Role
from gateway.sanitize import clean
from gateway.server import reloads
from gateway.server.instance import Instance
from gateway.server.metrics import Metrics, sample_families
from gateway.server.read_rules import ReadRules, denial
from gateway.settings import Settings
from gateway.store import AuditWriter, StateStore, open_audit, open_store
from gateway.store.limits_pg import PgRateLimiter, PgRunawayBreaker
from gateway.store.postgres import PostgresStore
from gateway.store.slots import PgInstance, PgLeader, PgSlots
from gateway.tools.read import MIRROR_READS, summarize_targets, target_about
from gateway.tools.registry import Registry, build_registry, tool_categories
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Category, Plan
from gateway.vsphere.mirror import Mirrors
from gateway.vsphere.pool import VSphereSession
from gateway.vsphere.scheduler import Scheduler

log = logging.getLogger(__name__)

T = TypeVar("T")
ProgressSink = Callable[[float, str], Coroutine[Any, Any, None]]
LifecycleListener = Callable[[str, Proposal], None]
#: the MCP client's declared name/version for the call in progress (set by the MCP surface)
mcp_client_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("mcp_client", default=None)
ALL = "all"
#: a claim recorded before claims named their process: settled only this long after it was made
EXECUTION_GRACE_SECONDS = 2 * 86400.0
#: the sweeper looks for claims of dead processes this often (seconds)
SETTLE_EVERY: Final = 30
#: how long one audit append or state-store call may take before the call is refused
AUDIT_DEADLINE_SECONDS: Final = 5.0
STORE_DEADLINE_SECONDS: Final = 10.0
#: outcome rows kept in memory while the audit cannot take them; past this, new changes are refused
MAX_WAITING_OUTCOMES: Final = 1000
#: a target label longer than this is cut (the audit sink bounds every value of a row on its own)
AUDIT_VALUE_CHARS: Final = 256
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


def _write_quietly(audit: AuditWriter, row: Mapping[str, Any]) -> None:
    """A row written before the gateway exists (targets.yaml at start): lost only if the audit is down."""
    try:
        audit.write(row, timeout=AUDIT_DEADLINE_SECONDS)
    except AuditUnavailable:
        log.error("the audit log could not record the load of %s", row.get("path"))


@dataclass
class CallContext:
    """Who is calling what, carried through one call for audit rows and decisions."""

    principal: Principal
    party: Party
    spec: ToolSpec
    correlation_id: str | None
    client: str | None = None
    #: the tool that acts on a proposal (confirm_action, approve, ...) when rows name the change itself
    via: str | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def role(self) -> Role:
        assert self.party.role is not None  # the gate refused callers without a role
        return self.party.role

    def row(self, phase: str, **fields: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "phase": phase,
            "tool": self.spec.name,
            "risk": self.spec.risk.value,
            "caller": self.principal.name,
            "kind": self.party.kind.value,
            "role": self.party.role.name if self.party.role else self.principal.role,
            "surface": self.principal.surface,
            "client": self.client,
            "correlation_id": self.correlation_id,
            "via": self.via,
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
        store: StateStore,
        audit: AuditWriter,
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
        #: who holds an executing claim; with replicas on PostgreSQL, visible from every host
        self.instance: Instance | PgInstance = (
            PgInstance(settings.database_url) if settings.database_url else Instance(settings.home))
        self.draining = False
        self._listeners: list[LifecycleListener] = []
        self._waiting: collections.deque[dict[str, Any]] = collections.deque()
        self._flushing = threading.Lock()
        self._token_generation = -1
        # notifications.yaml: loaded (ConfigError on a bad file) and attached now, delivering from start()
        self.notifier: Notifier | None = None
        path = settings.notifications_file
        if path is not None:
            self.notifier = reloads.load_audited(
                "notifications", path, lambda: notifier_for(path, settings.notify_env, audit.write, [self]),
                lambda n: {"channels": {c.name: c.kind for c in n.config.channels}}, self.config_row)
        self._sweeper: asyncio.Task[None] | None = None
        #: with replicas on PostgreSQL only the leader sweeps expired proposals (see gateway.store.slots)
        self.sweep_leader: PgLeader | None = (
            PgLeader(settings.database_url, "expiry-sweeper") if settings.database_url else None)
        self.mirrors = Mirrors(targets, settings.credentials, MIRROR_READS)
        list_vms = registry.get("list_vms")
        assert list_vms is not None and list_vms.read is not None
        #: what each read may show (read rules), applied after the mirror or the sweep answered
        self.read_rules = ReadRules(self.mirrors, scheduler, self.targets, list_vms.read)
        self.metrics.add_collector("mirrors", lambda: sample_families(self.mirrors.samples()))

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    def build(cls, settings: Settings) -> Gateway:
        """Load configuration and open the stores; raises ConfigError on anything fatal."""
        registry = build_registry(destructive=settings.enable_destructive, read_only=settings.read_only)
        make_private_dirs(settings.home)
        store = open_store(settings)
        audit = open_audit(settings, store)
        # every configuration load is an audit row (gateway.server.reloads), through the gateway's
        # own audit path once it exists; targets.yaml is read before, straight into the sink
        targets = reloads.load_audited(
            "targets", settings.targets_file,
            lambda: load_targets(settings.targets_file, settings.credentials),
            reloads.targets_summary, lambda row: _write_quietly(audit, row))
        built: list[Gateway] = []  # the hooks below run once the gateway exists (names.watch loads)
        policy = PolicyStore(settings.rules_file,
                             on_reload=lambda load: built[0].config_row(reloads.rules_row(load)))
        role_rows = reloads.RolesReloads(settings.roles_file, lambda row: built[0].config_row(row))
        roles = RoleBook(settings.roles_file, on_reload=role_rows.loaded)
        roles.on_refused = role_rows.refused
        gateway = cls(
            settings,
            targets,
            registry,
            scheduler=Scheduler(targets, settings.credentials, queue_timeout=settings.queue_timeout_seconds,
                                slots=PgSlots(settings.database_url) if settings.database_url else None),
            store=store,
            audit=audit,
            policy=policy,
            roles=roles,
        )
        built.append(gateway)
        names.watch(policy, roles, targets, tool_categories())  # a name matching nothing: WARNING
        if isinstance(store, PostgresStore):  # replicas count rate limits and repeats together
            gateway.rate_limiter = PgRateLimiter(store)
            gateway.breaker = PgRunawayBreaker(store)
        return gateway

    async def start(self) -> None:
        await self.start_notifier()
        await asyncio.to_thread(self.settle_interrupted)
        await asyncio.to_thread(self.recover_outcome_rows)
        self._sweeper = asyncio.create_task(self._sweep_forever())
        self.mirrors.start_eager()

    async def start_notifier(self) -> None:
        """Begin telling humans about lifecycle events (channels loaded when the gateway was built)."""
        if self.notifier is not None:
            await self.notifier.start()

    def add_lifecycle_listener(self, fn: LifecycleListener) -> None:
        """Call ``fn(event, proposal)`` after every proposal move, once it is audited: ``proposed``, then the
        new state's name (approved, executing, executed, failed, outcome_unknown, denied, cancelled,
        expired, stale), with the proposal as it is after the move. Called in the thread that made the
        move; it must not block (hand work to a queue). A listener that raises is logged, never fatal."""
        self._listeners.append(fn)

    def settle_interrupted(self, older_than: float = EXECUTION_GRACE_SECONDS) -> list[str]:
        """Settle every proposal left ``executing`` by a process that is gone, as ``outcome_unknown``.

        A claim names the process that made it (``Instance``): a dead one is settled at once, a live
        one (a CLI approval running now) is left alone. A claim recorded without a process (older
        gateways) is settled only ``older_than`` seconds after it was made. Never retried: whether
        vSphere finished the change is unknown, and the audit row says how to find out.
        """
        settled = []
        cutoff = self.clock() - older_than
        for p in self.store.list_proposals(["executing"], limit=1000):
            if p.executor is not None:
                if self.instance.alive(p.executor):
                    continue
            elif (p.decided_at or p.created_at) > cutoff:
                continue
            error = {
                "code": "outcome_unknown",
                "message": "the gateway process running this change stopped before it finished; "
                "check the objects and get_tasks on the target before doing anything again",
            }
            actor = Principal(name="gateway", role="-", surface="server")
            moved = self.move_sync(
                p,
                ["executing"],
                "outcome_unknown",
                actor=actor,
                outcome="outcome_unknown",
                error=error,
                reason=f"claimed by process {p.executor or 'unknown'}, which is gone",
            )
            if moved is not None:
                settled.append(p.id)
        return settled

    def recover_outcome_rows(self, limit: int = 1000) -> list[str]:
        """Append the final move's row of every proposal whose row died with a process (it waited in
        memory while the audit could not take it). A proposal counts when the audit (file or PostgreSQL)
        holds rows of it since it was made (its intent, say) but none of the phase it ended in; the row
        is the usual move row with ``recovered: true``, by the caller ``gateway``. Proposals with no row
        in the audit (rotated away) are left alone: nothing says a row is missing. Run at start."""
        candidates = self.store.list_proposals(sorted(FINAL_STATES), limit=limit)
        if not candidates:
            return []
        since = datetime.fromtimestamp(min(p.created_at for p in candidates), UTC)
        try:
            rows = open_audit_reader(self.settings, self.store).rows(since=since)
        except Exception:
            log.exception("cannot read the audit log to recover missing rows of proposal moves")
            return []
        phases: dict[str, set[str]] = {}
        for row in rows:
            pid = row.get("proposal_id")
            if isinstance(pid, str):
                phases.setdefault(pid, set()).add(str(row.get("phase")))
        recovered = []
        actor = Principal(name="gateway", role="-", surface="server")
        for p in candidates:
            seen = phases.get(p.id)
            if seen is None or p.state in seen:
                continue
            if p.executor is not None and p.executor != self.instance.id and self.instance.alive(p.executor):
                continue  # a live process that ran it still holds the row and will append it
            row = self._transition_row(
                p,
                p.state,
                actor=actor,
                reason="recovered at start: the row of this move was not in the audit log (it waited "
                "for the log when the process that made the move stopped)",
                outcome=p.outcome,
                error=p.error,
            )
            self._write_or_wait({**row, "recovered": True})
            recovered.append(p.id)
        if recovered:
            log.warning("appended %d audit row(s) of proposal moves missing from the log", len(recovered))
        return recovered

    async def close(self) -> None:
        self.draining = True
        if self.notifier is not None:
            await self.notifier.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await asyncio.to_thread(self.flush_waiting)
        await asyncio.to_thread(self.mirrors.close)
        await asyncio.to_thread(self.scheduler.close)
        await asyncio.to_thread(self.audit.close)  # first: its closing checkpoint may need the store's pool
        self.store.close()
        self.instance.close()
        if self.sweep_leader is not None:
            self.sweep_leader.close()

    def config_row(self, row: Mapping[str, Any]) -> None:
        """Audit one configuration load (``gateway.server.reloads``); it waits in memory while the audit
        cannot take it. Blocking: the stores call it from the thread that read the file."""
        self._write_or_wait(row)

    def readiness(self) -> list[str]:
        """Reasons this process should not take traffic; empty when ready."""
        reasons = []
        if self.draining:
            reasons.append("shutting down")
        if self._waiting:
            reasons.append(f"{len(self._waiting)} audit row(s) of finished changes wait for the audit log")
        if not self.audit.writable():
            reasons.append("audit log not writable")
        if not self.store.ping():
            reasons.append("state store not answering")
        if self.policy.snapshot()[0] is None:  # no good rules ever loaded: every call is refused
            reasons.append("no usable rules file (`gateway check` shows why)")
        return reasons

    # ----------------------------------------------------------------- listing
    def role_of(self, principal: Principal) -> Role | None:
        return self.roles.get(principal.role)

    @property
    def change_tools(self) -> tuple[tuple[str, Category], ...]:
        return tuple(
            (s.name, s.kind)
            for s in self.registry
            if s.kind is not Category.READ and s.name not in PROPOSAL_TOOLS
        )

    def permits(self, role: Role, spec: ToolSpec) -> bool:
        return tool_permitted(role, spec.name, spec.kind, self.change_tools)

    def tools_for(self, principal: Principal) -> list[ToolSpec]:
        role = self.role_of(principal)
        if role is None:
            return []
        return [spec for spec in self.registry if self.permits(role, spec)]

    def visible_targets(self, role: Role) -> list[Target]:
        return [t for t in self.targets.values() if role.permits_target(t.name)]

    # ----------------------------------------------------------------- facts
    def party(self, principal: Principal) -> Party:
        """The caller as the store says it is now: a token's current state, role and kind (a principal
        without a token, from stdio or the CLI, is the role and kind its surface gave it)."""
        if principal.token_id is None:
            return Party(principal.name, TokenState.USABLE, self.roles.get(principal.role), principal.kind)
        record = self.store.token_by_id(principal.token_id)
        if record is None:
            return Party(principal.name, TokenState.UNKNOWN, None)
        state = token_state(record, self.clock())
        return Party(principal.name, state, self.roles.get(record.role), record.kind)

    def owner(self, p: Proposal) -> Party:
        """The proposer as they are now (their token's current state and role)."""
        record = self.store.token_by_name(p.caller)
        if record is None:
            return Party(p.caller, TokenState.USABLE, self.roles.get(p.role))
        role = self.roles.get(record.role)
        return Party(p.caller, token_state(record, self.clock()), role)

    def facts(
        self,
        entry: Entry,
        actor: Party,
        spec: ToolSpec,
        args: Mapping[str, Any],
        *,
        target: str | None = None,
        plan: Plan | None = None,
        owner: Party | None = None,
        proposal: Proposal | None = None,
        resolved: bool = True,
    ) -> Facts:
        """Everything ``authorize`` looks at, gathered now (rules re-read, target looked up)."""
        known = self.targets.get(target) if target is not None else None
        rules, rules_error = self.policy.snapshot() if resolved else (None, None)
        reaches = tuple((name, s.kind) for name in spec.reaches(args) if (s := self.registry.get(name)))
        missing = [name for name in spec.reaches(args) if self.registry.get(name) is None]
        reaches += tuple((name, Category.DESTRUCTIVE) for name in missing)  # unknown reach: strictest
        return Facts(
            entry=entry,
            actor=actor,
            tool=spec.name,
            category=spec.kind,
            risk=spec.risk,
            now=datetime.fromtimestamp(self.clock(), UTC),
            target=target,
            target_known=known is not None,
            target_tags=known.tags if known is not None else (),
            reaches=reaches,
            affected=plan.affected if plan is not None else (),
            object_count=plan.count if plan is not None else 0,
            override=bool(args.get("override", False)),
            owner=owner,
            rules=rules,
            rules_error=rules_error,
            proposal_problem=confirm.proposal_problem(proposal, self.clock()) if proposal else None,
            unmet=plan.unmet if plan is not None else (),
            proposal_id=proposal.id if proposal else None,
            resolved=resolved,
            change_tools=self.change_tools,
        )

    # ----------------------------------------------------------------- calls
    async def call(
        self,
        principal: Principal,
        name: str,
        args: Mapping[str, Any] | None,
        *,
        progress: ProgressSink | None = None,
        correlation_id: str | None = None,
        client: str | None = None,
    ) -> dict[str, Any]:
        """``answer`` as plain JSON values (the web page and the tests read these)."""
        answer = await self.answer(principal, name, args, progress=progress, correlation_id=correlation_id,
                                   client=client)
        return answer.value

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
        actor = await self.off_loop(self.party, principal)
        principal = replace(principal, kind=actor.kind)  # rows name the kind the store has now
        if spec is None:
            ctx = CallContext(principal, actor, _unknown_tool(name), correlation_id, client)
            await self._refused(
                ctx,
                args,
                NotFound(f"unknown tool '{_cut(name)}'; call tools/list to see the tools available to you"),
            )
        assert spec is not None
        ctx = CallContext(principal, actor, spec, correlation_id, client)
        outcome, target = "error", _target_label(args)
        try:
            gate = self.facts(
                Entry.LOCAL if spec.target_mode == "none" else _entry(spec),
                actor,
                spec,
                args or {},
                resolved=False,
            )
            await self._check(ctx, gate, args)
            try:
                valid = spec.validate(args)
            except InvalidArgument as exc:
                await self._refused(ctx, args, exc)
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
        ctx = CallContext(principal, party, spec or _unknown_tool(name), correlation_id, client)
        await self._refused(ctx, args, InvalidArgument(where, inputs.UNSTORABLE_MESSAGE))

    async def _check(
        self, ctx: CallContext, facts: Facts, args: Mapping[str, Any] | None, **row: Any
    ) -> Verdict:
        """``authorize`` and, on a refusal, its audited error."""
        return await self._enforce(ctx, authorize(facts), facts, args, **row)

    async def _enforce(
        self, ctx: CallContext, verdict: Verdict, facts: Facts, args: Mapping[str, Any] | None, **row: Any
    ) -> Verdict:
        """A refused verdict as its audited error (the one place a verdict is enforced)."""
        if not verdict.allowed:
            row.setdefault("target", facts.target)
            try:
                verdict.raise_if_refused()
            except GatewayError as exc:
                await self._refused(ctx, args, exc, **row)
        return verdict

    async def _refused(
        self, ctx: CallContext, args: Mapping[str, Any] | None, exc: GatewayError, **fields: Any
    ) -> NoReturn:
        """Audit a refused call (bounded arguments, the decision if any), then raise ``exc``."""
        fields.setdefault("target", _target_label(args))
        phase = (
            "denied"
            if exc.code in _DENIAL_CODES
            else "invalid"
            if exc.code == "invalid_argument"
            else "failed"
        )
        await self.record(
            ctx.row(
                phase,
                args=_redact_args(ctx.spec, args or {}),
                error_code=exc.code,
                reason_code=exc.details.get("reason_code"),
                decision=exc.details.get("decision"),
                error=_cut(exc.message, 512),
                **fields,
            )
        )
        raise exc

    def _handler_for(
        self, spec: ToolSpec
    ) -> Callable[[CallContext, dict[str, Any], ProgressSink | None], Awaitable[dict[str, Any] | Answer]]:
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
            names = [t.name for t in self.visible_targets(ctx.role)]
            if not names:
                await self._refused(ctx, args, _forbidden("your role covers no configured target"))
        else:
            names = [ref] if isinstance(ref, str) else list(ref)
        refused: dict[str, dict[str, Any]] = {}
        filters: dict[str, ReadFilter | None] = {}
        for name in names:
            facts, limits = await self.off_loop(self._read_facts, ctx, args, name)
            filters[name] = read_rules(facts)
            try:
                await self._check(ctx, facts, args, target=name)
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
        facts = self.facts(Entry.READ, ctx.party, ctx.spec, args, target=target)
        return facts, self.policy.target_limits(target)

    async def _read(
        self, ctx: CallContext, args: dict[str, Any], _p: ProgressSink | None
    ) -> Answer:
        ref = args["target"]
        names, refused, filters = await self._read_targets(ctx, args)
        # read rules: list_vms is read so that what is hidden can be told and left out (read_args)
        wanted, shaping = read_args(ctx.spec.name, args, any(f is not None for f in filters.values()))
        fn = self._read_fn(ctx.spec, wanted)
        row = {"target": _target_label(args), "args": _redact_args(ctx.spec, args)}
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
            await self.record(ctx.row("call", outcome="error", error_code=exc.code, **row))
            raise
        if hidden is not None:  # read rules hide the one object this read is about
            await self._refused(ctx, args, denial(ctx.spec.name, names[0], hidden), target=names[0])
        outcome = "ok" if not outcomes or all(v == "ok" for v in outcomes.values()) else "partial"
        return await self.record_answer(ctx.row("call", outcome=outcome, outcomes=outcomes, **row), result)

    def _read_fn(self, spec: ToolSpec, args: Mapping[str, Any]) -> Callable[[VSphereSession], Any]:
        """What a read runs on a target's worker thread: the tool's read, given the target's mirror as a
        name index when the tool takes one (the answer is still read live)."""
        with_lookup, read = spec.read_with_lookup, spec.read
        if with_lookup is not None:
            return lambda s: with_lookup(s, args, self.mirrors.lookup(s.target.name))
        assert read is not None
        return lambda s: read(s, args)

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
            limits = await self.off_loop(self.policy.target_limits, target)
        per_minute, ceiling = limits.rate_limit(kind), limits.target_rate_limit(kind)
        try:
            await self.off_loop(self.rate_limiter.check, target, kind, per_minute, time.monotonic(),
                                caller=ctx.principal.name, target_limit=ceiling)  # PostgreSQL: a DB call
        except RateLimited as exc:
            await self._refused(ctx, args, exc, target=target)

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
        await self.record(ctx.row("call", outcome="ok", result=out))
        return out

    # -- writes and destructive proposals
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
            await self._refused(ctx, args, PolicyDenied(reason, decision=single))
        gate = self.facts(Entry.WRITE, ctx.party, spec, args, target=ref, resolved=False)
        await self._check(ctx, gate, args)
        target = self.targets[ref]
        await self._refuse_unless_audit_writable(ctx, args, target=target.name)
        digest = confirm.args_digest(spec.name, target.name, args)
        try:
            self.breaker.check(ctx.principal.name, spec.name, digest, spec.kind, time.monotonic())
        except GatewayError as exc:
            await self._refused(ctx, args, exc, target=target.name)
        await self._rate_limit(ctx, args, target.name, spec.kind)
        try:
            plan = await self.scheduler.run(
                target.name, lambda s: plan_fn(s, args), deadline=target.timeout_seconds
            )
        except GatewayError as exc:
            await self._refused(ctx, args, exc, target=target.name)
        verdict = await self._authorize_plan(ctx, Entry.WRITE, ctx.party, args, target, plan)
        decision = self._decision(verdict, target)
        if spec.kind is Category.DESTRUCTIVE or decision.require_approval:
            return await self._propose(ctx, target, args, plan, decision, digest)
        return await self._execute(ctx, target, plan, decision, args, progress)

    async def _authorize_plan(
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
        facts = await self.off_loop(
            self.facts,
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
        verdict = await self.off_loop(authorize_resolved, facts, reached)  # a bulk call: many objects
        await self._enforce(ctx, verdict, facts, args, proposal_id=proposal.id if proposal else None)
        return verdict

    def _decision(self, verdict: Verdict, target: Target) -> Decision:
        decision = verdict.decision or Decision(True, verdict.reason, verdict.rule)
        decision = replace(decision, require_approval=verdict.require_approval)
        if self.settings.dry_run or target.dry_run:
            decision = replace(decision, dry_run=True)
        return decision

    async def _propose(
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
        # redacted and bounded where it is made: the stored record, the answer, the audit row, the card and
        # every notification then carry the same clean text
        summary = shown_text(plan.summary)
        affected = shown([a.to_dict() for a in plan.affected])
        proposal = Proposal(
            id=confirm.new_proposal_id(),
            token_hash=confirm.token_hash(token),
            caller=ctx.principal.name,
            role=ctx.role.name,
            surface=ctx.principal.surface,
            target=target.name,
            target_host=target.address,
            tool=ctx.spec.name,
            args=args,
            args_digest=digest,
            plan_summary=summary,
            affected=affected,
            plan_params=dict(plan.params),
            created_at=now,
            expires_at=now + ttl,
            state="pending",
            require_web_approval=decision.require_approval,
            correlation_id=ctx.correlation_id,
        )
        await self.record(
            ctx.row(
                "proposed",
                target=target.name,
                args=_redact_args(ctx.spec, args),
                decision=decision.to_dict(),
                proposal_id=proposal.id,
                affected=affected,
            )
        )
        await self.off_loop(self.store.add_proposal, proposal)
        self._notify("proposed", proposal)
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
            "summary": summary,
            "affected": affected,
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
            "args": _redact_args(spec, args),
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
            await self.record(ctx.row("dry_run", outcome="ok", result=would, **base))
            if proposal is not None:
                await self.move(
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
            await self.intent(ctx.row("executing", **base))
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
                    self.move(
                        proposal,
                        ["executing"],
                        state,
                        actor=ctx.principal,
                        outcome=error.code,
                        error=error.to_wire(),
                        reason=_cut(error.message, 512),
                    )
                )
            else:
                await asyncio.shield(
                    self.record_outcome(
                        ctx.row(
                            state,
                            outcome=error.code,
                            error_code=error.code,
                            error=_cut(error.message, 512),
                            **base,
                        )
                    )
                )
            raise
        result = await asyncio.to_thread(clean, result)
        if proposal is not None:
            await self.move(
                proposal,
                ["executing"],
                "executed",
                actor=ctx.principal,
                outcome="ok",
                result={"summary": proposal.plan_summary},
                result_row=result,
            )
        else:
            await self.record_outcome(ctx.row("executed", outcome="ok", result=result, **base))
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
        await self.off_loop(self.expire_due)
        proposals = await self.off_loop(self.store.list_proposals, ["pending"])
        seen = [p for p in proposals if proposal_rights(ctx.party, Proposed.of(p)).see]
        now = self.clock()  # the views are redacted (regexes): in a worker thread, never on the loop
        rows = await self.off_loop(lambda: [proposal_view(p, now) for p in seen])
        await self.record(
            ctx.row("call", outcome="ok", count=len(rows), proposal_ids=[r["proposal_id"] for r in rows])
        )
        return {"pending": rows, "count": len(rows)}

    async def _by_token(self, ctx: CallContext, args: dict[str, Any]) -> Proposal:
        proposal = await self.off_loop(self.store.proposal_by_token_hash, confirm.token_hash(args["token"]))
        if proposal is None:
            await self._refused(
                ctx,
                {},
                ConfirmationInvalid(
                    "this confirmation token is unknown, already used, cancelled or denied; "
                    "make a fresh proposal"
                ),
            )
        assert proposal is not None
        return proposal

    async def _confirm(
        self, ctx: CallContext, args: dict[str, Any], progress: ProgressSink | None
    ) -> dict[str, Any]:
        proposal = await self._by_token(ctx, args)
        return await self.execute_proposal(
            proposal, ctx.principal, progress=progress, correlation_id=ctx.correlation_id, client=ctx.client
        )

    async def _cancel(
        self, ctx: CallContext, args: dict[str, Any], _p: ProgressSink | None
    ) -> dict[str, Any]:
        proposal = await self._by_token(ctx, args)
        spec = self.registry.get(proposal.tool) or ctx.spec
        owner = await self.off_loop(self.owner, proposal)
        facts = self.facts(
            Entry.CANCEL,
            ctx.party,
            spec,
            proposal.args,
            target=proposal.target,
            owner=owner,
            proposal=proposal,
            resolved=False,
        )
        facts = replace(
            facts, proposal_problem=None if proposal.state in OPEN_STATES else facts.proposal_problem
        )
        await self._check(ctx, facts, {}, proposal_id=proposal.id, via=ctx.spec.name)
        moved = await self.move(
            proposal,
            OPEN_STATES,
            "cancelled",
            actor=ctx.principal,
            correlation_id=ctx.correlation_id,
            decided_at=self.clock(),
            reason="cancelled by its caller",
        )
        if moved is None:
            await self._lost(ctx, proposal, "the proposal was no longer pending; nothing to cancel")
        return {"state": "cancelled", "proposal_id": proposal.id, "target": proposal.target}

    async def approve(
        self, proposal_id: str, human: Principal, *, correlation_id: str | None = None
    ) -> dict[str, Any]:
        """A human's approval (web page or CLI): the whole decision again, then the proposal runs."""
        proposal = await self.off_loop(self.store.get_proposal, proposal_id)
        if proposal is None:
            raise NotFound(f"no proposal {proposal_id} that you may see")
        return await self.execute_proposal(proposal, human, correlation_id=correlation_id, approved=True)

    def decision_rights(self, proposal: Proposal, human: Principal) -> tuple[Verdict, Verdict]:
        """What ``human`` may do with ``proposal`` now, as the decision says before anything is read
        from vSphere: the verdicts of a deny and of an approval (``Entry.DENY``, ``Entry.APPROVE``).
        For a page that offers the buttons; ``approve``/``deny`` decide again when clicked. Synchronous."""
        spec = self.registry.get(proposal.tool) or _unknown_tool(proposal.tool)
        actor, owner = self.party(human), self.owner(proposal)
        deny, approve = (
            authorize(
                self.facts(
                    entry,
                    actor,
                    spec,
                    proposal.args,
                    target=proposal.target,
                    owner=owner,
                    proposal=proposal,
                    resolved=False,
                )
            )
            for entry in (Entry.DENY, Entry.APPROVE)
        )
        return deny, approve

    def deny(
        self, proposal_id: str, human: Principal, *, correlation_id: str | None = None
    ) -> dict[str, Any]:
        """A human's denial. Synchronous: the web page and the CLI call it from a worker thread."""
        proposal = self.store.get_proposal(proposal_id)
        if proposal is None:
            raise NotFound(f"no proposal {proposal_id} that you may see")
        spec = self.registry.get(proposal.tool) or _unknown_tool(proposal.tool)
        actor = self.party(human)
        human = replace(human, kind=actor.kind)
        facts = self.facts(
            Entry.DENY,
            actor,
            spec,
            proposal.args,
            target=proposal.target,
            owner=self.owner(proposal),
            proposal=proposal,
        )
        verdict = authorize(facts)
        if not verdict.allowed:
            ctx = CallContext(human, actor, spec, correlation_id)
            row = ctx.row(
                "denied",
                target=proposal.target,
                proposal_id=proposal.id,
                requested_by=proposal.caller,
                decision=verdict.to_dict(),
                error_code=verdict.code,
                reason_code=verdict.details.get("reason_code"),
                via="deny",
            )
            self._write_row(row)
            verdict.raise_if_refused()
        moved = self.move_sync(
            proposal,
            ["pending"],
            "denied",
            actor=human,
            correlation_id=correlation_id,
            approved_by=human.name,
            decided_at=self.clock(),
            reason=f"denied by {human.name}",
            decision={"allowed": False, "reason": f"denied by {human.name}", "rule": "human"},
        )
        if moved is None:
            raise ConfirmationInvalid(f"proposal {proposal.id} is no longer pending")
        return {"state": "denied", "proposal_id": proposal.id, "target": proposal.target}

    def revoke_token(self, name: str, *, by: Principal) -> list[str]:
        """Revoke token ``name`` (refused from its next request on), cancel every open proposal it made
        (each move audited), then audit the revocation. The one path for ``gateway token revoke``.

        Returns the cancelled proposal ids. The revocation stands even if its row cannot be written
        (``AuditUnavailable`` is raised after it): revoking only narrows access."""
        rec = self.store.update_token(name, revoked=True)
        cancelled = self.cancel_proposals_of(name, by=by, reason="token revoked")
        self._write_row(
            {
                "phase": "token_revoked",
                "caller": by.name,
                "kind": by.kind.value,
                "surface": by.surface,
                "token_name": rec.name,
                "token_id": rec.token_id,
                "role": rec.role,
                "cancelled_proposals": cancelled,
            }
        )
        return cancelled

    def cancel_proposals_of(self, caller: str, *, by: Principal, reason: str) -> list[str]:
        cancelled = []
        for p in self.store.list_proposals(list(OPEN_STATES), limit=10_000):
            if (
                p.caller == caller
                and self.move_sync(
                    p, OPEN_STATES, "cancelled", actor=by, decided_at=self.clock(), reason=reason
                )
                is not None
            ):
                cancelled.append(p.id)
        return cancelled

    def cancel_orphaned(self) -> list[str]:
        """Cancel open proposals whose proposer's token is now revoked or expired (a revocation made by
        a process that could not do it, or an expiry): they could never run anyway."""
        generation = self.store.token_generation()
        if generation == self._token_generation:
            return []
        self._token_generation = generation
        actor = Principal(name="gateway", role="-", surface="server")
        cancelled = []
        for p in self.store.list_proposals(list(OPEN_STATES), limit=10_000):
            state = self.owner(p).token
            if state not in (TokenState.REVOKED, TokenState.EXPIRED):
                continue
            reason = f"token {state.value}"
            now = self.clock()
            if self.move_sync(p, OPEN_STATES, "cancelled", actor=actor, decided_at=now, reason=reason):
                cancelled.append(p.id)
        return cancelled

    async def execute_proposal(
        self,
        proposal: Proposal,
        actor: Principal,
        *,
        progress: ProgressSink | None = None,
        correlation_id: str | None = None,
        approved: bool = False,
        client: str | None = None,
    ) -> dict[str, Any]:
        """Re-authorize against the state now, claim the proposal exactly once, then execute it."""
        spec = self.registry.get(proposal.tool)
        target = self.targets.get(proposal.target)
        party = await self.off_loop(self.party, actor)
        actor = replace(actor, kind=party.kind)
        ctx = CallContext(
            actor,
            party,
            spec or _unknown_tool(proposal.tool),
            correlation_id or proposal.correlation_id,
            client,
            via="approve" if approved else "confirm_action",
        )
        if spec is None or target is None or spec.plan is None:
            await self._refused(
                ctx,
                {},
                ConfirmationInvalid(
                    f"proposal {proposal.id} names a tool or target this server no longer has"
                ),
                proposal_id=proposal.id,
                target=proposal.target,
            )
        assert spec is not None and target is not None and spec.plan is not None
        entry = Entry.APPROVE if approved else Entry.CONFIRM
        owner = await self.off_loop(self.owner, proposal)
        gate = self.facts(
            entry,
            party,
            spec,
            proposal.args,
            target=target.name,
            owner=owner,
            proposal=proposal,
            resolved=False,
        )
        await self._check(ctx, gate, {}, proposal_id=proposal.id)
        await self._refuse_unless_audit_writable(ctx, {}, proposal_id=proposal.id, target=target.name)
        plan = await self._replan(ctx, target, spec.plan, proposal)
        verdict = await self._authorize_plan(
            ctx, entry, party, proposal.args, target, plan, owner, proposal
        )
        decision = self._decision(verdict, target)
        if approved:
            moved = await self.move(
                proposal,
                ["pending"],
                "approved",
                actor=actor,
                correlation_id=ctx.correlation_id,
                approved_by=actor.name,
                decided_at=self.clock(),
            )
            if moved is None:
                await self._lost(ctx, proposal, "another caller moved the proposal first; nothing was sent")
            assert moved is not None
            proposal = moved
        claimed = await self.claim(ctx, proposal, decision)
        result = await self._execute(ctx, target, plan, decision, proposal.args, progress, proposal=claimed)
        return {"state": "executed", "proposal_id": proposal.id, "target": target.name, **result}

    async def claim(self, ctx: CallContext, proposal: Proposal, decision: Decision) -> Proposal:
        """Claim the proposal for this process (``executing``) by the store's compare-and-set, THEN write
        the claim's row, the intent, durably before anything reaches vSphere. Of racing confirms only
        the winner writes ``executing``; each loser writes one ``claim_lost`` row and is refused. If
        the intent cannot be written the change is refused and the claimed proposal ends ``failed``
        (nothing was sent to vSphere), its row waiting for the audit like any outcome."""
        instance = await asyncio.to_thread(self.instance.acquire)
        fields: dict[str, Any] = {"decided_at": self.clock(), "executor": instance}
        row = self._transition_row(
            proposal,
            "executing",
            actor=ctx.principal,
            correlation_id=ctx.correlation_id,
            executor=instance,
            args=_redact_args(ctx.spec, proposal.args),
            decision=decision.to_dict(),
        )
        if not await self.off_loop(self.store.transition, proposal.id, ["pending", "approved"], "executing",
                                   **fields):
            await self._lost(ctx, proposal, "another caller moved the proposal first; nothing was sent",
                             executor=instance, args=row.get("args"), decision=row.get("decision"))
        claimed = replace(proposal, state="executing", **fields)
        try:
            await self.intent(row)
        except AuditUnavailable as exc:
            await self.move(
                claimed,
                ["executing"],
                "failed",
                actor=ctx.principal,
                correlation_id=ctx.correlation_id,
                outcome=exc.code,
                error=exc.to_wire(),
                reason="the intent row could not be written; nothing was sent to vSphere",
            )
            raise
        self._notify("executing", claimed)
        return claimed

    async def _lost(self, ctx: CallContext, proposal: Proposal, reason: str, **fields: Any) -> NoReturn:
        """The one row of an attempt that lost a race for ``proposal`` (``claim_lost``), then its refusal."""
        error = ConfirmationInvalid(f"proposal {proposal.id} was already confirmed, cancelled or expired")
        row = self._transition_row(proposal, "claim_lost", actor=ctx.principal,
                                   correlation_id=ctx.correlation_id, reason=reason, **fields)
        await self.record({**row, "error_code": error.code})
        raise error

    async def _replan(
        self,
        ctx: CallContext,
        target: Target,
        plan_fn: Callable[[Any, Mapping[str, Any]], Plan],
        proposal: Proposal,
    ) -> Plan:
        """Resolve the proposal's objects again; anything that no longer matches makes it stale (the move
        is this attempt's row; an attempt that loses that move to another caller writes ``claim_lost``).
        Any other failure (the target unreachable, say) is this attempt's refused row; the proposal
        stays as it was."""
        try:
            plan = await self.scheduler.run(
                target.name, lambda s: plan_fn(s, proposal.args), deadline=target.timeout_seconds
            )
            _check_not_stale(proposal, plan)
        except (NotFound, Ambiguous, Stale, InvalidArgument) as exc:
            error = Stale(
                f"proposal {proposal.id} no longer matches vSphere ({exc.message}); make a fresh "
                "proposal and check it again",
                proposal_id=proposal.id,
            )
            moved = await self.move(
                proposal,
                OPEN_STATES,
                "stale",
                actor=ctx.principal,
                correlation_id=ctx.correlation_id,
                outcome="stale",
                error=error.to_wire(),
                decided_at=self.clock(),
                reason=_cut(exc.message, 512),
            )
            if moved is None:
                await self._lost(ctx, proposal, f"found stale ({_cut(exc.message, 256)}) after another "
                                 "caller had moved the proposal; nothing was sent")
            raise error from exc
        except GatewayError as exc:
            await self._refused(ctx, {}, exc, proposal_id=proposal.id, target=target.name)
        return plan

    def expire_due(self) -> None:
        """Move every due open proposal to ``expired`` (each once, whichever process gets there first)."""
        now = self.clock()
        actor = Principal(name="gateway", role="-", surface="server")
        for p in self.store.list_proposals(list(OPEN_STATES), limit=1000, due_before=now):
            self.move_sync(
                p,
                OPEN_STATES,
                "expired",
                actor=actor,
                decided_at=now,
                outcome="expired",
                reason="its time ran out",
            )

    async def _sweep_forever(self) -> None:
        """Every second: expire due proposals, cancel those of revoked tokens, append waiting audit rows;
        every ``SETTLE_EVERY`` seconds, settle claims of processes that died meanwhile (a CLI approval
        killed while this server runs)."""
        ticks = 0
        while True:
            try:
                leader = self.sweep_leader is None or await asyncio.to_thread(self.sweep_leader.is_leader)
                if leader:  # with replicas on PostgreSQL one of them sweeps for all
                    await asyncio.to_thread(self.expire_due)
                    await asyncio.to_thread(self.cancel_orphaned)
                if self._waiting:
                    await asyncio.to_thread(self.flush_waiting)
                ticks += 1
                if leader and ticks % SETTLE_EVERY == 0:
                    await asyncio.to_thread(self.settle_interrupted)
            except Exception:  # the sweeper must survive a transient store or audit error
                log.exception("the proposal sweeper failed; retrying")
            await asyncio.sleep(1.0)

    # ----------------------------------------------------------------- moves
    async def move(
        self,
        proposal: Proposal,
        from_states: Sequence[str],
        to_state: str,
        *,
        actor: Principal,
        correlation_id: str | None = None,
        reason: str | None = None,
        result_row: Any = None,
        audited: bool = False,
        **fields: Any,
    ) -> Proposal | None:
        """``move_sync`` for the event loop: the compare-and-set in a worker thread with a deadline; the
        row through ``record_outcome`` (never blocks the caller: a row the audit cannot take waits)."""
        moved = await self.off_loop(self.store.transition, proposal.id, from_states, to_state, **fields)
        if not moved:
            return None
        after = replace(proposal, state=to_state, **fields)
        if not audited:
            await self.record_outcome(
                self._transition_row(
                    proposal,
                    to_state,
                    actor=actor,
                    correlation_id=correlation_id,
                    reason=reason,
                    shown=result_row,
                    **fields,
                )
            )
        self._notify(to_state, after)
        return after

    def move_sync(
        self,
        proposal: Proposal,
        from_states: Sequence[str],
        to_state: str,
        *,
        actor: Principal,
        correlation_id: str | None = None,
        reason: str | None = None,
        **fields: Any,
    ) -> Proposal | None:
        """THE way a proposal changes state: the lifecycle edge by the store's compare-and-set (the store
        refuses any move outside guard/lifecycle.py), its audit row, then the lifecycle listeners. None
        if another caller moved it first. A row the audit cannot take now waits in memory (the server
        reports unready) and is appended once it can be. (``move`` is the same for the event loop; the
        ``executing`` claim writes its row first, as the intent: see ``claim``.)"""
        shown = {k: fields.pop(k) for k in ("decision", "args") if k in fields}
        if not self.store.transition(proposal.id, from_states, to_state, **fields):
            return None
        after = replace(proposal, state=to_state, **fields)
        self._write_or_wait(
            self._transition_row(
                proposal,
                to_state,
                actor=actor,
                correlation_id=correlation_id,
                reason=reason,
                **shown,
                **fields,
            )
        )
        self._notify(to_state, after)
        return after

    def _transition_row(
        self,
        proposal: Proposal,
        to_state: str,
        *,
        actor: Principal,
        correlation_id: str | None = None,
        reason: str | None = None,
        shown: Any = None,
        args: Any = None,
        decision: Any = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """The audit row of one move (``shown``: the result the caller was given, if any)."""
        spec = self.registry.get(proposal.tool)
        row = {
            "phase": to_state,
            "tool": proposal.tool,
            "risk": spec.risk.value if spec else None,
            "target": proposal.target,
            "caller": actor.name,
            "kind": actor.kind.value,
            "role": actor.role,
            "surface": actor.surface,
            "requested_by": proposal.caller,
            "proposal_id": proposal.id,
            "correlation_id": correlation_id or proposal.correlation_id,
            "reason": reason,
            "executor": fields.get("executor"),
            "outcome": fields.get("outcome"),
            "error_code": (fields.get("error") or {}).get("code"),
            "args": args,
            "decision": decision,
            "result": shown,
        }
        return {k: v for k, v in row.items() if v is not None}

    def _notify(self, event: str, proposal: Proposal) -> None:
        for listener in list(self._listeners):
            try:
                listener(event, proposal)
            except Exception:
                log.exception("a lifecycle listener failed on %s of proposal %s", event, proposal.id)

    # ----------------------------------------------------------------- audit and store, off the loop
    async def off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking call (state store, audit) in a worker thread with a deadline."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args, **kwargs), STORE_DEADLINE_SECONDS)
        except TimeoutError:
            log.error("%s did not answer within %gs", getattr(fn, "__qualname__", fn), STORE_DEADLINE_SECONDS)
            raise StateUnavailable(
                f"the state store or audit did not answer within {STORE_DEADLINE_SECONDS:g}s; "
                "nothing was changed by this call; retry, and see the gateway log"
            ) from None

    async def record(self, row: Mapping[str, Any]) -> None:
        """Append one audit row (every async audit write comes here): in a worker thread, within a
        deadline. Raises ``AuditUnavailable`` when it cannot be written: the call is refused."""
        await self._audit_off_loop(lambda: self._write_row(row))

    async def record_answer(self, row: Mapping[str, Any], result: Any) -> Answer:
        """Encode ``result`` once (``Answer.cleaned``; an ``Answer`` is already encoded) and append
        ``row`` fingerprinting that answer, in one worker thread (the encoding of a big listing never
        runs on the event loop); ``record``'s deadline and refusal. Returns the answer to send."""

        def encode_and_write() -> Answer:
            answer = result if isinstance(result, Answer) else Answer.cleaned(result)
            self._write_row({**row, "result": answer})
            return answer

        return await self._audit_off_loop(encode_and_write)

    async def _audit_off_loop(self, write: Callable[[], T]) -> T:
        try:
            return await asyncio.wait_for(asyncio.to_thread(write), AUDIT_DEADLINE_SECONDS + 1.0)
        except TimeoutError:
            raise AuditUnavailable(
                f"audit log {self.settings.audit_log} did not take the row within "
                f"{AUDIT_DEADLINE_SECONDS:g}s "
                "(a held lock or a slow disk); nothing more was done. Retry, and see the gateway log"
            ) from None

    async def _refuse_unless_audit_writable(
        self, ctx: CallContext, args: Mapping[str, Any], **fields: Any
    ) -> None:
        """Refuse a change before its first vSphere read while the audit cannot take rows (what
        ``readiness`` reports: the sink says it is not writable, or too many rows wait): its intent
        could not be written anyway. The ``refused`` row waits for the audit, like an intent's."""
        if len(self._waiting) < MAX_WAITING_OUTCOMES and await self.off_loop(self.audit.writable):
            return
        exc = AuditUnavailable(
            f"audit log {self.settings.audit_log} cannot take rows now (/readyz says why); nothing was "
            "read from or sent to vSphere. Retry once the audit is writable again"
        )
        reason = "the audit was not writable; nothing was read from or sent to vSphere"
        self._wait(ctx.row("refused", args=_redact_args(ctx.spec, args), error_code=exc.code, reason=reason,
                           **fields))
        raise exc

    async def intent(self, row: Mapping[str, Any]) -> None:
        """The durable row a change writes before its vSphere call. If it cannot be written the change is
        refused (``AuditUnavailable``), and a ``refused`` row waits to say so once the audit is back.
        While ``MAX_WAITING_OUTCOMES`` rows already wait, every new change is refused."""
        if len(self._waiting) >= MAX_WAITING_OUTCOMES:
            raise AuditUnavailable(
                f"{len(self._waiting)} audit rows of finished changes wait for the audit log "
                f"{self.settings.audit_log}; no new change runs until it takes them"
            )
        try:
            await self.record(row)
        except AuditUnavailable as exc:
            self._wait(
                {
                    **row,
                    "phase": "refused",
                    "error_code": exc.code,
                    "reason": "the intent row could not be written; nothing was sent to vSphere",
                }
            )
            raise

    async def record_outcome(self, row: Mapping[str, Any]) -> None:
        """Append the row of something that already happened. Never raises and never holds the caller
        past the deadline: a row the audit cannot take now waits (see ``flush_waiting``)."""
        if self._waiting:
            self._wait(row)
            return
        try:
            await self.record(row)
        except AuditUnavailable:
            log.error(
                "audit row of a finished change (%s) waits until the audit log is writable",
                row.get("phase"),
            )
            self._wait(row)

    def _write_or_wait(self, row: Mapping[str, Any]) -> None:
        """``record_outcome`` for synchronous callers (worker threads, the CLI)."""
        self.flush_waiting()
        if self._waiting:
            self._wait(row)
            return
        try:
            self._write_row(row)
        except AuditUnavailable:
            log.error("audit row (%s) waits until the audit log is writable", row.get("phase"))
            self._wait(row)

    def _wait(self, row: Mapping[str, Any]) -> None:
        self._waiting.append({**row, "delayed": True, "row_id": uuid.uuid4().hex})

    def flush_waiting(self) -> int:
        """Append the rows that waited for the audit log, oldest first; stop at the first failure."""
        written = 0
        with self._flushing:
            while self._waiting:
                try:
                    self._write_row(self._waiting[0])
                except AuditUnavailable:
                    break
                self._waiting.popleft()
                written += 1
        return written

    def _write_row(self, row: Mapping[str, Any]) -> None:
        try:
            # the sink gives up on its locks first, so a refused row is never appended late
            self.audit.write(row, timeout=AUDIT_DEADLINE_SECONDS)
        except AuditUnavailable:
            raise
        except Exception as exc:  # any failure to record is a refusal, never a silent pass
            log.exception("audit write failed")
            raise AuditUnavailable(
                f"audit log {self.settings.audit_log} could not record the call; see the server log"
            ) from exc


def client_of(request_context: Any) -> str | None:
    """The MCP client's declared ``name/version`` (from its initialize request), cleaned and bounded, for
    audit rows; None when the client declared none (the stateless revision makes it optional)."""
    params = getattr(getattr(request_context, "session", None), "client_params", None)
    info = getattr(params, "clientInfo", None) or getattr(params, "client_info", None)
    name = getattr(info, "name", None)
    if not isinstance(name, str):
        return None
    version = getattr(info, "version", None)
    label = f"{name}/{version}" if isinstance(version, str) and version else name
    return str(clean(_cut(label, 128)))


def _entry(spec: ToolSpec) -> Entry:
    return Entry.READ if spec.kind is Category.READ else Entry.WRITE


def _forbidden(message: str) -> GatewayError:
    return Forbidden(message)


def _unknown_tool(name: str) -> ToolSpec:
    """A stand-in spec naming an unknown tool in its audit row (strictest category, never executed)."""
    return ToolSpec(name=_cut(name, 128), description="unknown tool", target_mode="none")


def _cut(text: str, limit: int = 128) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def _target_label(args: Mapping[str, Any] | None) -> str | None:
    ref = (args or {}).get("target")
    if isinstance(ref, list):
        return _cut(",".join(str(r) for r in ref[:20]), AUDIT_VALUE_CHARS)
    return _cut(ref, AUDIT_VALUE_CHARS) if isinstance(ref, str) else None


def _redact_args(spec: ToolSpec, args: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ("***" if k in spec.sensitive_params else v) for k, v in args.items()}


def _check_not_stale(proposal: Proposal, plan: Plan) -> None:
    before = sorted((a.get("type"), a.get("moid"), a.get("name")) for a in proposal.affected)
    after = sorted((a["type"], a["moid"], a["name"]) for a in shown([a.to_dict() for a in plan.affected]))
    if before != after:
        raise Stale(
            f"the objects of proposal {proposal.id} changed since it was made (renamed, replaced or "
            "removed); make a fresh proposal and check it again"
        )


def proposal_view(p: Proposal, now: float) -> dict[str, Any]:
    """A proposal as shown to callers and humans (redacted and bounded, ``gateway.audit.redact.shown``;
    never the token or its hash)."""
    view = {
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
    return shown(view)  # type: ignore[no-any-return]
