"""The call path of one process, built in one place (``compose_call_path``).

Each part is handed what it needs when it is made; nothing is wired in afterwards."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.backends import Backends
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.facts import FactsNow
from gateway.server.base.metrics import Metrics
from gateway.server.base.moves import LifecycleListener, Moves
from gateway.server.call.arrival import Calls
from gateway.server.call.busy_audit import BusyAudit
from gateway.server.call.execution import Execution
from gateway.server.call.gate import Gate
from gateway.server.call.idempotency import Idempotency
from gateway.server.call.writes import Writes
from gateway.server.proposal_path import ProposalPath, compose_proposals
from gateway.server.read_path import ReadPath, compose_reads
from gateway.settings import Settings
from gateway.vsphere.scheduler import Scheduler


@dataclass(frozen=True)
class CallPath:
    """The collaborators of every call, confirmation, approval and move."""

    trail: AuditTrail
    moves: Moves
    busy: BusyAudit
    gate: Gate
    calls: Calls
    reading: ReadPath
    writes: Writes
    proposing: ProposalPath


def compose_call_path(settings: Settings, facts: FactsNow, *, scheduler: Scheduler, backends: Backends,
                      metrics: Metrics, trail: AuditTrail,
                      listeners: Sequence[LifecycleListener] = ()) -> CallPath:
    """Build the call path once over ``facts.targets``, each part after the parts it is handed;
    ``listeners`` are told of every proposal move."""
    moves = Moves(backends.store, trail, facts.registry, facts, instance=backends.instance,
                  reader=backends.reader, sweep_leader=backends.sweep_leader, clock=facts.clock,
                  listeners=listeners)
    busy = BusyAudit(trail)
    gate = Gate(facts=facts, trail=trail, busy=busy, rate_limiter=backends.rate_limiter,
                dry_run=settings.dry_run, breaker=backends.breaker)
    reading = compose_reads(settings, facts, gate=gate, trail=trail, scheduler=scheduler, metrics=metrics)
    execution = Execution(trail=trail, scheduler=scheduler, moves=moves)
    proposing = compose_proposals(settings, facts, gate=gate, trail=trail, moves=moves, store=backends.store,
                                  execution=execution, placeholder=backends.engine.placeholder)
    writes = Writes(facts.targets, gate=gate, breaker=backends.breaker, execution=execution,
                    proposer=proposing.flow)
    keys = Idempotency(backends.keys, trail, backends.instance, window=settings.idempotency_window_seconds)
    calls = Calls(facts.targets, facts=facts, gate=gate, metrics=metrics, read=reading.reads.read,
                  write=writes.write, around=keys.wrap,
                  local={"list_targets": reading.reads.list_targets, **proposing.flow.handlers()})
    return CallPath(trail, moves, busy, gate, calls, reading, writes, proposing)
