"""Approval-page sessions kept in the state store, on both engines: a person signed in through one
replica is signed in through another on the same database, and stays signed in across a restart."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import psycopg
import pytest
from support.postgres import open_store_at

from gateway.auth.tokens import Principal
from gateway.web.session import SessionStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "home" / "state.db")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def replicas(location: str, clock: Clock) -> Iterator[tuple[SessionStore, SessionStore]]:
    a, b = open_store_at(location), open_store_at(location)
    yield (SessionStore(lifetime=3600, idle=600, clock=clock, store=a),
           SessionStore(lifetime=3600, idle=600, clock=clock, store=b))
    a.close()
    b.close()


ANN = Principal("ann", "approver", token_id="tokann")


def test_signed_in_on_one_replica_is_signed_in_on_the_other(replicas: tuple[SessionStore, SessionStore],
                                                            clock: Clock) -> None:
    a, b = replicas
    session = a.create(ANN)
    clock.now += 30
    seen = b.get(session.id)
    assert seen is not None
    assert (seen.id, seen.token_id, seen.name, seen.csrf) == (session.id, "tokann", "ann", session.csrf)
    assert seen.last_seen == clock.now
    assert len(a) == len(b) == 1
    assert b.end(session.id) is not None  # sign out through B ...
    assert a.get(session.id) is None  # ... is signed out through A


def test_a_session_survives_a_restart(location: str, clock: Clock) -> None:
    with closing(open_store_at(location)) as before:
        session = SessionStore(clock=clock, store=before).create(ANN)
    clock.now += 60
    with closing(open_store_at(location)) as after:  # a new process on the same database
        found = SessionStore(clock=clock, store=after).get(session.id)
    assert found is not None and found.csrf == session.csrf


def test_idle_and_lifetime_hold_across_replicas(replicas: tuple[SessionStore, SessionStore],
                                                clock: Clock) -> None:
    a, b = replicas
    session = a.create(ANN)
    clock.now += 599
    assert b.get(session.id) is not None  # used through B: A sees it busy too
    clock.now += 599
    assert a.get(session.id) is not None
    clock.now += 600
    assert b.get(session.id) is None  # idle for 600 s
    other = a.create(ANN)
    for _ in range(7):
        clock.now += 500
        assert (a if _ % 2 else b).get(other.id) is not None
    clock.now += 200  # 3700 s after sign-in: past the lifetime however busy
    assert b.get(other.id) is None


def test_the_store_keeps_no_session_id_or_cookie_value(location: str, clock: Clock) -> None:
    with closing(open_store_at(location)) as store:
        session = SessionStore(clock=clock, store=store).create(ANN)
    if location.startswith("postgresql://"):
        with psycopg.connect(location) as conn:
            dump = repr(conn.execute("SELECT * FROM web_sessions").fetchall())
    else:
        with closing(sqlite3.connect(location)) as conn:
            dump = repr(conn.execute("SELECT * FROM web_sessions").fetchall())
    assert "tokann" in dump
    assert session.id not in dump
