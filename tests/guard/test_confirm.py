"""The two-phase confirmation rules: tokens, digests, the confirmable table, expiry sweeps."""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway.guard import confirm
from gateway.proposals import IllegalTransition, Proposal
from gateway.store import SqliteStore


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
# (case, proposal changes, expected error code or None): the proposal's own state only; who may act on
# it and what the rules say now are guard.decision.authorize's (tests/guard/test_decision.py)
CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("pending in time", {}, None),
    ("already executing", {"state": "executing"}, "confirmation_invalid"),
    ("already executed", {"state": "executed"}, "confirmation_invalid"),
    ("failed", {"state": "failed"}, "confirmation_invalid"),
    ("outcome unknown", {"state": "outcome_unknown"}, "confirmation_invalid"),
    ("cancelled", {"state": "cancelled"}, "confirmation_invalid"),
    ("denied", {"state": "denied"}, "confirmation_invalid"),
    ("stale", {"state": "stale"}, "confirmation_invalid"),
    ("approved by a human already", {"state": "approved"}, "confirmation_invalid"),
    ("swept as expired", {"state": "expired"}, "confirmation_expired"),
    ("past expires_at", {"expires_at": NOW - 1}, "confirmation_expired"),
    ("exactly at expires_at", {"expires_at": NOW}, "confirmation_expired"),
]


@pytest.mark.parametrize(("changes", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_proposal_problem(changes: dict[str, Any], expected: str | None) -> None:
    problem = confirm.proposal_problem(make(**changes), NOW)
    assert (problem[0] if problem else None) == expected


def test_messages_name_the_remedy() -> None:
    problem = confirm.proposal_problem(make(expires_at=1.0), NOW)
    assert problem is not None and "fresh proposal" in problem[1]
    problem = confirm.proposal_problem(make(state="outcome_unknown"), NOW)
    assert problem is not None and "get_tasks" in problem[1]


def test_a_confirmed_proposal_cannot_be_confirmed_again(tmp_path: Path) -> None:
    """The rules and the store together: the check passes for both racers, the CAS admits one."""
    with SqliteStore(tmp_path / "state.db") as store:
        p = make()
        store.add_proposal(p)
        for _ in range(2):
            assert confirm.proposal_problem(store.get_proposal(p.id), NOW) is None  # type: ignore[arg-type]
        assert store.transition(p.id, ["pending"], "executing")
        assert not store.transition(p.id, ["pending"], "executing")
        problem = confirm.proposal_problem(store.proposal_by_token_hash(p.token_hash), NOW)  # type: ignore[arg-type]
        assert problem is not None and "already used" in problem[1]
        assert replace(p, state="executing") == store.get_proposal(p.id)


def test_racing_claims_in_several_processes_admit_exactly_one(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with SqliteStore(db) as store:
        proposals = [make(expires_at=100.0) for _ in range(20)]
        for p in proposals:
            store.add_proposal(p)
    stores = [SqliteStore(db) for _ in range(4)]
    won: list[str] = []
    barrier = threading.Barrier(len(stores))

    def sweep(s: SqliteStore) -> None:
        barrier.wait(timeout=10)
        won.extend(p.id for p in proposals if s.transition(p.id, ["pending", "approved"], "expired"))

    threads = [threading.Thread(target=sweep, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for s in stores:
        s.close()
    assert sorted(won) == sorted(p.id for p in proposals)


@pytest.mark.parametrize(("start", "to"), [("pending", "executed"), ("executed", "pending"),
                                           ("expired", "executing"), ("failed", "executed"),
                                           ("denied", "approved"), ("executing", "pending")])
def test_the_store_refuses_moves_outside_the_lifecycle_table(tmp_path: Path, start: str, to: str) -> None:

    with SqliteStore(tmp_path / "state.db") as store:
        p = make(state=start)
        store.add_proposal(p)
        with pytest.raises(IllegalTransition):
            store.transition(p.id, [start], to)
        assert store.get_proposal(p.id) == p
