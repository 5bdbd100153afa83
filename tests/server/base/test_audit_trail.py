"""The audit trail's one "row was written" hook (server.base.audit_trail.AuditTrail.written): every row
the sink took, as stamped, reaches the listeners; a row the sink refused does not; a failing listener
never fails the row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.audit.file_sink import AuditSink
from gateway.errors import AuditUnavailable
from gateway.server.base.audit_trail import AuditTrail


def test_every_written_row_reaches_the_listeners_as_stamped(tmp_path: Path) -> None:
    sink = AuditSink(tmp_path / "audit.jsonl", durable=False)
    trail = AuditTrail(sink, sink.path)
    seen: list[dict[str, Any]] = []
    trail.written.append(lambda row: seen.append(dict(row)))
    trail.written.insert(0, lambda _row: 1 / 0)  # a broken listener: logged, the row stands
    trail.write_row({"phase": "call", "tool": "list_vms"})
    trail.write_or_wait({"phase": "executed", "tool": "power_on"})
    trail.write_quietly({"phase": "config_reload", "path": "targets.yaml"})
    assert [(r["seq"], r["phase"]) for r in seen] == [(1, "call"), (2, "executed"), (3, "config_reload")]
    assert all(isinstance(r["hash"], str) and "prev" in r for r in seen)
    sink.close()
    with pytest.raises(AuditUnavailable):
        trail.write_row({"phase": "call"})
    assert len(seen) == 3, "a row the sink refused is not reported as written"
