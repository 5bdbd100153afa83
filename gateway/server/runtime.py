"""The composition root of one gateway process: ``Gateway.build`` opens the backends once
(``gateway.backends``), loads the configuration and hands collaborators to the classes that do
the work; ``Gateway`` is the thin facade every surface calls (MCP, the web page, the CLI).

How a call flows (every surface: stdio, HTTPS, the web page, ``gateway pending``)::

    Gateway.answer -> server/call/arrival.py Calls.answer
      -> text no engine can store (NUL, lone surrogates: guard.inputs) refused first, audited escaped
      -> facts about the caller as the store says *now* (server/base/facts.py: token state, current role)
      -> gate (server/call/gate.py, where the call path asks the decision and enforces its verdict):
         guard.decision.authorize (token -> role), before anything is read from vSphere
      -> argument validation (bounded; NaN/Infinity refused)            every refusal is audited
      -> runaway breaker, rate limit per caller x target x category (reads too), target-wide ceiling
      -> a change while the audit cannot take rows (readiness says so): refused, nothing read
      -> resolve on the target (a Plan: objects + facts, nothing changes)
      -> authorize again with the objects (decision.authorize_resolved): the call, each object as
         each tool it reaches, then the state preconditions; the first refusal wins
      -> read: answer (per-target outcomes in the row)
         write: audit the intent (``executing``, durable) BEFORE vSphere; refuse if it cannot be written
         destructive: persist a proposal (server/proposals/flow.py; an approval's own steps in
         proposals/approval_steps.py, what a proposal shows in proposals/views.py); confirm_action
         / a human's approval re-run authorize on the state at that moment (the proposer's current
         token and role, current rules, re-resolved objects), then claim it by compare-and-set,
         then write ``executing`` (naming this process) and run it; every losing attempt is one row
      -> audit the outcome; if the audit cannot take it, it waits in memory (the server reports
         unready) and is appended as soon as the audit is writable again (server/base/audit_trail.py)

Every proposal move goes through ``Moves.move`` (server/base/moves.py: the lifecycle table in
gateway/proposals.py, the store's compare-and-set, an audit row, then the lifecycle listeners); the
sweeper there expires, cancels orphans and settles dead claims.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.auth.roles import RoleBook
from gateway.auth.tokens import TokenVerifier
from gateway.backends import AuditReader, Backends, open_backends
from gateway.config import Target, load_targets
from gateway.guard import names
from gateway.guard.policy.store import PolicyStore
from gateway.notify import Notifier, notifier_for
from gateway.server.base import reloads
from gateway.server.base.audit_trail import (
    AuditTrail,
    ScheduledCheckpoints,
    checkpoint_schedule,
    forward_to_syslog,
    start_checkpoints,
)
from gateway.server.base.facts import FactsNow
from gateway.server.base.metrics import Metrics
from gateway.server.call_path import compose_call_path
from gateway.server.facade import GatewayFacade
from gateway.settings import Settings
from gateway.tools.registry import Registry, build_registry, tool_categories
from gateway.vsphere.scheduler import Scheduler

log = logging.getLogger(__name__)


class Gateway(GatewayFacade):
    """One gateway process: composes the collaborators; the surfaces call it (``GatewayFacade``)."""

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
        trail: AuditTrail | None = None,
        clock: Callable[[], float] = time.time,
        quiet_loads: bool = False,
    ) -> None:
        self.settings = settings
        #: a CLI run: a configuration load is audited only when it is news (``reloads.already_audited``)
        self.quiet_loads = quiet_loads
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
        #: signs the audit chain's head on schedule while serving (``start``/``close``)
        self.checkpoint_timer: ScheduledCheckpoints | None = None
        now = lambda: self.clock()  # noqa: E731 (the tests set ``clock`` after building)
        self.authenticator = TokenVerifier(backends.store)
        self.metrics = Metrics(targets=self.targets, tools=[spec.name for spec in registry])
        self.facts = FactsNow(registry, self.targets, policy, roles, backends.store, now)
        self.path = compose_call_path(settings, self.facts, scheduler=scheduler, backends=backends,
                                      metrics=self.metrics, trail=trail)
        self.trail, self.moves, self.proposals = self.path.trail, self.path.moves, self.path.proposals
        self.mirrors, self.read_rules = self.path.mirrors, self.path.read_rules
        # identity.yaml: identity providers' tokens besides gateway tokens (None without the file)
        self.identity = reloads.load_identity(settings.identity_file, self.trail_write, self.config_row)
        # notifications.yaml: loaded (ConfigError on a bad file) and attached now, delivering from start()
        self.notifier: Notifier | None = None
        path = settings.notifications_file
        if path is not None:
            write = self.trail.write_row  # through the trail, so the rows are forwarded too
            self.notifier = reloads.load_audited(
                "notifications", path, lambda: notifier_for(path, settings.notify_env, write, [self]),
                lambda n: {"channels": {c.name: c.kind for c in n.config.channels}}, self.config_row)
            publisher = getattr(self.audit, "publisher", None)  # each signed checkpoint also to the webhooks
            if publisher is not None:
                publisher.listeners.append(self.notifier.on_checkpoint)

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    def build(cls, settings: Settings, *, credentials_required: bool = True, cli: bool = False) -> Gateway:
        """Load configuration and open the backends; raises ConfigError on anything fatal.
        ``credentials_required=False``: a target whose credentials are not in the environment is still
        loaded (a command that only lists proposals; its calls would fail at login, naming them).
        ``cli``: a command's run, which audits a configuration load only when it is news."""
        for line in settings.missing_named_files():  # `gateway check` and `policy show` refuse these
            log.warning("%s; running without it (built-in defaults for rules, built-in roles, no channel)",
                        line)
        checkpoint_schedule(settings)  # GATEWAY_AUDIT_CHECKPOINT_SECONDS: a bad one stops the start here
        registry = build_registry(destructive=settings.enable_destructive, read_only=settings.read_only,
                                  allow_write=settings.allow_write)
        backends = open_backends(settings)
        if cli:  # a shell that names no notifications file of its own tells humans through the server's
            settings = reloads.with_servers_notifications(settings, backends.reader)
        trail = AuditTrail(backends.audit, settings.audit_log)
        forward_to_syslog(trail, settings.syslog_file)  # syslog.yaml: every row from here on
        # every configuration load is an audit row (gateway.server.base.reloads), through the gateway's
        # own audit path once it exists; targets.yaml is read before, straight into the sink
        targets = reloads.load_audited(
            "targets", settings.targets_file,
            lambda: load_targets(settings.targets_file,
                                 settings.credentials if credentials_required else None),
            reloads.targets_summary, reloads.unless_audited(backends.reader, trail.write_quietly, cli))
        built: list[Gateway] = []  # the hooks below run once the gateway exists (names.watch loads)
        policy = PolicyStore(settings.rules_file,
                             on_reload=lambda load: built[0].config_row(reloads.rules_row(load)))
        # a roles.yaml load the audit cannot record does not apply (RoleBook keeps the roles before)
        role_rows = reloads.RolesReloads(settings.roles_file,
                                         lambda row: built[0].config_row(row, strict=True))
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
            trail=trail,
            quiet_loads=cli,
        )
        built.append(gateway)
        if trail.forwarder is not None:
            gateway.metrics.add_collector("syslog", trail.forwarder.families)
        names.watch(policy, roles, targets, tool_categories())  # a name matching nothing: WARNING
        return gateway

    async def start(self) -> None:
        await self.start_notifier()
        await asyncio.to_thread(self.moves.settle_interrupted)
        await asyncio.to_thread(self.moves.recover_outcome_rows)
        self.moves.start_sweeper()
        self.mirrors.start_eager()
        self.start_checkpoints()

    def start_checkpoints(self) -> None:
        """Sign the audit chain's head every GATEWAY_AUDIT_CHECKPOINT_SECONDS, rows or none
        (``audit_trail.start_checkpoints``); stopped by ``close``."""
        if self.checkpoint_timer is None:
            self.checkpoint_timer = start_checkpoints(self.audit, checkpoint_schedule(self.settings))

    async def start_notifier(self) -> None:
        """Begin telling humans about lifecycle events (channels loaded when the gateway was built)."""
        if self.notifier is not None:
            await self.notifier.start()

    async def close(self) -> None:
        self.draining = True
        if self.notifier is not None:
            await self.notifier.close()
        await self.moves.stop_sweeper()
        await self.path.gate.busy.flush()
        await asyncio.to_thread(self.trail.flush_waiting)
        await asyncio.to_thread(self.trail.stop_forwarding)
        if self.checkpoint_timer is not None:  # before the sink's own closing checkpoint
            await asyncio.to_thread(self.checkpoint_timer.stop)
        await asyncio.to_thread(self.mirrors.close)
        await asyncio.to_thread(self.scheduler.close)
        if self.identity is not None:
            await asyncio.to_thread(self.identity.close)
        await asyncio.to_thread(self.backends.close)

    def trail_write(self, row: Mapping[str, Any]) -> None:
        """An identity provider's caller, first seen (``gateway.identity.service``); blocking."""
        self.trail.write_or_wait(row)
    def reload_files(self) -> None:
        """Re-read rules.yaml and roles.yaml now (SIGHUP, server/edge/sighup.py); each new content is a
        ``config_reload`` row through the same hooks as a change noticed by a call. Blocking."""
        self.policy.snapshot()
        self.roles.refresh()

    def config_row(self, row: Mapping[str, Any], *, strict: bool = False) -> None:
        """Audit one configuration load (``gateway.server.base.reloads``); it waits in memory while the audit
        cannot take it, or with ``strict`` raises ``AuditUnavailable`` (the load must not apply).
        Blocking: the stores call it from the thread that read the file."""
        write = self.trail.write_now if strict else self.trail.write_or_wait
        reloads.unless_audited(self.backends.reader, write, self.quiet_loads)(dict(row))

    def audit_reader(self) -> AuditReader:
        """The audit log's reader (the engine's: file or table), for the proof endpoints."""
        return self.backends.reader

    def audit_refusal(self, row: Mapping[str, Any]) -> None:
        """Audit a refused read of the audit (blocking; it waits in memory when the log cannot take it)."""
        self.trail.write_or_wait(row)

    def readiness_detail(self) -> dict[str, Any]:
        """What /readyz adds for a caller with the /metrics right (blocking: reads the rules)."""
        return {"rules": self.policy.state()}

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
        if self.policy.snapshot()[0] is None:  # rules.yaml unusable (at start or by an edit): all refused
            reasons.append("no usable rules file (`gateway check` shows why)")
        return reasons

