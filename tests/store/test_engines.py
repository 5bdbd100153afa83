"""The state store on both engines, real parts only: SqliteStore on real files (permissions, WAL) and
PostgresStore on a real PostgreSQL server. The engine-neutral cases (tokens, proposals, web sessions,
compare-and-set across connections and processes, migrations) run once per engine."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from support.postgres import PgServer, discard, open_store_at, start_postgres, wait_for

from gateway.errors import ConfigError, InvalidArgument, NotFound, StateUnavailable
from gateway.ids import new_id
from gateway.proposals import Approval, Proposal
from gateway.store import SqliteStore, StateStore, TokenRecord, WebSessionRecord
from gateway.store.postgres import PostgresStore
from gateway.vocabulary import Kind

ROOT = Path(__file__).resolve().parents[2]
#: subprocesses import the package from this checkout whatever the working directory
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "home" / "state.db"


@pytest.fixture
def sqlite_store(db: Path) -> Iterator[SqliteStore]:
    with SqliteStore(db) as s:
        yield s


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def location(engine: str, db: Path, request: pytest.FixtureRequest) -> str:
    """Where the engine's store lives: the SQLite file's path or a fresh PostgreSQL database's URL."""
    return str(db) if engine == "sqlite" else str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(location: str) -> Iterator[StateStore]:
    s = open_store_at(location)
    yield s
    s.close()


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

def test_creates_private_directory_database_and_wal_files(sqlite_store: SqliteStore, db: Path) -> None:
    sqlite_store.add_token(token())  # a write, so the -wal and -shm files exist while the store is open
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


def test_uses_wal_journal(sqlite_store: SqliteStore, db: Path) -> None:
    raw = sqlite3.connect(db)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


def test_refuses_a_database_from_a_newer_gateway(location: str, engine: str) -> None:
    with closing(open_store_at(location)) as s:
        assert s.schema_version() >= 1
    if engine == "sqlite":
        raw = sqlite3.connect(location)
        raw.execute("PRAGMA user_version=99")
        raw.close()
    else:
        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(ConfigError, match="newer gateway"):
        open_store_at(location)


def test_a_version_1_sqlite_file_is_migrated_and_keeps_its_rows(db: Path) -> None:
    """A state.db written before migrations existed (schema 1) gains the later tables on open."""
    from gateway.store.sqlite import MIGRATIONS
    db.parent.mkdir(mode=0o700)
    raw = sqlite3.connect(db, isolation_level=None)
    for statement in MIGRATIONS[0][1]:
        raw.execute(statement)
    raw.execute("PRAGMA user_version=1")
    raw.execute("INSERT INTO tokens VALUES ('abc', 'old', 'reader', 'h', 1.0, NULL, NULL, 0)")
    raw.close()
    with SqliteStore(db) as s:
        assert s.schema_version() == MIGRATIONS[-1][0] > 1
        assert [t.name for t in s.list_tokens()] == ["old"]
        assert s.count_web_sessions() == 0


def test_tokens_made_before_kinds_existed_become_agents_and_kinds_change(location: str, engine: str) -> None:
    """A store at schema 3 (before token kinds) is migrated on open: its tokens are agents'; a kind then
    changes like a role (bumping the generation) and only person or agent is stored."""
    from gateway.store import postgres, sqlite
    old = (sqlite.MIGRATIONS if engine == "sqlite" else postgres.MIGRATIONS)[:3]
    row = "INSERT INTO tokens VALUES ('abc', 'old', 'admin', 'h', 1.0, NULL, NULL, {false})"
    if engine == "sqlite":
        Path(location).parent.mkdir(mode=0o700)
        raw = sqlite3.connect(location, isolation_level=None)
        for _, statements in old:
            for statement in statements:
                raw.execute(statement)
        raw.execute("PRAGMA user_version=3")
        raw.execute(row.format(false=0))
        raw.close()
    else:
        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("CREATE TABLE schema_version (one boolean PRIMARY KEY DEFAULT true CHECK (one), "
                         "version integer NOT NULL)")
            for _, statements in old:
                for statement in statements:
                    conn.execute(statement)
            conn.execute("INSERT INTO schema_version (one, version) VALUES (true, 3)")
            conn.execute(row.format(false="false"))
    with closing(open_store_at(location)) as s:
        assert s.schema_version() == (sqlite if engine == "sqlite" else postgres).SCHEMA_VERSION
        (rec,) = s.list_tokens()
        assert (rec.name, rec.role, rec.kind) == ("old", "admin", Kind.AGENT)
        generation = s.token_generation()
        assert s.update_token("old", kind=Kind.PERSON).kind is Kind.PERSON
        assert s.token_by_name("old").kind is Kind.PERSON  # type: ignore[union-attr]
        assert s.token_generation() == generation + 1
        s.add_token(token("pat", kind=Kind.PERSON))
        assert s.token_by_name("pat").kind is Kind.PERSON  # type: ignore[union-attr]
        with pytest.raises(ValueError):
            s.update_token("old", kind="robot")  # type: ignore[arg-type]


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


def test_ping_and_close(location: str) -> None:
    store = open_store_at(location)
    assert store.ping()
    store.close()
    assert not store.ping()
    with pytest.raises(StateUnavailable):
        store.list_tokens()


# -- tokens ----------------------------------------------------------------------------------------

def test_token_round_trip(store: StateStore) -> None:
    rec = token(expires_at=5000.0)
    store.add_token(rec)
    assert store.token_by_id(rec.token_id) == rec
    assert store.token_by_name("ci") == rec
    assert store.list_tokens() == [rec]
    assert store.token_by_id("nope") is None
    assert store.token_by_name("nope") is None


def test_token_names_stay_taken_even_after_revocation(store: StateStore) -> None:
    store.add_token(token())
    store.update_token("ci", revoked=True)
    with pytest.raises(InvalidArgument, match="already exists"):
        store.add_token(token())


def test_update_token(store: StateStore) -> None:
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


def test_generation_moves_on_token_changes_only_and_across_connections(store: StateStore,
                                                                       location: str) -> None:
    other = open_store_at(location)
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


def test_touch_token_never_moves_back(store: StateStore) -> None:
    rec = token()
    store.add_token(rec)
    store.touch_token(rec.token_id, 2000.0)
    store.touch_token(rec.token_id, 1500.0)
    found = store.token_by_id(rec.token_id)
    assert found is not None and found.last_used == 2000.0


# -- proposals -------------------------------------------------------------------------------------

def test_proposal_round_trip(store: StateStore) -> None:
    p = proposal(require_web_approval=True, correlation_id="c-1")
    store.add_proposal(p)
    assert store.get_proposal(p.id) == p
    assert store.proposal_by_token_hash(p.token_hash) == p
    assert store.get_proposal("missing") is None
    with pytest.raises(InvalidArgument):
        store.add_proposal(p)


def test_approvals_are_kept_once_per_person_and_only_while_pending(store: StateStore) -> None:
    """N of M in the store: one row per person per proposal, in the order they landed, read back with the
    proposal (with its approval rule, blast radius and digest as shown); none once it left pending."""
    blast = {"count": 1, "objects": [{"name": "web-01", "moid": "vm-1", "power_state": "poweredOff"}]}
    rule = {"required": 2, "roles": [], "reason_required": True}
    p = proposal(require_web_approval=True, approval_rule=rule, blast_radius=blast, shown_digest="d1")
    store.add_proposal(p)
    first = Approval(p.id, "alice", "person", "admin", 10.0, "checked", "d1")
    second = Approval(p.id, "olga", "person", "lead", 11.0, "", "d1")
    assert store.add_approval(first)
    assert not store.add_approval(replace(first, at=12.0, reason="again")), "a person approves once"
    assert store.add_approval(second)
    found = store.get_proposal(p.id)
    assert found is not None and found.approvals == (first, second)
    assert (found.approval_rule, found.blast_radius, found.shown_digest) == (p.approval_rule, blast, "d1")
    assert [q.approvals for q in store.list_proposals(["pending"]) if q.id == p.id] == [(first, second)]
    assert store.transition(p.id, ["pending"], "denied")
    assert not store.add_approval(Approval(p.id, "lee", "person", "admin", 13.0, "", "d1"))
    late = store.get_proposal(p.id)
    assert late is not None and len(late.approvals) == 2


def test_list_proposals_filters_and_orders(store: StateStore) -> None:
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


def test_transition_is_compare_and_set(store: StateStore) -> None:
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
def test_transition_rejects_unknown_states(store: StateStore, bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        store.transition("x", bad["from_states"], bad["to_state"])  # type: ignore[arg-type]


def test_transition_rejects_fields_it_may_not_set(store: StateStore) -> None:
    with pytest.raises(TypeError, match="caller"):
        store.transition("x", ["pending"], "executing", caller="mallory")


def test_exactly_one_of_many_racing_confirms_wins(store: StateStore, location: str) -> None:
    """Half the racers share one store object (threads of one process), half have their own
    connection (as separate processes do): each proposal is claimed exactly once."""
    racers = 8
    own = [open_store_at(location) for _ in range(racers // 2)]
    stores = [store] * (racers // 2) + own
    try:
        for _round in range(5):
            p = proposal()
            store.add_proposal(p)
            barrier = threading.Barrier(racers)
            wins: list[bool] = []

            def race(s: StateStore, pid: str = p.id, b: threading.Barrier = barrier,
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


def test_connections_of_finished_threads_are_released(sqlite_store: SqliteStore) -> None:
    for _ in range(5):
        t = threading.Thread(target=sqlite_store.list_tokens)
        t.start()
        t.join()
    sqlite_store.list_tokens()  # opening this thread's connection prunes those of dead threads
    assert len(sqlite_store._connections) <= 2


_CLAIMER = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, os.environ["TESTS_DIR"])
from support.postgres import open_store_at
go, ids = Path(sys.argv[1]), sys.argv[2:]
store = open_store_at(os.environ["STORE_AT"])  # in the environment: a URL's password stays off argv
print("ready", flush=True)
deadline = time.monotonic() + 30
while not go.exists():
    if time.monotonic() > deadline:
        sys.exit("never told to go")
    time.sleep(0.001)
print(" ".join(i for i in ids if store.transition(i, ["pending"], "executing")), flush=True)
store.close()
"""


def test_racing_processes_claim_each_proposal_exactly_once(store: StateStore, location: str,
                                                           tmp_path: Path) -> None:
    ids = []
    for _ in range(30):
        p = proposal()
        store.add_proposal(p)
        ids.append(p.id)
    go = tmp_path / "go"
    argv = [sys.executable, "-c", _CLAIMER, str(go), *ids]
    env = {**SUBPROCESS_ENV, "STORE_AT": location, "TESTS_DIR": str(ROOT / "tests")}
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) for _ in range(4)]
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


def test_many_processes_can_create_the_store_at_once(location: str) -> None:
    """Replicas starting together on an empty database each run the migrations once, without failing."""
    script = ("import os, sys; sys.path.insert(0, os.environ['TESTS_DIR']); "
              "from support.postgres import open_store_at; s = open_store_at(os.environ['STORE_AT']); "
              "s.token_generation(); print(s.schema_version()); s.close()")
    env = {**SUBPROCESS_ENV, "STORE_AT": location, "TESTS_DIR": str(ROOT / "tests")}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    outputs = [proc.communicate(timeout=60)[0].strip() for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 6
    assert len(set(outputs)) == 1 and int(outputs[0]) >= 1



def test_sqlite_store_opens_while_another_process_holds_the_new_file_for_writing(tmp_path: Path) -> None:
    """Switching a new file to WAL while another writer holds it is retried, not refused at once.

    SQLite answers that switch with "database is locked" immediately (its busy handler is not
    called, since waiting could deadlock); replicas creating one store together hit exactly this."""
    path = tmp_path / "state.db"
    path.touch(mode=0o600)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    released = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    released.start()
    try:
        with SqliteStore(path) as store:
            assert store.schema_version() >= 1
            assert store.ping()
    finally:
        released.join()
        holder.close()


# -- web sessions ----------------------------------------------------------------------------------

def web_session(key: str = "k" * 64, *, created_at: float = 1000.0, lifetime: float = 3600.0,
                **kw: object) -> WebSessionRecord:
    values: dict[str, object] = {"key": key, "token_id": "tok1", "name": "ann", "csrf": "c" * 43,
                                 "created_at": created_at, "expires_at": created_at + lifetime,
                                 "last_seen": created_at}
    values.update(kw)
    return WebSessionRecord(**values)  # type: ignore[arg-type]


def test_web_session_lives_until_idle_or_lifetime_ends(store: StateStore, location: str) -> None:
    store.add_web_session(web_session("a" * 64), idle=60.0, max_sessions=10)
    with closing(open_store_at(location)) as other:  # another replica
        seen = other.touch_web_session("a" * 64, 1050.0, idle=60.0)
        assert seen == web_session("a" * 64, last_seen=1050.0)
    assert store.touch_web_session("a" * 64, 1100.0, idle=60.0) is not None  # 50 s after the last use
    assert store.touch_web_session("a" * 64, 1160.0, idle=60.0) is None  # idle for 60 s: ended
    assert store.count_web_sessions() == 0
    store.add_web_session(web_session("b" * 64, lifetime=100.0), idle=60.0, max_sessions=10)
    for now in (1040.0, 1080.0):
        assert store.touch_web_session("b" * 64, now, idle=60.0) is not None
    assert store.touch_web_session("b" * 64, 1100.0, idle=60.0) is None  # its lifetime is over
    assert store.touch_web_session("nope", 1000.0, idle=60.0) is None


def test_web_sessions_end_and_the_oldest_make_room(store: StateStore) -> None:
    for i in range(3):
        store.add_web_session(web_session(str(i) * 64, created_at=1000.0 + i), idle=600.0, max_sessions=3)
    assert store.count_web_sessions() == 3
    store.add_web_session(web_session("n" * 64, created_at=1010.0), idle=600.0, max_sessions=3)
    assert store.count_web_sessions() == 3
    assert store.touch_web_session("0" * 64, 1011.0, idle=600.0) is None  # the oldest made room
    ended = store.end_web_session("1" * 64)
    assert ended is not None and ended.key == "1" * 64
    assert store.end_web_session("1" * 64) is None
    assert store.touch_web_session("1" * 64, 1011.0, idle=600.0) is None
    # signing in drops sessions that already ended, before counting the capacity
    store.add_web_session(web_session("x" * 64, created_at=5000.0), idle=600.0, max_sessions=3)
    assert store.count_web_sessions() == 1


# -- PostgreSQL only -------------------------------------------------------------------------------

def test_postgres_errors_and_logs_never_show_the_password(pg_server: PgServer,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    url = pg_server.url("no_such_database")
    with pytest.raises(StateUnavailable) as info:
        PostgresStore(url, timeout=2.0)
    assert pg_server.password not in info.value.message
    assert "127.0.0.1" in info.value.message and "no_such_database" in info.value.message
    assert pg_server.password not in caplog.text
    assert pg_server.password not in repr(info.value)


@pytest.mark.postgres
def test_postgres_outage_fails_closed_and_recovers_without_a_new_store() -> None:
    server = start_postgres()  # its own server: this test stops it
    try:
        url = server.create_database()
        with PostgresStore(url, timeout=2.0) as s:
            s.add_token(token())
            server.stop("fast")
            assert not s.ping()
            with pytest.raises(StateUnavailable) as info:
                s.update_token("ci", revoked=True)
            assert server.password not in info.value.message
            with pytest.raises(StateUnavailable):
                s.list_tokens()
            server.start()
            wait_for(s.ping, "the pool reconnecting after PostgreSQL came back")
            assert s.update_token("ci", revoked=True).revoked
    finally:
        discard(server)


def test_rows_kept_before_caller_keys_match_no_caller(location: str, engine: str) -> None:
    """A store at schema 7 (before caller keys) is migrated on open: its idempotency keys and tasks,
    kept under a display name, match no caller afterwards (a key ``idadmin`` used by the token named so
    is nobody's, not the token's nor an identity provider's client showing that name)."""
    from gateway.store import postgres, sqlite
    from gateway.store.idempotency_keys import KeyTable
    from gateway.store.task_records import TaskTable
    old = (sqlite.MIGRATIONS if engine == "sqlite" else postgres.MIGRATIONS)[:7]
    rows = ("INSERT INTO idempotency_keys (caller, key, tool, digest, running, created_at) "
            "VALUES ('idadmin', 'k1', 'delete_vm', 'd1', 0, 1.0)",
            "INSERT INTO mcp_tasks (task_id, caller, tool, status, created_at, updated_at, keep_until) "
            "VALUES ('t1', 'idadmin', 'clone_vm', 'working', 1.0, 1.0, 9e18)")
    if engine == "sqlite":
        Path(location).parent.mkdir(mode=0o700)
        raw = sqlite3.connect(location, isolation_level=None)
        for _, statements in old:
            for statement in statements:
                raw.execute(statement)
        raw.execute("PRAGMA user_version=7")
        for row in rows:
            raw.execute(row)
        raw.close()
    else:
        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("CREATE TABLE schema_version (one boolean PRIMARY KEY DEFAULT true CHECK (one), "
                         "version integer NOT NULL)")
            for _, statements in old:
                for statement in statements:
                    conn.execute(statement)
            conn.execute("INSERT INTO schema_version (one, version) VALUES (true, 7)")
            for row in rows:
                conn.execute(row)
    with closing(open_store_at(location)) as s:
        assert s.schema_version() == (sqlite if engine == "sqlite" else postgres).SCHEMA_VERSION >= 8
        mark = "?" if engine == "sqlite" else "%s"
        keys, tasks = KeyTable(s, placeholder=mark), TaskTable(s, placeholder=mark)  # type: ignore[arg-type]
        for who in ("idadmin", "token::idadmin", "system::idadmin"):
            assert keys.get(who, "k1") is None
            assert tasks.of_caller(who, 2.0) == []
        kept = tasks.get("t1", 2.0)
        assert kept is not None and kept.caller == "idadmin" and kept.caller_key is None
        assert keys.get("unkeyed:idadmin", "k1") is not None  # kept, under a text no key has
