"""``compose_reads``: the reads over the mirrors and read rules built with them, sharing the gate; the
queues' samples in the metrics."""

from __future__ import annotations

from support.server_parts import Parts

from gateway.guard.limits import RateLimiter
from gateway.server.base.metrics import Metrics
from gateway.server.call.busy_audit import BusyAudit
from gateway.server.call.gate import Gate
from gateway.server.read_path import compose_reads
from gateway.vsphere.scheduler import Scheduler


def test_the_reads_share_the_gate_and_mirror_the_configured_targets(parts: Parts) -> None:
    gate = Gate(facts=parts.facts, trail=parts.trail, busy=BusyAudit(parts.trail), rate_limiter=RateLimiter(),
                dry_run=False)
    scheduler = Scheduler(list(parts.targets.values()), {}, queue_timeout=5.0)
    metrics = Metrics(targets=parts.targets)
    reading = compose_reads(parts.settings, parts.facts, gate=gate, trail=parts.trail, scheduler=scheduler,
                            metrics=metrics)
    try:
        assert reading.reads.gate is gate and reading.reads.mirrors is reading.mirrors
        assert reading.reads.read_rules is reading.read_rules
        # the queues' samples join the metrics
        assert 'gateway_target_starts_staggered_total{target="vc1"}' in metrics.render()
    finally:
        reading.mirrors.close()
        scheduler.close()
