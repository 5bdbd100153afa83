"""The dashboard's own families (gateway/server/base/ops_metrics.py), over the real file sink and trail.

Caller labels stay bounded whatever the rows say: a token's name for the first ``MAX_CALLERS`` names,
``idp`` for identity-provider callers, ``gateway`` for the gateway's own moves, ``other`` beyond; the
append timer counts appended and refused rows; the signing key's and the certificate's dates read from
their files."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import Metric

from gateway.audit.file_sink import AuditSink
from gateway.errors import AuditUnavailable
from gateway.server.base.audit_trail import MAX_WAITING_OUTCOMES, AuditTrail
from gateway.server.base.metrics import Metrics
from gateway.server.base.ops_metrics import (
    IDP,
    MAX_CALLERS,
    OTHER,
    AppendTimer,
    CallerCounts,
    GroupedAppendTimer,
    certificate_collector,
    error_codes,
    gateway_metrics,
    signing_key_families,
    timed_sink,
    trail_families,
)
from gateway.server.edge.tls import create_certificate


def samples(families: list[Metric], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """``name``'s samples (the family's own, or a histogram's ``_count``) keyed by their sorted labels."""
    return {tuple(sorted(s.labels.items())): s.value for f in families for s in f.samples if s.name == name}


def row(caller: str, *, key: str | None = None, phase: str = "call", **fields: Any) -> dict[str, Any]:
    made = {"phase": phase, "tool": "list_vms", "caller": caller, "role": "reader", **fields}
    if key is not None:
        made["caller_key"] = key
    return made


def counts() -> CallerCounts:
    return CallerCounts(Metrics(targets=["vc1"], tools=["list_vms"]))


def test_token_callers_keep_their_names_up_to_the_bound_then_count_as_other() -> None:
    calls = counts()
    for n in range(MAX_CALLERS + 6):
        calls.observe(row(f"agent-{n}", key=f"token::id{n}"))
    calls.observe(row("agent-0", key="token::id0"))
    seen = samples(calls.families(), "gateway_caller_audit_rows_total")
    callers = {dict(labels)["caller"]: value for labels, value in seen.items()}
    assert len(callers) == MAX_CALLERS + 1 and callers[OTHER] == 6 and callers["agent-0"] == 2


def test_identity_provider_and_gateway_callers_never_show_their_names() -> None:
    calls = counts()
    calls.observe(row("mallory'\n{x=\"1\"}", key="person:https%3A%2F%2Fidp.example:sub-1"))
    calls.observe(row("ci-bot", key="client:https%3A%2F%2Fidp.example:bot"))
    calls.observe(row("gateway", key="system::gateway", phase="expired"))
    calls.observe(row("agent-a", key="token::id1"))
    # a busy burst's row names no key: a token name already seen keeps its label, any other is "other"
    calls.observe({"phase": "busy", "caller": "agent-a", "role": "reader", "count": 5, "error_code": "busy"})
    calls.observe({"phase": "busy", "caller": "made-up", "role": "reader", "count": 2, "error_code": "busy"})
    seen = samples(calls.families(), "gateway_caller_audit_rows_total")
    assert {dict(k)["caller"] for k in seen} == {IDP, "gateway", "agent-a", OTHER}
    assert seen[(("caller", "agent-a"), ("phase", "busy"), ("role", "reader"))] == 5
    refusals = samples(calls.families(), "gateway_caller_refusals_total")
    assert refusals == {(("caller", "agent-a"), ("code", "busy"), ("role", "reader")): 5.0,
                        (("caller", OTHER), ("code", "busy"), ("role", "reader")): 2.0}


def test_phases_and_codes_outside_the_fixed_sets_count_as_other_and_rows_of_no_call_not_at_all() -> None:
    calls = counts()
    calls.observe(row("agent-a", key="token::id1", phase="denied", error_code="policy_denied"))
    calls.observe(row("agent-a", key="token::id1", phase="made-up", error_code="made-up"))
    calls.observe({"phase": "config_reload", "file": "rules", "caller": "gateway"})  # no tool: no call
    calls.observe({"phase": "token_created", "caller": "ops"})
    families = calls.families()
    phases = {dict(k)["phase"]: v for k, v in samples(families, "gateway_caller_audit_rows_total").items()}
    codes = {dict(k)["code"]: v for k, v in samples(families, "gateway_caller_refusals_total").items()}
    assert phases == {"denied": 1.0, OTHER: 1.0} and codes == {"policy_denied": 1.0, OTHER: 1.0}
    assert {"policy_denied", "rate_limited", "busy", "audit_unavailable"} <= error_codes()


def test_call_time_per_target_comes_from_the_rows_of_calls_that_ran() -> None:
    calls = counts()
    calls.observe(row("agent-a", key="token::id1", target="vc1", duration_ms=1500.0))
    calls.observe(row("agent-a", key="token::id1", phase="executed", target="vc1", duration_ms=20.0))
    calls.observe(row("agent-a", key="token::id1", target="not-configured", duration_ms=5.0))
    calls.observe(row("agent-a", key="token::id1", phase="denied", target="vc1", duration_ms=1.0))
    families = calls.families()
    count = samples(families, "gateway_target_call_duration_seconds_count")
    assert count == {(("target", "vc1"),): 2.0, (("target", "unknown"),): 1.0}
    assert samples(families, "gateway_target_call_duration_seconds_sum")[(("target", "vc1"),)] == 1.52
    under_a_second = samples(families, "gateway_target_call_duration_seconds_bucket")
    assert under_a_second[(("le", "1.0"), ("target", "vc1"))] == 1.0


def test_the_append_timer_counts_appended_and_refused_rows(tmp_path: Path) -> None:
    sink = AuditSink(tmp_path / "audit.jsonl", durable=False)
    timer = timed_sink(sink)
    assert isinstance(timer, GroupedAppendTimer)  # the file sink groups reads' rows: still offered
    trail = AuditTrail(timer, sink.path)
    trail.write_row({"phase": "call", "tool": "list_vms"})
    timer.write_grouped({"phase": "call", "tool": "list_vms"})
    sink.close()
    with pytest.raises(AuditUnavailable):
        trail.write_row({"phase": "call", "tool": "list_vms"})
    assert samples(timer.families(), "gateway_audit_append_duration_seconds_count") == {
        (("outcome", "ok"),): 2.0, (("outcome", "failed"),): 1.0}
    assert len(sink.path.read_text().splitlines()) == 2


class PlainSink:
    """A sink with the bare ``AuditWriter`` methods (no grouped append), over the real file sink."""

    def __init__(self, sink: AuditSink) -> None:
        self.inner = sink

    def write(self, event: Any, *, timeout: float | None = None) -> dict[str, Any]:
        return self.inner.write(event, timeout=timeout)

    def writable(self) -> bool:
        return self.inner.writable()

    def close(self) -> None:
        self.inner.close()


def test_a_sink_without_a_grouped_append_gets_none(tmp_path: Path) -> None:
    timer = timed_sink(PlainSink(AuditSink(tmp_path / "audit.jsonl", durable=False)))
    assert type(timer) is AppendTimer and not hasattr(timer, "write_grouped")
    timer.close()


def test_the_trail_backlog_and_writable_probe(tmp_path: Path) -> None:
    sink = AuditSink(tmp_path / "audit.jsonl", durable=False)
    trail = AuditTrail(sink, sink.path)
    assert samples(trail_families(trail), "gateway_audit_writable") == {(): 1.0}
    sink.close()
    trail.write_or_wait({"phase": "executed", "tool": "power_on_vm"})  # waits: the sink is closed
    families = trail_families(trail)
    assert samples(families, "gateway_audit_writable") == {(): 0.0}
    assert samples(families, "gateway_audit_rows_waiting") == {(): 1.0}
    assert samples(families, "gateway_audit_rows_waiting_limit") == {(): float(MAX_WAITING_OUTCOMES)}


def test_the_signing_key_date_is_its_files_and_absent_before_it_exists(tmp_path: Path) -> None:
    key = tmp_path / "audit-signing.key"
    assert samples(signing_key_families(key), "gateway_audit_signing_key_written_timestamp_seconds") == {}
    key.write_bytes(b"k")
    os.utime(key, (1_700_000_000, 1_700_000_000))
    assert samples(signing_key_families(key), "gateway_audit_signing_key_written_timestamp_seconds") == {
        (): 1_700_000_000.0}
    assert samples(signing_key_families(None), "gateway_audit_signing_key_written_timestamp_seconds") == {}


def test_the_certificate_dates_are_the_served_certificates(tmp_path: Path) -> None:
    made = time.time()
    paths = create_certificate(tmp_path / "tls", ["localhost"], days=30)
    families = list(certificate_collector(paths.cert)())
    expiry = samples(families, "gateway_tls_certificate_expiry_timestamp_seconds")[()]
    start = samples(families, "gateway_tls_certificate_not_before_timestamp_seconds")[()]
    # create_certificate back-dates the start five minutes (clock skew) and adds the days to it
    assert expiry - start == 30 * 86400 and made - 300 - 2 <= start <= made - 300 + 2


def test_gateway_metrics_counts_every_row_the_trail_writes(tmp_path: Path) -> None:
    sink = AuditSink(tmp_path / "audit.jsonl", durable=False)
    trail = AuditTrail(sink, sink.path)
    metrics = gateway_metrics(targets=["vc1"], tools=["list_vms"], trail=trail, key_file=None)
    trail.write_row(row("agent-a", key="token::id1", target="vc1", duration_ms=3.0))
    text = metrics.render()
    assert 'gateway_caller_audit_rows_total{caller="agent-a",phase="call",role="reader"} 1.0' in text
    assert "gateway_audit_writable 1.0" in text and "gateway_audit_rows_waiting 0.0" in text
    sink.close()
