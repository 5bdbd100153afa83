"""The two-phase confirmation rules: tokens, digests, the confirmable table, expiry sweeps."""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import ApprovalRequired, ConfirmationExpired, ConfirmationInvalid, Forbidden, GatewayError
from gateway.guard import confirm
from gateway.store import Proposal, SqliteStore


def make(**kw: Any) -> Proposal:
    values: dict[str, Any] = {
        "id": confirm.new_proposal_id(), "token_hash": confirm.token_hash(confirm.new_confirmation_token()),
        "caller": "agent-1", "role": "admin", "surface": "https", "target": "vc1", "target_host": "vc1:443",
        "tool": "delete_vm", "args": {"vm": "web-01"}, "args_digest": "0" * 64,
        "plan_summary": "delete web-01", "affected": [], "plan_params": {}, "created_at": 100.0,
        "expires_at": 220.0,
    }
    values.update(kw)
    return Proposal(**values)


def test_confirmation_tokens_are_long_random_and_url_safe() -> None:
    tokens = {confirm.new_confirmation_token() for _ in range(200)}
    assert len(tokens) == 200
    for token in tokens:
        assert re.fullmatch(r"gwc_[A-Za-z0-9_-]{32}", token)  # 24 random bytes = 192 bits


def test_token_hash_is_sha256_hex_and_never_the_token() -> None:
    token = confirm.new_confirmation_token()
    digest = confirm.token_hash(token)
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert digest == confirm.token_hash(token) != confirm.token_hash(token + "x")
    assert token not in digest


def test_proposal_ids_are_short_and_safe_on_a_command_line() -> None:
    for _ in range(100):
        assert re.fullmatch(r"[a-z0-9]{12}", confirm.new_proposal_id())


def test_args_digest_is_canonical_and_binds_tool_target_and_args() -> None:
    base = confirm.args_digest("delete_vm", "vc1", {"vm": "web-01", "force": True})
    assert base == confirm.args_digest("delete_vm", "vc1", {"force": True, "vm": "web-01"})
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    others = {
        confirm.args_digest("delete_vm", "vc2", {"vm": "web-01", "force": True}),
        confirm.args_digest("unregister_vm", "vc1", {"vm": "web-01", "force": True}),
        confirm.args_digest("delete_vm", "vc1", {"vm": "web-02", "force": True}),
        confirm.args_digest("delete_vm", "vc1", {"vm": "web-01", "force": 1}),
        confirm.args_digest("delete_vm", "vc1", {"vm": "web-01"}),
    }
    assert base not in others and len(others) == 5


NOW = 150.0
# (case, proposal changes, check_confirmable kwargs, expected error or None)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], type[GatewayError] | None]] = [
    ("owner confirms in time", {}, {}, None),
    ("another caller", {}, {"caller": "agent-2"}, ConfirmationInvalid),
    ("another caller, even if expired", {"expires_at": 120.0}, {"caller": "agent-2"}, ConfirmationInvalid),
    ("already executing", {"state": "executing"}, {}, ConfirmationInvalid),
    ("already executed", {"state": "executed"}, {}, ConfirmationInvalid),
    ("failed", {"state": "failed"}, {}, ConfirmationInvalid),
    ("cancelled", {"state": "cancelled"}, {}, ConfirmationInvalid),
    ("denied", {"state": "denied"}, {}, ConfirmationInvalid),
    ("approved by a human already", {"state": "approved"}, {}, ConfirmationInvalid),
    ("swept as expired", {"state": "expired"}, {}, ConfirmationExpired),
    ("past expires_at", {"expires_at": NOW - 1}, {}, ConfirmationExpired),
    ("exactly at expires_at", {"expires_at": NOW}, {}, ConfirmationExpired),
    ("web approval required", {"require_web_approval": True}, {}, ApprovalRequired),
    ("web approval required but expired", {"require_web_approval": True, "expires_at": 1.0}, {},
     ConfirmationExpired),
    ("human with approve any", {"require_web_approval": True},
     {"via": "human", "caller": "ann", "approver_role_approve": "any"}, None),
    ("human approving own proposal with any", {},
     {"via": "human", "caller": "agent-1", "approver_role_approve": "any"}, None),
    ("human with approve others", {},
     {"via": "human", "caller": "ann", "approver_role_approve": "others"}, None),
    ("human with others, own proposal", {},
     {"via": "human", "caller": "agent-1", "approver_role_approve": "others"}, Forbidden),
    ("human with approve none", {}, {"via": "human", "caller": "ann", "approver_role_approve": "none"},
     Forbidden),
    ("human without a role", {}, {"via": "human", "caller": "ann"}, Forbidden),
    ("human, already executed", {"state": "executed"},
     {"via": "human", "caller": "ann", "approver_role_approve": "any"}, ConfirmationInvalid),
    ("human, expired", {"expires_at": 1.0},
     {"via": "human", "caller": "ann", "approver_role_approve": "any"}, ConfirmationExpired),
]


@pytest.mark.parametrize(("changes", "kwargs", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check_confirmable(changes: dict[str, Any], kwargs: dict[str, Any],
                           expected: type[GatewayError] | None) -> None:
    p = make(**changes)
    call: dict[str, Any] = {"caller": "agent-1", "now": NOW, "via": "agent", **kwargs}
    if expected is None:
        confirm.check_confirmable(p, **call)
        return
    with pytest.raises(expected) as info:
        confirm.check_confirmable(p, **call)
    assert type(info.value) is expected


def test_unknown_token_is_invalid() -> None:
    with pytest.raises(ConfirmationInvalid, match="fresh proposal"):
        confirm.check_confirmable(None, caller="agent-1", now=NOW, via="agent")


def test_another_callers_confirm_learns_nothing_about_the_proposal() -> None:
    p = make(target="prod-vc", tool="delete_vm", state="executed")
    with pytest.raises(ConfirmationInvalid) as info:
        confirm.check_confirmable(p, caller="agent-2", now=NOW, via="agent")
    wire = str(info.value.to_wire())
    assert "not valid for you" in info.value.message
    for secret in ("prod-vc", "delete_vm", p.id, "executed", "agent-1"):
        assert secret not in wire


def test_messages_name_the_remedy() -> None:
    with pytest.raises(ConfirmationExpired, match="fresh proposal"):
        confirm.check_confirmable(make(expires_at=1.0), caller="agent-1", now=NOW, via="agent")
    with pytest.raises(ApprovalRequired) as info:
        confirm.check_confirmable(make(require_web_approval=True), caller="agent-1", now=NOW, via="agent")
    p_id = info.value.details["proposal_id"]
    assert "/ui" in info.value.message and f"gateway pending approve {p_id}" in info.value.message


def test_expire_due_moves_due_pending_and_approved_once(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "state.db") as store:
        due = make(expires_at=100.0)
        approved_due = make(expires_at=100.0, state="approved")
        not_due = make(expires_at=500.0)
        done = make(expires_at=100.0, state="executed")
        for p in (due, approved_due, not_due, done):
            store.add_proposal(p)
        moved = confirm.expire_due(store, now=200.0)
        assert {p.id for p in moved} == {due.id, approved_due.id}
        assert all(p.state == "expired" and p.decided_at == 200.0 for p in moved)
        assert confirm.expire_due(store, now=200.0) == []
        assert store.get_proposal(not_due.id) == not_due
        assert store.get_proposal(done.id) == done


def test_expire_due_in_racing_processes_expires_each_proposal_once(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with SqliteStore(db) as store:
        proposals = [make(expires_at=100.0) for _ in range(20)]
        for p in proposals:
            store.add_proposal(p)
    stores = [SqliteStore(db) for _ in range(4)]
    results: list[list[Proposal]] = []
    barrier = threading.Barrier(len(stores))

    def sweep(s: SqliteStore) -> None:
        barrier.wait(timeout=10)
        results.append(confirm.expire_due(s, now=200.0))

    threads = [threading.Thread(target=sweep, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for s in stores:
        s.close()
    moved = sorted(p.id for batch in results for p in batch)
    assert moved == sorted(p.id for p in proposals)


def test_a_confirmed_proposal_cannot_be_confirmed_again(tmp_path: Path) -> None:
    """The rules and the store together: the check passes for both racers, the CAS admits one."""
    with SqliteStore(tmp_path / "state.db") as store:
        p = make()
        store.add_proposal(p)
        for _ in range(2):
            confirm.check_confirmable(store.get_proposal(p.id), caller="agent-1", now=NOW, via="agent")
        assert store.transition(p.id, ["pending"], "executing")
        assert not store.transition(p.id, ["pending"], "executing")
        with pytest.raises(ConfirmationInvalid, match="already used"):
            confirm.check_confirmable(store.proposal_by_token_hash(p.token_hash), caller="agent-1", now=NOW,
                                      via="agent")
        assert replace(p, state="executing") == store.get_proposal(p.id)
