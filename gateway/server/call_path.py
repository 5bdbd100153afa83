"""The call path of one process, composed in one place: the audit trail, the lifecycle moves, the gate,
the calls, reads, writes and the proposal flow, each handed the collaborators it needs
(``compose_call_path``)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.backends import Backends
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.facts import FactsNow
from gateway.server.base.metrics import Metrics, queue_families, sample_families
from gateway.server.base.moves import Moves
from gateway.server.call.arrival import Calls
from gateway.server.call.gate import Gate
from gateway.server.call.idempotency import Idempotency
from gateway.server.call.read_rules import ReadRules
from gateway.server.call.reads import Reads
from gateway.server.call.writes import Writes
from gateway.server.proposals.flow import ProposalFlow
from gateway.settings import Settings
from gateway.tools.read import MIRROR_READS
from gateway.vsphere.mirror import Mirrors
from gateway.vsphere.scheduler import Scheduler


@dataclass
class CallPath:
    """The collaborators of every call, confirmation, approval and move."""

    trail: AuditTrail
    moves: Moves
    gate: Gate
    calls: Calls
    reads: Reads
    writes: Writes
    proposals: ProposalFlow
    mirrors: Mirrors
    read_rules: ReadRules


def compose_call_path(settings: Settings, facts: FactsNow, *, scheduler: Scheduler, backends: Backends,
                      metrics: Metrics, trail: AuditTrail | None = None) -> CallPath:
    """Wire the call path once: who writes rows, who moves proposals, who gates, reads, writes, proposes
    (over the configured targets, ``facts.targets``)."""
    mirrors = Mirrors(list(facts.targets.values()), settings.credentials, MIRROR_READS)
    list_vms = facts.registry.get("list_vms")
    assert list_vms is not None and list_vms.read is not None
    #: what each read may show (read rules), applied after the mirror or the sweep answered
    read_rules = ReadRules(mirrors, scheduler, facts.targets, list_vms.read)
    metrics.add_collector("mirrors", lambda: sample_families(mirrors.samples()))
    metrics.add_collector("queues", lambda: queue_families(scheduler.queue_stats()))
    trail = trail or AuditTrail(backends.audit, settings.audit_log)
    moves = Moves(backends.store, trail, facts.registry, facts, instance=backends.instance,
                  reader=backends.reader, sweep_leader=backends.sweep_leader, clock=facts.clock)
    gate = Gate(facts.targets, facts=facts, trail=trail, rate_limiter=backends.rate_limiter,
                dry_run=settings.dry_run, breaker=backends.breaker)
    calls = Calls(gate, metrics=metrics)
    reads = Reads(gate, scheduler=scheduler, mirrors=mirrors, read_rules=read_rules,
                  fanout_timeout=settings.fanout_timeout_seconds)
    writes = Writes(gate, scheduler=scheduler, moves=moves, breaker=backends.breaker)
    proposals = ProposalFlow(facts.targets, writes=writes, moves=moves,
                             confirm_ttl_seconds=settings.confirm_ttl_seconds)
    writes.proposer = proposals
    calls.route(read=reads.read, write=writes.write,
                local={"list_targets": reads.list_targets, **proposals.handlers()})
    calls.around = Idempotency(backends.keys, trail, backends.instance,
                               window=settings.idempotency_window_seconds).wrap
    return CallPath(trail, moves, gate, calls, reads, writes, proposals, mirrors, read_rules)
