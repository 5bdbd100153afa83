"""The composition root of one gateway process (``Gateway.build``).

The backends are opened once, the configuration loaded, and every part built after the parts it is
handed. How a call flows through them: docs/architecture.md."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.auth.roles import RoleBook
from gateway.auth.tokens import TokenVerifier
from gateway.backends import AuditReader, Backends, open_backends
from gateway.config import Target, load_targets
from gateway.errors import ConfigError
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
from gateway.server.base.ops_metrics import gateway_metrics, timed_sink
from gateway.server.call_path import compose_call_path
from gateway.settings import Settings
from gateway.tools.registry import Registry, build_registry, tool_categories
from gateway.vsphere.scheduler import Scheduler

log = logging.getLogger(__name__)


class Gateway:
    """One gateway process: its parts, composed once; the surfaces call the part whose job it is
    (``calls``, ``proposals``, ``actions``, ``moves``, ``facts``, ``trail``)."""

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
        trail: AuditTrail,
        config_rows: reloads.ConfigRows,
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
        self.trail = trail
        #: writes the row of every configuration load (``reloads.ConfigRows``)
        self.config_rows = config_rows
        self.clock = clock
        self.draining = False
        #: signs the audit chain's head on schedule while serving (``start``/``close``)
        self.checkpoint_timer: ScheduledCheckpoints | None = None
        now = lambda: self.clock()  # noqa: E731 (the tests set ``clock`` after building)
        self.authenticator = TokenVerifier(backends.store)
        # the call path's families, and those read off the trail's rows, its backlog and the signing key
        self.metrics = gateway_metrics(targets=self.targets, tools=[spec.name for spec in registry],
                                       trail=trail, key_file=getattr(backends.audit, "key_file", None))
        self.facts = FactsNow(registry, self.targets, policy, roles, backends.store, now)
        # identity.yaml: identity providers' tokens besides gateway tokens (None without the file)
        self.identity = reloads.load_identity(settings.identity_file, trail.write_or_wait, config_rows.write)
        # notifications.yaml: loaded (ConfigError on a bad file), told of every move, delivering from start()
        self.notifier = _load_notifier(settings, trail, config_rows)
        if self.notifier is not None:
            publisher = getattr(self.audit, "publisher", None)  # each signed checkpoint also to the webhooks
            if publisher is not None:
                publisher.listeners.append(self.notifier.on_checkpoint)
        self.path = compose_call_path(settings, self.facts, scheduler=scheduler, backends=backends,
                                      metrics=self.metrics, trail=trail,
                                      listeners=[self.notifier.on_event] if self.notifier else [])
        self.moves, self.calls = self.path.moves, self.path.calls
        self.proposals, self.actions = self.path.proposing.flow, self.path.proposing.actions
        self.rounds = self.path.proposing.rounds
        self.mirrors, self.read_rules = self.path.reading.mirrors, self.path.reading.read_rules

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
        appends = timed_sink(backends.audit)  # each append timed (gateway_audit_append_duration_seconds)
        trail = AuditTrail(appends, settings.audit_log)
        forward_to_syslog(trail, settings.syslog_file)  # syslog.yaml: every row from here on
        # every configuration load is an audit row (gateway.server.base.reloads); targets.yaml is read
        # first, its row straight into the sink
        targets = reloads.load_audited(
            "targets", settings.targets_file,
            lambda: load_targets(settings.targets_file,
                                 settings.credentials if credentials_required else None),
            reloads.targets_summary, reloads.unless_audited(backends.reader, trail.write_quietly, cli))
        config_rows = reloads.ConfigRows(trail, backends.reader, quiet=cli)
        # a roles.yaml load the audit cannot record does not apply (RoleBook keeps the roles before)
        role_rows = reloads.RolesReloads(settings.roles_file, lambda row: config_rows.write(row, strict=True))
        tools = tool_categories()  # a name in rules.yaml or roles.yaml matching nothing: a WARNING
        roles = RoleBook(settings.roles_file, on_reload=role_rows.loaded, on_refused=role_rows.refused,
                         on_refs=names.roles_watcher(targets, tools))
        policy = PolicyStore(settings.rules_file, on_load=names.rules_watcher(roles, targets, tools),
                             on_reload=lambda load: config_rows.write(reloads.rules_row(load)))
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
            config_rows=config_rows,
        )
        gateway.metrics.add_collector("audit_appends", appends.families)
        if trail.forwarder is not None:
            gateway.metrics.add_collector("syslog", trail.forwarder.families)
        with contextlib.suppress(ConfigError):  # the rules are read now; roles.yaml on its first lookup
            policy.current()
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
        await self.path.busy.flush()
        await asyncio.to_thread(self.trail.flush_waiting)
        await asyncio.to_thread(self.trail.stop_forwarding)
        if self.checkpoint_timer is not None:  # before the sink's own closing checkpoint
            await asyncio.to_thread(self.checkpoint_timer.stop)
        await asyncio.to_thread(self.mirrors.close)
        await asyncio.to_thread(self.scheduler.close)
        if self.identity is not None:
            await asyncio.to_thread(self.identity.close)
        await asyncio.to_thread(self.backends.close)

    def reload_files(self) -> None:
        """Re-read rules.yaml and roles.yaml now (SIGHUP, server/edge/sighup.py); each new content is a
        ``config_reload`` row through the same hooks as a change noticed by a call. Blocking."""
        self.policy.snapshot()
        self.roles.refresh()

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



def _load_notifier(settings: Settings, trail: AuditTrail, config_rows: reloads.ConfigRows) -> Notifier | None:
    """notifications.yaml's channels (ConfigError on a bad file), the load audited; None without a file.
    Its own rows go through the trail, so they are forwarded too."""
    path = settings.notifications_file
    if path is None:
        return None
    return reloads.load_audited(
        "notifications", path, lambda: notifier_for(path, settings.notify_env, trail.write_row),
        lambda n: {"channels": {c.name: c.kind for c in n.config.channels}}, config_rows.write)
