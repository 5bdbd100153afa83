"""The composition root of one gateway process: ``Gateway.build`` opens the backends once
(``gateway.store.backends``), loads the configuration and hands collaborators to the classes that do
the work; ``Gateway`` is the thin facade every surface calls (MCP, the web page, the CLI).

How a call flows (every surface: stdio, HTTPS, the web page, ``gateway pending``)::

    Gateway.answer -> server/calls.py Calls.answer
      -> text no engine can store (NUL, lone surrogates: guard.inputs) refused first, audited escaped
      -> facts about the caller as the store says *now* (server/facts.py: token state, current role)
      -> gate: guard.decision.authorize (token -> role), before anything is read from vSphere
      -> argument validation (bounded; NaN/Infinity refused)            every refusal is audited
      -> runaway breaker, rate limit per caller x target x category (reads too), target-wide ceiling
      -> a change while the audit cannot take rows (readiness says so): refused, nothing read
      -> resolve on the target (a Plan: objects + facts, nothing changes)
      -> authorize again with the objects (decision.authorize_resolved): the call, each object as
         each tool it reaches, then the state preconditions; the first refusal wins
      -> read: answer (per-target outcomes in the row)
         write: audit the intent (``executing``, durable) BEFORE vSphere; refuse if it cannot be written
         destructive: persist a proposal (server/proposal_flow.py); confirm_action / a human's approval
         re-run authorize on the state at that moment (the proposer's current token and role, current
         rules, re-resolved objects), then claim it by compare-and-set, then write ``executing``
         (naming this process) and run it; every losing attempt is one row
      -> audit the outcome; if the audit cannot take it, it waits in memory (the server reports
         unready) and is appended as soon as the audit is writable again (server/audit_trail.py)

Every proposal move goes through ``Moves.move`` (server/moves.py: the lifecycle table of
guard/lifecycle.py, the store's compare-and-set, an audit row, then the lifecycle listeners); the
sweeper there expires, cancels orphans and settles dead claims.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.answer import Answer
from gateway.auth.roles import Role, RoleBook
from gateway.auth.tokens import Principal, TokenVerifier
from gateway.config import Target, load_targets
from gateway.guard import names
from gateway.guard.decision import Party, Verdict
from gateway.guard.policy_store import PolicyStore
from gateway.notify import Notifier, notifier_for
from gateway.private_files import make_private_dirs
from gateway.server import reloads
from gateway.server.audit_trail import AuditTrail, write_quietly
from gateway.server.calls import Calls
from gateway.server.context import ProgressSink
from gateway.server.facts import FactsNow
from gateway.server.metrics import Metrics, sample_families
from gateway.server.moves import EXECUTION_GRACE_SECONDS, LifecycleListener, Moves
from gateway.server.proposal_flow import ProposalFlow
from gateway.server.read_rules import ReadRules
from gateway.settings import Settings
from gateway.store.backends import Backends, open_backends
from gateway.store.base import Proposal
from gateway.tools.read import MIRROR_READS
from gateway.tools.registry import Registry, build_registry
from gateway.tools.spec import Category, ToolSpec
from gateway.vsphere.mirror import Mirrors
from gateway.vsphere.scheduler import Scheduler


class Gateway:
    """One gateway process: composes the collaborators and is the facade every surface calls."""

    def __init__(
        self,
        settings: Settings,
        targets: Sequence[Target],
        registry: Registry,
        *,
        scheduler: Scheduler,
        backends: Backends,
        policy: PolicyStore,
        roles: RoleBook,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.targets = {t.name: t for t in targets}
        self.registry = registry
        self.scheduler = scheduler
        self.backends = backends
        self.store = backends.store
        self.audit = backends.audit
        self.policy = policy
        self.roles = roles
        self.clock = clock
        self.draining = False
        now = lambda: self.clock()  # noqa: E731 (the tests set ``clock`` after building)
        self.authenticator = TokenVerifier(backends.store)
        self.metrics = Metrics(targets=self.targets, tools=[spec.name for spec in registry])
        self.mirrors = Mirrors(targets, settings.credentials, MIRROR_READS)
        list_vms = registry.get("list_vms")
        assert list_vms is not None and list_vms.read is not None
        #: what each read may show (read rules), applied after the mirror or the sweep answered
        self.read_rules = ReadRules(self.mirrors, scheduler, self.targets, list_vms.read)
        self.metrics.add_collector("mirrors", lambda: sample_families(self.mirrors.samples()))
        self.trail = AuditTrail(backends.audit, settings.audit_log)
        self.facts = FactsNow(registry, self.targets, policy, roles, backends.store, now)
        self.moves = Moves(backends.store, self.trail, registry, self.facts, instance=backends.instance,
                           reader=backends.reader, sweep_leader=backends.sweep_leader, clock=now)
        self.calls = Calls(settings, self.targets, registry, scheduler=scheduler, mirrors=self.mirrors,
                           read_rules=self.read_rules, policy=policy, facts=self.facts, trail=self.trail,
                           moves=self.moves, metrics=self.metrics, rate_limiter=backends.rate_limiter,
                           breaker=backends.breaker)
        self.proposals = ProposalFlow(settings, self.targets, registry, store=backends.store,
                                      calls=self.calls, facts=self.facts, moves=self.moves,
                                      trail=self.trail, clock=now)
        self.calls.proposer = self.proposals
        self.calls.local.update(self.proposals.handlers())
        # notifications.yaml: loaded (ConfigError on a bad file) and attached now, delivering from start()
        self.notifier: Notifier | None = None
        path = settings.notifications_file
        if path is not None:
            write = self.audit.write
            self.notifier = reloads.load_audited(
                "notifications", path, lambda: notifier_for(path, settings.notify_env, write, [self]),
                lambda n: {"channels": {c.name: c.kind for c in n.config.channels}}, self.config_row)

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    def build(cls, settings: Settings) -> Gateway:
        """Load configuration and open the backends; raises ConfigError on anything fatal."""
        registry = build_registry(destructive=settings.enable_destructive, read_only=settings.read_only)
        make_private_dirs(settings.home)
        backends = open_backends(settings)
        audit = backends.audit
        # every configuration load is an audit row (gateway.server.reloads), through the gateway's
        # own audit path once it exists; targets.yaml is read before, straight into the sink
        targets = reloads.load_audited(
            "targets", settings.targets_file,
            lambda: load_targets(settings.targets_file, settings.credentials),
            reloads.targets_summary, lambda row: write_quietly(audit, row))
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
                                slots=backends.slots),
            backends=backends,
            policy=policy,
            roles=roles,
        )
        built.append(gateway)
        names.watch(policy, roles, targets)  # a name in rules.yaml or roles.yaml matching nothing: WARNING
        return gateway

    async def start(self) -> None:
        await self.start_notifier()
        await asyncio.to_thread(self.moves.settle_interrupted)
        await asyncio.to_thread(self.moves.recover_outcome_rows)
        self.moves.start_sweeper()
        self.mirrors.start_eager()

    async def start_notifier(self) -> None:
        """Begin telling humans about lifecycle events (channels loaded when the gateway was built)."""
        if self.notifier is not None:
            await self.notifier.start()

    async def close(self) -> None:
        self.draining = True
        if self.notifier is not None:
            await self.notifier.close()
        await self.moves.stop_sweeper()
        await asyncio.to_thread(self.trail.flush_waiting)
        await asyncio.to_thread(self.mirrors.close)
        await asyncio.to_thread(self.scheduler.close)
        await asyncio.to_thread(self.backends.close)

    def config_row(self, row: Mapping[str, Any]) -> None:
        """Audit one configuration load (``gateway.server.reloads``); it waits in memory while the audit
        cannot take it. Blocking: the stores call it from the thread that read the file."""
        self.trail.write_or_wait(row)

    def readiness(self) -> list[str]:
        """Reasons this process should not take traffic; empty when ready."""
        reasons = []
        if self.draining:
            reasons.append("shutting down")
        if self.trail.waiting:
            waiting = len(self.trail.waiting)
            reasons.append(f"{waiting} audit row(s) of finished changes wait for the audit log")
        if not self.audit.writable():
            reasons.append("audit log not writable")
        if not self.store.ping():
            reasons.append("state store not answering")
        if self.policy.snapshot()[0] is None:  # no good rules ever loaded: every call is refused
            reasons.append("no usable rules file (`gateway check` shows why)")
        return reasons

    # ----------------------------------------------------------------- the facade the surfaces call
    def role_of(self, principal: Principal) -> Role | None:
        return self.facts.role_of(principal)

    @property
    def change_tools(self) -> tuple[tuple[str, Category], ...]:
        return self.facts.change_tools

    def tools_for(self, principal: Principal) -> list[ToolSpec]:
        return self.facts.tools_for(principal)

    def visible_targets(self, role: Role) -> list[Target]:
        return self.facts.visible_targets(role)

    def party(self, principal: Principal) -> Party:
        return self.facts.party(principal)

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
        """One tool call (``Calls.answer``): the answer is encoded once, its text goes to the caller as is."""
        return await self.calls.answer(principal, name, args, progress=progress,
                                       correlation_id=correlation_id, client=client)

    async def approve(
        self, proposal_id: str, human: Principal, *, correlation_id: str | None = None
    ) -> dict[str, Any]:
        return await self.proposals.approve(proposal_id, human, correlation_id=correlation_id)

    def deny(
        self, proposal_id: str, human: Principal, *, correlation_id: str | None = None
    ) -> dict[str, Any]:
        return self.proposals.deny(proposal_id, human, correlation_id=correlation_id)

    def decision_rights(self, proposal: Proposal, human: Principal) -> tuple[Verdict, Verdict]:
        return self.proposals.decision_rights(proposal, human)

    def add_lifecycle_listener(self, fn: LifecycleListener) -> None:
        self.moves.add_lifecycle_listener(fn)

    def revoke_token(self, name: str, *, by: Principal) -> list[str]:
        return self.moves.revoke_token(name, by=by)

    def settle_interrupted(self, older_than: float = EXECUTION_GRACE_SECONDS) -> list[str]:
        return self.moves.settle_interrupted(older_than)

    def expire_due(self) -> None:
        self.moves.expire_due()

    def cancel_orphaned(self) -> list[str]:
        return self.moves.cancel_orphaned()

    def flush_waiting(self) -> int:
        return self.trail.flush_waiting()
