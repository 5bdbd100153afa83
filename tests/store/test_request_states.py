"""The request-state tables (``gateway.store.request_states.RequestStates``) on a real SQLite store: one
sealing secret shared by every process on the store, a state spent once, and spent rows swept after
their expiry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.store.request_states import RequestStates
from gateway.store.sqlite import SqliteStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "state.db")
    try:
        yield opened
    finally:
        opened.close()


def test_the_secret_is_made_once_and_read_by_every_process_on_the_store(
    store: SqliteStore, tmp_path: Path
) -> None:
    first = RequestStates(store, placeholder="?").secret(now=100.0)
    other = SqliteStore(tmp_path / "state.db")  # another process's store on the same file
    try:
        assert RequestStates(other, placeholder="?").secret(now=200.0) == first
    finally:
        other.close()
    assert len(first) == 32 and first != bytes(32)


def test_a_state_is_spent_once(store: SqliteStore) -> None:
    states = RequestStates(store, placeholder="?")
    assert states.spend("s1", "token::t1", "p1", now=100.0, expires_at=200.0)
    assert not states.spend("s1", "token::t1", "p1", now=101.0, expires_at=200.0)
    assert not states.spend("s1", "token::t2", "p2", now=102.0, expires_at=300.0)  # whoever presents it
    assert states.spend("s2", "token::t1", "p1", now=103.0, expires_at=200.0)


def test_spent_states_go_after_their_expiry(store: SqliteStore) -> None:
    states = RequestStates(store, placeholder="?")
    states.spend("old", "token::t1", "p1", now=100.0, expires_at=150.0)
    states.spend("new", "token::t1", "p2", now=100.0, expires_at=500.0)
    assert states.sweep(now=200.0) == 1
    assert not states.spend("new", "token::t1", "p2", now=201.0, expires_at=500.0)
