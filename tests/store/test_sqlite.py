"""``SqliteStore`` on real files in a temporary directory (``gateway.store.sqlite``): private modes, WAL,
migrations and a newer schema refused, and each part of the ``StateStore`` contract with plain values.
Both engines side by side, across processes: ``tests/store/test_engines.py``."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import ConfigError, InvalidArgument, NotFound, StateUnavailable
from gateway.proposals import Approval, IllegalTransition, Proposal
from gateway.store.base import TokenRecord, WebSessionRecord
from gateway.store.sqlite import SCHEMA_VERSION, SqliteStore, secure_directory
from gateway.vocabulary import Kind


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "home" / "state.db") as opened:
        yield opened


def _token(name: str = "ci", token_id: str = "aaaaaaaaaaaa", **fields: Any) -> TokenRecord:
    return TokenRecord(token_id=token_id, name=name, role="reader", hash="h", created_at=1.0, **fields)


def _proposal(pid: str = "p1", **fields: Any) -> Proposal:
    base: dict[str, Any] = dict(
        id=pid, token_hash=f"th-{pid}", caller="agent", role="admin", surface="https", target="vc1",
        target_host="vc1.example", tool="delete_vm", args={"vm": "web1"}, args_digest="d",
        plan_summary="delete web1", affected=[], plan_params={}, created_at=1.0, expires_at=100.0)
    base.update(fields)
    return Proposal(**base)


def _approval(approver: str = "alice", **fields: Any) -> Approval:
    base: dict[str, Any] = dict(proposal_id="p1", approver=approver, kind="person", role="admin", at=5.0,
                                reason="ok", digest="dg", approver_key=f"token::{approver}")
    base.update(fields)
    return Approval(**base)


def _session(key: str, created: float, **fields: Any) -> WebSessionRecord:
    base: dict[str, Any] = dict(key=key, token_id="t1", name="alice", csrf="c", created_at=created,
                                expires_at=created + 3600, last_seen=created)
    base.update(fields)
    return WebSessionRecord(**base)


# -- files -----------------------------------------------------------------------------------------------

def test_the_database_and_its_directory_are_private(store: SqliteStore) -> None:
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.path.parent.stat().st_mode) == 0o700
    for sidecar in (Path(f"{store.path}-wal"), Path(f"{store.path}-shm")):
        if sidecar.exists():
            assert not sidecar.stat().st_mode & 0o077


def test_a_wider_database_file_is_tightened_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    SqliteStore(path).close()
    path.chmod(0o644)
    SqliteStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_store_runs_in_wal_mode(store: SqliteStore) -> None:
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_symbolic_link_as_the_database_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real.db").write_bytes(b"")
    (tmp_path / "state.db").symlink_to(tmp_path / "real.db")
    with pytest.raises(StateUnavailable, match="cannot create the state store"):
        SqliteStore(tmp_path / "state.db")


def test_secure_directory_creates_at_0700(tmp_path: Path) -> None:
    secure_directory(tmp_path / "a" / "b")
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700


def test_secure_directory_tightens_an_open_directory_of_this_user(tmp_path: Path) -> None:
    directory = tmp_path / "home"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    secure_directory(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


# -- schema ----------------------------------------------------------------------------------------------

def test_a_new_store_is_at_the_newest_schema(store: SqliteStore) -> None:
    assert store.schema_version() == SCHEMA_VERSION


def test_opening_again_migrates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with SqliteStore(path) as first:
        first.add_token(_token())
    with SqliteStore(path) as again:
        assert again.schema_version() == SCHEMA_VERSION
        assert again.token_by_name("ci") is not None


def test_a_schema_newer_than_this_gateway_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    SqliteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(ConfigError, match="written by a newer gateway"):
        SqliteStore(path)


def test_ping_answers_while_open(store: SqliteStore) -> None:
    assert store.ping()


def test_a_closed_store_fails_closed(tmp_path: Path) -> None:
    opened = SqliteStore(tmp_path / "state.db")
    opened.close()
    assert not opened.ping()
    with pytest.raises(StateUnavailable, match="closed"):
        opened.list_tokens()


# -- tokens ----------------------------------------------------------------------------------------------

def test_tokens_read_back_by_id_and_name(store: SqliteStore) -> None:
    rec = _token(expires_at=50.0, kind=Kind.PERSON)
    store.add_token(rec)
    assert store.token_by_id("aaaaaaaaaaaa") == rec
    assert store.token_by_name("ci") == rec
    assert store.token_by_id("nope") is None
    assert store.token_by_name("nope") is None


def test_tokens_list_by_name(store: SqliteStore) -> None:
    store.add_token(_token("zeta", "aaaaaaaaaaa1"))
    store.add_token(_token("alpha", "aaaaaaaaaaa2"))
    assert [t.name for t in store.list_tokens()] == ["alpha", "zeta"]


@pytest.mark.parametrize("again", ["ci", "CI", "Ci"])
def test_a_token_name_used_before_is_refused_ignoring_case(store: SqliteStore, again: str) -> None:
    store.add_token(_token())
    with pytest.raises(InvalidArgument, match="already exists"):
        store.add_token(_token(again, "bbbbbbbbbbbb"))


def test_a_repeated_token_id_is_refused(store: SqliteStore) -> None:
    store.add_token(_token())
    with pytest.raises(InvalidArgument):
        store.add_token(_token("other"))


def test_every_token_change_bumps_the_generation(store: SqliteStore) -> None:
    start = store.token_generation()
    store.add_token(_token())
    store.update_token("ci", role="admin")
    store.update_token("ci", kind=Kind.PERSON)
    store.update_token("ci", revoked=True)
    assert store.token_generation() == start + 4


def test_touching_a_token_is_not_a_change(store: SqliteStore) -> None:
    store.add_token(_token())
    generation = store.token_generation()
    store.touch_token("aaaaaaaaaaaa", 10.0)
    assert store.token_generation() == generation


def test_touch_only_moves_last_used_forward(store: SqliteStore) -> None:
    store.add_token(_token())
    store.touch_token("aaaaaaaaaaaa", 10.0)
    store.touch_token("aaaaaaaaaaaa", 5.0)
    found = store.token_by_id("aaaaaaaaaaaa")
    assert found is not None and found.last_used == 10.0


def test_update_token_changes_only_what_is_given(store: SqliteStore) -> None:
    store.add_token(_token())
    updated = store.update_token("ci", role="admin")
    assert (updated.role, updated.revoked, updated.kind) == ("admin", False, Kind.AGENT)
    assert store.token_by_name("ci") == updated


def test_update_of_an_unknown_token_is_not_found(store: SqliteStore) -> None:
    with pytest.raises(NotFound, match="no token named 'ghost'"):
        store.update_token("ghost", role="admin")


def test_a_revoked_token_cannot_be_reinstated(store: SqliteStore) -> None:
    store.add_token(_token())
    store.update_token("ci", revoked=True)
    with pytest.raises(InvalidArgument, match="cannot be reinstated"):
        store.update_token("ci", revoked=False)


def test_the_name_of_a_revoked_token_stays_taken(store: SqliteStore) -> None:
    store.add_token(_token())
    store.update_token("ci", revoked=True)
    with pytest.raises(InvalidArgument):
        store.add_token(_token("ci", "cccccccccccc"))


# -- proposals -------------------------------------------------------------------------------------------

def test_a_proposal_reads_back_by_id_and_token_hash(store: SqliteStore) -> None:
    proposal = _proposal(blast_radius={"disks": 2}, caller_key="token::a")
    store.add_proposal(proposal)
    assert store.get_proposal("p1") == proposal
    assert store.proposal_by_token_hash("th-p1") == proposal
    assert store.get_proposal("nope") is None


@pytest.mark.parametrize("clash", [{"id": "p1", "token_hash": "new"}, {"id": "p2", "token_hash": "th-p1"}])
def test_a_repeated_proposal_id_or_token_hash_is_refused(store: SqliteStore, clash: dict[str, str]) -> None:
    store.add_proposal(_proposal())
    with pytest.raises(InvalidArgument, match="already exists"):
        store.add_proposal(_proposal(clash["id"], token_hash=clash["token_hash"]))


def test_list_proposals_newest_first_filtered_and_limited(store: SqliteStore) -> None:
    for i, state in enumerate(("pending", "denied", "pending")):
        store.add_proposal(_proposal(f"p{i}", created_at=float(i), state=state))
    assert [p.id for p in store.list_proposals()] == ["p2", "p1", "p0"]
    assert [p.id for p in store.list_proposals(["pending"])] == ["p2", "p0"]
    assert [p.id for p in store.list_proposals(limit=1)] == ["p2"]


def test_list_proposals_due_before_oldest_deadline_first(store: SqliteStore) -> None:
    for pid, expires in (("a", 30.0), ("b", 10.0), ("c", 99.0)):
        store.add_proposal(_proposal(pid, expires_at=expires))
    assert [p.id for p in store.list_proposals(["pending"], due_before=50.0)] == ["b", "a"]


def test_list_proposals_of_an_unknown_state_is_refused(store: SqliteStore) -> None:
    with pytest.raises(ValueError, match="unknown proposal states"):
        store.list_proposals(["finished"])


def test_transition_is_a_compare_and_set(store: SqliteStore) -> None:
    store.add_proposal(_proposal())
    assert store.transition("p1", ["pending"], "approved", approved_by="alice", decided_at=3.0)
    assert not store.transition("p1", ["pending"], "denied")
    found = store.get_proposal("p1")
    assert found is not None
    assert (found.state, found.approved_by, found.decided_at) == ("approved", "alice", 3.0)


def test_transition_stores_json_fields(store: SqliteStore) -> None:
    store.add_proposal(_proposal())
    store.transition("p1", ["pending"], "executing", executor="1-a")
    store.transition("p1", ["executing"], "failed", error={"code": "task_failed"}, result=[1, 2])
    found = store.get_proposal("p1")
    assert found is not None
    assert (found.error, found.result, found.executor) == ({"code": "task_failed"}, [1, 2], "1-a")


def test_transition_of_an_unknown_proposal_is_false(store: SqliteStore) -> None:
    assert not store.transition("ghost", ["pending"], "denied")


def test_transition_off_the_lifecycle_table_is_refused(store: SqliteStore) -> None:
    store.add_proposal(_proposal())
    with pytest.raises(IllegalTransition):
        store.transition("p1", ["pending"], "executed")
    with pytest.raises(TypeError):
        store.transition("p1", ["pending"], "denied", tool="other")


def test_approvals_are_kept_in_order_with_their_proposal(store: SqliteStore) -> None:
    store.add_proposal(_proposal())
    first, second = _approval("bob", at=7.0), _approval("alice", at=6.0)
    assert store.add_approval(first)
    assert store.add_approval(second)
    found = store.get_proposal("p1")
    assert found is not None and found.approvals == (second, first)


def test_one_person_approves_once(store: SqliteStore) -> None:
    store.add_proposal(_proposal())
    assert store.add_approval(_approval("alice"))
    assert not store.add_approval(_approval("alice", at=9.0))
    assert not store.add_approval(_approval("alice-again", approver_key="token::alice"))


def test_no_approval_once_the_proposal_is_not_pending(store: SqliteStore) -> None:
    store.add_proposal(_proposal())
    store.transition("p1", ["pending"], "denied")
    assert not store.add_approval(_approval())
    assert not store.add_approval(_approval(proposal_id="ghost"))


# -- web sessions ----------------------------------------------------------------------------------------

def test_a_session_lives_while_used_within_the_idle_time(store: SqliteStore) -> None:
    store.add_web_session(_session("k1", 100.0), idle=60.0, max_sessions=10)
    found = store.touch_web_session("k1", now=150.0, idle=60.0)
    assert found is not None and found.last_seen == 150.0
    assert store.touch_web_session("k1", now=200.0, idle=60.0) is not None


def test_an_idle_session_ends_and_is_deleted(store: SqliteStore) -> None:
    store.add_web_session(_session("k1", 100.0), idle=60.0, max_sessions=10)
    assert store.touch_web_session("k1", now=160.0, idle=60.0) is None
    assert store.count_web_sessions() == 0


def test_a_session_past_its_expiry_ends(store: SqliteStore) -> None:
    store.add_web_session(_session("k1", 100.0, expires_at=120.0), idle=60.0, max_sessions=10)
    assert store.touch_web_session("k1", now=120.0, idle=60.0) is None


def test_an_unknown_session_is_none(store: SqliteStore) -> None:
    assert store.touch_web_session("nope", now=1.0, idle=60.0) is None
    assert store.end_web_session("nope") is None


def test_adding_a_session_drops_the_oldest_beyond_the_limit(store: SqliteStore) -> None:
    for i in range(4):
        store.add_web_session(_session(f"k{i}", 100.0 + i), idle=600.0, max_sessions=3)
    assert store.count_web_sessions() == 3
    assert store.touch_web_session("k0", now=104.0, idle=600.0) is None
    assert store.touch_web_session("k3", now=104.0, idle=600.0) is not None


def test_adding_a_session_drops_ended_ones(store: SqliteStore) -> None:
    store.add_web_session(_session("old", 100.0), idle=60.0, max_sessions=10)
    store.add_web_session(_session("new", 500.0), idle=60.0, max_sessions=10)
    assert store.count_web_sessions() == 1


def test_ending_a_session_returns_it(store: SqliteStore) -> None:
    session = _session("k1", 100.0, caller_key="token::t1")
    store.add_web_session(session, idle=60.0, max_sessions=10)
    assert store.end_web_session("k1") == session
    assert store.count_web_sessions() == 0
