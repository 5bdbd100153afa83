"""``BusyAudit``: busy refusals counted per caller and target, one row per burst; past ``max_bursts``
callers, the rest are counted together as ``*`` (the table stays bounded)."""

from __future__ import annotations

import pytest
from support.server_parts import AGENT, READER, Parts

from gateway.server.call.busy_audit import BusyAudit

pytestmark = pytest.mark.anyio


async def test_a_burst_is_one_row_with_its_count_and_tools(parts: Parts) -> None:
    busy = BusyAudit(parts.trail, interval=3600)
    for tool in ("get_vm_details", "get_vm_details", "list_vms"):
        busy.record(parts.ctx(AGENT, tool), "vc1")
    busy.record(parts.ctx(READER, "list_vms"), "vc1")
    await busy.flush()
    rows = sorted(parts.rows(phase="busy"), key=lambda r: r["caller"])
    assert [(r["caller"], r["target"], r["count"], r["tools"], r["error_code"]) for r in rows] == [
        ("agent-1", "vc1", 3, ["get_vm_details", "list_vms"], "busy"),
        ("watcher", "vc1", 1, ["list_vms"], "busy"),
    ]


async def test_callers_past_the_bound_are_counted_together(parts: Parts) -> None:
    busy = BusyAudit(parts.trail, interval=3600, max_bursts=1)
    busy.record(parts.ctx(AGENT, "list_vms"), "vc1")
    busy.record(parts.ctx(READER, "list_vms"), "vc1")
    busy.record(parts.ctx(READER, "list_vms"), "vc1")
    await busy.flush()
    rows = sorted(parts.rows(phase="busy"), key=lambda r: r["caller"])
    assert [(r["caller"], r["count"]) for r in rows] == [("*", 2), ("agent-1", 1)]


async def test_a_flush_with_no_burst_writes_nothing(parts: Parts) -> None:
    await BusyAudit(parts.trail).flush()
    assert parts.rows() == []
