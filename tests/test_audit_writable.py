"""With the audit unable to take rows (what /readyz reports), a change is refused before its first vSphere
read: a relay in front of the simulator counts zero connections and zero bytes (issue 24)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from httpserver import build_gateway
from simulator import CountingRelay, MakeSimulator

from gateway.auth.tokens import Principal
from gateway.errors import AuditUnavailable

ADMIN = Principal(name="agent-a", role="admin", surface="test")
VM = "DC0_C0_RP0_VM0"
CHANGES = [
    ("power_off_vm", {"vm": VM, "guest_timeout_seconds": 0}),
    ("delete_vm", {"vm": VM, "force_power_off": True}),
    ("remove_disk", {"vm": VM, "disk": "Hard disk 9"}),
]


def _break_the_log(tmp: Path) -> None:
    log = tmp / "audit.jsonl"
    log.unlink(missing_ok=True)
    log.mkdir()  # a directory where the log should be: not writable, even as root


@pytest.mark.parametrize(("tool", "args"), CHANGES, ids=[c[0] for c in CHANGES])
def test_an_unwritable_audit_refuses_a_change_before_any_vsphere_call(
    make_simulator: MakeSimulator, tmp_path: Path, tool: str, args: dict[str, Any]
) -> None:
    sim = make_simulator()
    relay = CountingRelay(sim.host, sim.port)
    gateway = build_gateway(tmp_path, sim, target={"port": relay.port})
    _break_the_log(tmp_path)

    async def scenario() -> None:
        try:
            assert "audit log not writable" in gateway.readiness()
            with pytest.raises(AuditUnavailable) as refused:
                await gateway.call(ADMIN, tool, {"target": "vc1", **args})
            assert (relay.connections, relay.bytes_sent) == (0, 0), "the refused change reached vSphere"
            assert "nothing was read from or sent to vSphere" in refused.value.message
            (row,) = list(gateway.trail.waiting)
            assert row["phase"] == "refused" and row["tool"] == tool
            assert row["error_code"] == "audit_unavailable"
            # the relay is on the path: with the log back, the same gateway reaches vSphere through it
            (tmp_path / "audit.jsonl").rmdir()
            await gateway.call(ADMIN, "list_vms", {"target": "vc1"})
            assert relay.bytes_sent > 0
        finally:
            await gateway.close()
            relay.close()

    anyio.run(scenario)


def test_an_unwritable_audit_refuses_a_confirm_before_any_vsphere_call(
    make_simulator: MakeSimulator, tmp_path: Path
) -> None:
    sim = make_simulator()
    relay = CountingRelay(sim.host, sim.port)
    gateway = build_gateway(tmp_path, sim, target={"port": relay.port})

    async def scenario() -> None:
        try:
            args = {"target": "vc1", "vm": VM, "force_power_off": True}
            proposal = await gateway.call(ADMIN, "delete_vm", args)
            _break_the_log(tmp_path)
            before = relay.bytes_sent
            with pytest.raises(AuditUnavailable) as refused:
                await gateway.call(ADMIN, "confirm_action", {"token": proposal["token"]})
            assert relay.bytes_sent == before, "the refused confirm reached vSphere"
            assert "nothing was read from or sent to vSphere" in refused.value.message
            found = gateway.store.get_proposal(proposal["proposal_id"])
            assert found is not None and found.state == "pending"
        finally:
            await gateway.close()
            relay.close()

    anyio.run(scenario)
