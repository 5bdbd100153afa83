"""The reads of one process, built in one place (``compose_reads``): mirrors, read rules, ``Reads``."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.facts import FactsNow
from gateway.server.base.metrics import Metrics, queue_families, sample_families
from gateway.server.call.gate import Gate
from gateway.server.call.read_rules import ReadRules
from gateway.server.call.reads import Reads
from gateway.settings import Settings
from gateway.tools.read import MIRROR_READS
from gateway.vsphere.mirror import Mirrors
from gateway.vsphere.scheduler import Scheduler


@dataclass(frozen=True)
class ReadPath:
    """What answers reads: ``Reads`` over the mirrors, what each read may show (the read rules)."""

    reads: Reads
    mirrors: Mirrors
    read_rules: ReadRules


def compose_reads(settings: Settings, facts: FactsNow, *, gate: Gate, trail: AuditTrail, scheduler: Scheduler,
                  metrics: Metrics) -> ReadPath:
    """Build the reads over ``facts.targets``; the mirrors' and the queues' samples join ``metrics``."""
    mirrors = Mirrors(list(facts.targets.values()), settings.credentials, MIRROR_READS)
    list_vms = facts.registry.get("list_vms")
    assert list_vms is not None and list_vms.read is not None
    read_rules = ReadRules(mirrors, scheduler, facts.targets, list_vms.read)
    metrics.add_collector("mirrors", lambda: sample_families(mirrors.samples()))
    metrics.add_collector("queues", lambda: queue_families(scheduler.queue_stats()))
    reads = Reads(gate=gate, facts=facts, trail=trail, scheduler=scheduler, mirrors=mirrors,
                  read_rules=read_rules, fanout_timeout=settings.fanout_timeout_seconds)
    return ReadPath(reads, mirrors, read_rules)
