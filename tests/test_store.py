"""SqliteStore on real files: permissions, tokens, proposals, compare-and-set across connections."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.errors import ConfigError, InvalidArgument, NotFound, StateUnavailable
from gateway.store import Proposal, SqliteStore, TokenRecord, new_id

ROOT = Path(__file__).resolve().parent.parent
#: subprocesses import the package from this checkout whatever the working directory
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "home" / "state.db"


@pytest.fixture
def store(db: Path) -> Iterator[SqliteStore]:
    with SqliteStore(db) as s:
        yield s


def token(name: str = "ci", role: str = "reader", **kw: object) -> TokenRecord:
    values: dict[str, object] = {"token_id": new_id(), "name": name, "role": role, "hash": "$argon2id$x",
                                 "created_at": 1000.0}
    values.update(kw)
    return TokenRecord(**values)  # type: ignore[arg-type]


def proposal(**kw: object) -> Proposal:
    values: dict[str, object] = {
        "id": new_id(), "token_hash": new_id() * 5, "caller": "agent-1", "role": "admin", "surface": "https",
        "target": "vc1", "target_host": "vc1.example:443", "tool": "delete_vm", "args": {"vm": "web-01"},
        "args_digest": "d" * 64, "plan_summary": "delete VM web-01",
        "affected": [{"type": "VirtualMachine", "name": "web-01", "moid": "vm-42"}],
        "plan_params": {"moid": "vm-42", "nested": {"list": [1, 2.5, None, "é"]}},
        "created_at": 1000.0, "expires_at": 1120.0,
    }
    values.update(kw)
    return Proposal(**values)  # type: ignore[arg-type]


# -- files -----------------------------------------------------------------------------------------

def test_creates_private_directory_database_and_wal_files(store: SqliteStore, db: Path) -> None:
    store.add_token(token())  # a write, so the -wal and -shm files exist while the store is open
    assert mode(db.parent) == 0o700
    assert mode(db) == 0o600
    for suffix in ("-wal", "-shm"):
        sidecar = Path(f"{db}{suffix}")
        assert sidecar.exists(), suffix
        assert mode(sidecar) == 0o600, suffix


def test_wal_files_created_later_by_sqlite_stay_private_under_a_permissive_umask(db: Path) -> None:
    old_umask = os.umask(0)
    try:
        SqliteStore(db).close()  # the last close removes -wal and -shm
        assert not Path(f"{db}-wal").exists()
        raw = sqlite3.connect(db)  # SQLite itself creates the sidecars now, not SqliteStore
        raw.execute("UPDATE meta SET value = value + 1")
        raw.commit()
        modes = {suffix: mode(Path(f"{db}{suffix}")) for suffix in ("", "-wal", "-shm")}
        raw.close()
    finally:
        os.umask(old_umask)
    assert modes == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
    assert mode(db.parent) == 0o700


def test_tightens_a_loose_home_and_database(db: Path) -> None:
    db.parent.mkdir(mode=0o755)
    os.chmod(db.parent, 0o755)
    db.touch()
    os.chmod(db, 0o644)
    SqliteStore(db).close()
    assert mode(db.parent) == 0o700
    assert mode(db) == 0o600


def test_refuses_an_open_home_owned_by_someone_else(db: Path) -> None:
    db.parent.mkdir()
    os.chmod(db.parent, 0o777)
    if os.getuid() != 0:
        pytest.skip("needs root to give the directory away")
    os.chown(db.parent, 54321, -1)
    with pytest.raises(ConfigError, match="GATEWAY_HOME"):
        SqliteStore(db)


def test_uses_wal_journal(store: SqliteStore, db: Path) -> None:
    raw = sqlite3.connect(db)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


def test_refuses_a_database_from_a_newer_gateway(db: Path) -> None:
    SqliteStore(db).close()
    raw = sqlite3.connect(db)
    raw.execute("PRAGMA user_version=99")
    raw.close()
    with pytest.raises(ConfigError, match="newer gateway"):
        SqliteStore(db)


def test_locked_database_is_state_unavailable_not_a_crash(db: Path) -> None:
    store = SqliteStore(db, busy_timeout=0.05)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StateUnavailable) as info:
            store.add_token(token())
        assert "locked" not in info.value.message  # details go to the log, not the caller
        assert store.token_by_name("ci") is None  # readers still proceed under WAL
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        store.close()


def test_ping_and_close(db: Path) -> None:
    store = SqliteStore(db)
    assert store.ping()
    store.close()
    assert not store.ping()
    with pytest.raises(StateUnavailable):
        store.list_tokens()


# -- tokens ----------------------------------------------------------------------------------------

def test_token_round_trip(store: SqliteStore) -> None:
    rec = token(expires_at=5000.0)
    store.add_token(rec)
    assert store.token_by_id(rec.token_id) == rec
    assert store.token_by_name("ci") == rec
    assert store.list_tokens() == [rec]
    assert store.token_by_id("nope") is None
    assert store.token_by_name("nope") is None


def test_token_names_stay_taken_even_after_revocation(store: SqliteStore) -> None:
    store.add_token(token())
    store.update_token("ci", revoked=True)
    with pytest.raises(InvalidArgument, match="already exists"):
        store.add_token(token())


def test_update_token(store: SqliteStore) -> None:
    rec = token()
    store.add_token(rec)
    changed = store.update_token("ci", role="admin")
    assert changed == replace(rec, role="admin") == store.token_by_name("ci")
    revoked = store.update_token("ci", revoked=True)
    assert revoked.revoked and revoked.role == "admin"
    with pytest.raises(InvalidArgument, match="cannot be reinstated"):
        store.update_token("ci", revoked=False)
    with pytest.raises(NotFound):
        store.update_token("ghost", role="admin")


def test_generation_moves_on_token_changes_only_and_across_connections(store: SqliteStore, db: Path) -> None:
    other = SqliteStore(db)
    try:
        start = other.token_generation()
        rec = token()
        store.add_token(rec)
        assert other.token_generation() == start + 1
        store.touch_token(rec.token_id, 2000.0)
        store.add_proposal(proposal())
        assert other.token_generation() == start + 1
        store.update_token("ci", role="admin")
        store.update_token("ci", revoked=True)
        assert other.token_generation() == start + 3
    finally:
        other.close()


def test_touch_token_never_moves_back(store: SqliteStore) -> None:
    rec = token()
    store.add_token(rec)
    store.touch_token(rec.token_id, 2000.0)
    store.touch_token(rec.token_id, 1500.0)
    found = store.token_by_id(rec.token_id)
    assert found is not None and found.last_used == 2000.0


# -- proposals -------------------------------------------------------------------------------------

def test_proposal_round_trip(store: SqliteStore) -> None:
    p = proposal(require_web_approval=True, correlation_id="c-1")
    store.add_proposal(p)
    assert store.get_proposal(p.id) == p
    assert store.proposal_by_token_hash(p.token_hash) == p
    assert store.get_proposal("missing") is None
    with pytest.raises(InvalidArgument):
        store.add_proposal(p)


def test_list_proposals_filters_and_orders(store: SqliteStore) -> None:
    old = proposal(created_at=1.0, expires_at=50.0)
    new = proposal(created_at=2.0, expires_at=40.0)
    done = proposal(created_at=3.0, expires_at=10.0, state="executed")
    for p in (old, new, done):
        store.add_proposal(p)
    assert [p.id for p in store.list_proposals()] == [done.id, new.id, old.id]
    assert [p.id for p in store.list_proposals(["pending"])] == [new.id, old.id]
    assert [p.id for p in store.list_proposals(["pending"], limit=1)] == [new.id]
    assert [p.id for p in store.list_proposals(["pending"], due_before=45.0)] == [new.id]
    assert [p.id for p in store.list_proposals(["pending"], due_before=100.0)] == [new.id, old.id]
    assert store.list_proposals([]) == []
    with pytest.raises(ValueError):
        store.list_proposals(["bogus"])


def test_transition_is_compare_and_set(store: SqliteStore) -> None:
    p = proposal()
    store.add_proposal(p)
    assert not store.transition(p.id, ["approved"], "executing")
    assert store.transition(p.id, ["pending"], "executing", decided_at=1001.0, approved_by="ann")
    assert not store.transition(p.id, ["pending"], "executing")
    assert store.transition(p.id, ["executing"], "failed", outcome="task_failed",
                            error={"code": "task_failed", "message": "boom"}, result={"partial": [1]})
    after = store.get_proposal(p.id)
    assert after == replace(p, state="failed", decided_at=1001.0, approved_by="ann", outcome="task_failed",
                            error={"code": "task_failed", "message": "boom"}, result={"partial": [1]})
    assert not store.transition("missing", ["pending"], "cancelled")


@pytest.mark.parametrize("bad", [
    {"from_states": ["pending"], "to_state": "done"},
    {"from_states": ["nope"], "to_state": "executed"},
    {"from_states": [], "to_state": "executed"},
])
def test_transition_rejects_unknown_states(store: SqliteStore, bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        store.transition("x", bad["from_states"], bad["to_state"])  # type: ignore[arg-type]


def test_transition_rejects_fields_it_may_not_set(store: SqliteStore) -> None:
    with pytest.raises(TypeError, match="caller"):
        store.transition("x", ["pending"], "executing", caller="mallory")


def test_exactly_one_of_many_racing_confirms_wins(store: SqliteStore, db: Path) -> None:
    """Half the racers share one store object (threads of one process), half have their own
    connection (as separate processes do): each proposal is claimed exactly once."""
    racers = 8
    own = [SqliteStore(db) for _ in range(racers // 2)]
    stores = [store] * (racers // 2) + own
    try:
        for _round in range(5):
            p = proposal()
            store.add_proposal(p)
            barrier = threading.Barrier(racers)
            wins: list[bool] = []

            def race(s: SqliteStore, pid: str = p.id, b: threading.Barrier = barrier,
                     out: list[bool] = wins) -> None:
                b.wait(timeout=10)
                out.append(s.transition(pid, ["pending"], "executing"))  # list.append is atomic

            threads = [threading.Thread(target=race, args=(s,)) for s in stores]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)
            assert len(wins) == racers
            assert wins.count(True) == 1
            found = store.get_proposal(p.id)
            assert found is not None and found.state == "executing"
    finally:
        for s in own:
            s.close()


def test_connections_of_finished_threads_are_released(store: SqliteStore) -> None:
    for _ in range(5):
        t = threading.Thread(target=store.list_tokens)
        t.start()
        t.join()
    store.list_tokens()  # opening this thread's connection prunes those of dead threads
    assert len(store._connections) <= 2


_CLAIMER = """
import sys, time
from pathlib import Path
from gateway.store import SqliteStore
db, go, ids = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
store = SqliteStore(db)
print("ready", flush=True)
deadline = time.monotonic() + 30
while not go.exists():
    if time.monotonic() > deadline:
        sys.exit("never told to go")
    time.sleep(0.001)
print(" ".join(i for i in ids if store.transition(i, ["pending"], "executing")), flush=True)
store.close()
"""


def test_racing_processes_claim_each_proposal_exactly_once(store: SqliteStore, db: Path,
                                                           tmp_path: Path) -> None:
    ids = []
    for _ in range(30):
        p = proposal()
        store.add_proposal(p)
        ids.append(p.id)
    go = tmp_path / "go"
    argv = [sys.executable, "-c", _CLAIMER, str(db), str(go), *ids]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=SUBPROCESS_ENV) for _ in range(4)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        go.touch()
        claims = [proc.communicate(timeout=60)[0].split() for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert all(proc.returncode == 0 for proc in procs)
    assert sorted(i for batch in claims for i in batch) == sorted(ids)


def test_many_processes_can_create_the_store_at_once(tmp_path: Path) -> None:
    db = tmp_path / "fresh" / "state.db"
    script = "import sys; from pathlib import Path; from gateway.store import SqliteStore; " \
             "s = SqliteStore(Path(sys.argv[1])); s.token_generation(); s.close()"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(db)], env=SUBPROCESS_ENV) for _ in range(6)]
    assert [proc.wait(timeout=60) for proc in procs] == [0] * 6
