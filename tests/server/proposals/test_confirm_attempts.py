"""Every confirm attempt is one audit row (won, lost, stale, invalid, expired), a confirm takes its
compare-and-set before it writes ``executing``, and a confirm whose snapshot vanished meanwhile settles
the proposal as ``stale`` (issue 24). Real gateway, real simulator, the file audit and SQLite."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.httpserver import audit_rows, build_gateway
from support.simulator import MakeSimulator, find_vm, pyvmomi_connect, read_properties, wait_until

from gateway.auth.tokens import Principal
from gateway.errors import ConfirmationExpired, ConfirmationInvalid, GatewayError, Stale

ADMIN = Principal(name="agent-a", role="admin", surface="test")
OTHER = Principal(name="agent-b", role="admin", surface="test")
VM = "DC0_C0_RP0_VM0"
#: rows of the proposal that are not some attempt's: its proposal and the winner's outcome
NOT_ATTEMPTS = ("proposed", "executed")


def _attempt_rows(gateway: Any, proposal_id: str) -> list[dict[str, Any]]:
    return [r for r in audit_rows(gateway) if r.get("proposal_id") == proposal_id
            and r["phase"] not in NOT_ATTEMPTS]


def test_eight_racing_confirms_write_one_executing_row_and_one_row_per_loser(
    make_simulator: MakeSimulator, tmp_path: Path
) -> None:
    gateway = build_gateway(tmp_path, make_simulator())
    outcomes: list[str] = []

    async def scenario() -> dict[str, Any]:
        args = {"target": "vc1", "vm": VM, "force_power_off": True}
        proposal = await gateway.calls.call(ADMIN, "delete_vm", args)

        async def confirm() -> None:
            try:
                await gateway.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
                outcomes.append("executed")
            except GatewayError as exc:
                outcomes.append(exc.code)

        try:
            async with anyio.create_task_group() as group:
                for _ in range(8):
                    group.start_soon(confirm)
            return proposal
        finally:
            await gateway.close()

    proposal = anyio.run(scenario)
    assert outcomes.count("executed") == 1, outcomes
    attempts = _attempt_rows(gateway, proposal["proposal_id"])
    phases = Counter(r["phase"] for r in attempts)
    assert phases["executing"] == 1, phases
    assert len(attempts) == 8, phases  # one row per attempt: the winner's intent, one per loser
    assert all(r.get("error_code") for r in attempts if r["phase"] != "executing"), attempts


def test_a_confirm_whose_snapshot_was_deleted_meanwhile_is_audited_and_settles_the_proposal(
    make_simulator: MakeSimulator, tmp_path: Path
) -> None:
    sim = make_simulator()
    si = pyvmomi_connect(sim)
    find_vm(si, VM).CreateSnapshot_Task(name="gone-soon", description="", memory=False, quiesce=False)
    wait_until(lambda: find_vm(si, VM).snapshot is not None, what="snapshot taken")
    gateway = build_gateway(tmp_path, sim)

    async def scenario() -> tuple[dict[str, Any], BaseException, str | None]:
        try:
            proposal = await gateway.calls.call(ADMIN, "delete_snapshot", {"target": "vc1", "vm": VM,
                                                                     "snapshot": "gone-soon"})
            find_vm(si, VM).snapshot.rootSnapshotList[0].snapshot.RemoveSnapshot_Task(removeChildren=False)
            wait_until(lambda: "snapshot" not in read_properties(si, find_vm(si, VM), "snapshot"),
                       what="snapshot deleted")
            with pytest.raises(GatewayError) as caught:
                await gateway.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
            settled = gateway.store.get_proposal(proposal["proposal_id"])
            return proposal, caught.value, settled.state if settled else None
        finally:
            await gateway.close()

    proposal, error, state = anyio.run(scenario)
    assert isinstance(error, Stale), f"{error.code}: {error}"  # type: ignore[attr-defined]
    assert state == "stale"
    (row,) = _attempt_rows(gateway, proposal["proposal_id"])
    assert row["phase"] == "stale" and row["caller"] == ADMIN.name and row["error_code"] == "stale"


def test_refused_confirms_each_write_one_row(make_simulator: MakeSimulator, tmp_path: Path) -> None:
    """Another caller's, an expired one, and one after the proposal ran: one row each."""
    gateway = build_gateway(tmp_path, make_simulator())

    async def scenario() -> tuple[str, str]:
        try:
            ran = await gateway.calls.call(ADMIN, "delete_vm",
                                           {"target": "vc1", "vm": VM, "force_power_off": True})
            with pytest.raises(ConfirmationInvalid):
                await gateway.calls.call(OTHER, "confirm_action", {"token": ran["token"]})
            await gateway.calls.call(ADMIN, "confirm_action", {"token": ran["token"]})
            with pytest.raises(ConfirmationInvalid):
                await gateway.calls.call(ADMIN, "confirm_action", {"token": ran["token"]})
            late = await gateway.calls.call(ADMIN, "delete_vm", {"target": "vc1", "vm": "DC0_C0_RP0_VM1",
                                                           "force_power_off": True})
            gateway.clock = lambda: 10**10
            with pytest.raises(ConfirmationExpired):
                await gateway.calls.call(ADMIN, "confirm_action", {"token": late["token"]})
            return ran["proposal_id"], late["proposal_id"]
        finally:
            await gateway.close()

    ran, late = anyio.run(scenario)
    assert [r["phase"] for r in _attempt_rows(gateway, ran)] == ["denied", "executing", "denied"]
    assert [r["phase"] for r in _attempt_rows(gateway, late)] == ["denied"]


def test_a_claim_whose_intent_cannot_be_written_ends_failed_with_nothing_sent(
    make_simulator: MakeSimulator, tmp_path: Path
) -> None:
    """The compare-and-set comes first, so a claim that then cannot write its intent (another process
    holds the audit lock past the deadline) is settled ``failed``: never left ``executing``, never run."""
    import fcntl
    import os

    sim = make_simulator()
    gateway = build_gateway(tmp_path, sim)

    async def scenario() -> tuple[str, str | None, int]:
        try:
            args = {"target": "vc1", "vm": VM, "force_power_off": True}
            proposal = await gateway.calls.call(ADMIN, "delete_vm", args)
            lock = os.open(f"{gateway.settings.audit_log}.lock", os.O_RDWR)
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with pytest.raises(GatewayError) as caught:
                    await gateway.calls.call(ADMIN, "confirm_action", {"token": proposal["token"]})
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
                os.close(lock)
            found = gateway.store.get_proposal(proposal["proposal_id"])
            return caught.value.code, found.state if found else None, gateway.trail.flush_waiting()
        finally:
            await gateway.close()

    code, state, flushed = anyio.run(scenario)
    assert (code, state) == ("audit_unavailable", "failed")
    si = pyvmomi_connect(sim)
    find_vm(si, VM)  # still there: nothing was sent
    assert flushed == 2
    phases = [r["phase"] for r in audit_rows(gateway) if r.get("delayed")]
    assert phases == ["refused", "failed"]


def test_racing_cancels_write_one_row_each(make_simulator: MakeSimulator, tmp_path: Path) -> None:
    gateway = build_gateway(tmp_path, make_simulator())
    outcomes: list[str] = []

    async def scenario() -> str:
        try:
            args = {"target": "vc1", "vm": VM, "force_power_off": True}
            proposal = await gateway.calls.call(ADMIN, "delete_vm", args)

            async def cancel() -> None:
                try:
                    await gateway.calls.call(ADMIN, "cancel_action", {"token": proposal["token"]})
                    outcomes.append("cancelled")
                except GatewayError as exc:
                    outcomes.append(exc.code)

            async with anyio.create_task_group() as group:
                for _ in range(4):
                    group.start_soon(cancel)
            return str(proposal["proposal_id"])
        finally:
            await gateway.close()

    pid = anyio.run(scenario)
    assert sorted(outcomes) == ["cancelled"] + ["confirmation_invalid"] * 3
    phases = [r["phase"] for r in _attempt_rows(gateway, pid)]
    assert phases.count("cancelled") == 1 and len(phases) == 4, phases
