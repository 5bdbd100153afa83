"""The idempotency keys table (``gateway.store.idempotency_keys.KeyTable``) on a real SQLite store: an atomic
claim per (caller, key), taking over an expired row, keeping the outcome, releasing and sweeping."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.guard.idempotency_rules import Seen
from gateway.store.idempotency_keys import KeyRecord, KeyTable
from gateway.store.sqlite import SqliteStore

REC = KeyRecord(caller="token::t1", key="k1", tool="clone_vm", digest="d1", running=True, created_at=100.0,
                correlation_id="cid-1", owner="1234-abc")


@pytest.fixture
def keys(tmp_path: Path) -> Iterator[KeyTable]:
    store = SqliteStore(tmp_path / "state.db")
    try:
        yield KeyTable(store, placeholder="?")
    finally:
        store.close()


def test_an_unknown_key_reads_none(keys: KeyTable) -> None:
    assert keys.get("token::t1", "k1") is None


def test_a_claim_stores_a_running_row(keys: KeyTable) -> None:
    assert keys.claim(REC)
    assert keys.get("token::t1", "k1") == REC


def test_a_second_claim_of_the_same_key_loses(keys: KeyTable) -> None:
    assert keys.claim(REC)
    assert not keys.claim(replace(REC, digest="other", created_at=101.0))
    found = keys.get("token::t1", "k1")
    assert found is not None and found.digest == "d1"


def test_keys_are_per_caller(keys: KeyTable) -> None:
    assert keys.claim(REC)
    assert keys.claim(replace(REC, caller="token::t2"))
    assert keys.get("token::t2", "k1") is not None


def test_finish_keeps_the_outcome_of_the_run_that_claimed(keys: KeyTable) -> None:
    keys.claim(REC)
    keys.finish("token::t1", "k1", 100.0, '{"ok":true}', failed=False, now=105.0)
    found = keys.get("token::t1", "k1")
    assert found is not None
    assert (found.running, found.outcome, found.failed) == (False, '{"ok":true}', False)


def test_finish_of_a_failed_run_says_so(keys: KeyTable) -> None:
    keys.claim(REC)
    keys.finish("token::t1", "k1", 100.0, '{"error":{}}', failed=True, now=105.0)
    found = keys.get("token::t1", "k1")
    assert found is not None and found.failed


def test_finish_of_another_run_changes_nothing(keys: KeyTable) -> None:
    keys.claim(REC)
    keys.finish("token::t1", "k1", 99.0, "late", failed=False, now=105.0)
    assert keys.get("token::t1", "k1") == REC


def test_a_claim_replacing_the_expired_row_takes_it_over(keys: KeyTable) -> None:
    keys.claim(REC)
    keys.finish("token::t1", "k1", 100.0, "old", failed=False, now=105.0)
    newer = replace(REC, tool="power_on_vm", digest="d2", created_at=200.0, owner="5678-def")
    assert keys.claim(newer, replacing=100.0)
    assert keys.get("token::t1", "k1") == newer


def test_a_claim_replacing_a_row_taken_over_already_loses(keys: KeyTable) -> None:
    keys.claim(REC)
    assert keys.claim(replace(REC, created_at=200.0), replacing=100.0)
    assert not keys.claim(replace(REC, created_at=201.0), replacing=100.0)
    found = keys.get("token::t1", "k1")
    assert found is not None and found.created_at == 200.0


def test_release_forgets_the_claim(keys: KeyTable) -> None:
    keys.claim(REC)
    keys.release("token::t1", "k1", 100.0)
    assert keys.get("token::t1", "k1") is None
    assert keys.claim(REC)


def test_release_of_another_run_keeps_the_row(keys: KeyTable) -> None:
    keys.claim(REC)
    keys.release("token::t1", "k1", 50.0)
    assert keys.get("token::t1", "k1") is not None


def test_sweep_drops_finished_keys_older_than_the_window(keys: KeyTable) -> None:
    old = replace(REC, key="old", created_at=10.0)
    young = replace(REC, key="young", created_at=90.0)
    running = replace(REC, key="running", created_at=10.0)
    for rec in (old, young, running):
        keys.claim(rec)
    keys.finish("token::t1", "old", 10.0, "x", failed=False, now=11.0)
    keys.finish("token::t1", "young", 90.0, "x", failed=False, now=91.0)
    assert keys.sweep(older_than=50.0) == 1
    assert keys.get("token::t1", "old") is None
    assert keys.get("token::t1", "young") is not None
    assert keys.get("token::t1", "running") is not None


def test_sweep_of_nothing_is_zero(keys: KeyTable) -> None:
    assert keys.sweep(older_than=1e12) == 0


def test_seen_is_what_the_decision_reads() -> None:
    assert REC.seen() == Seen("clone_vm", "d1", True, 100.0, True)
    assert REC.seen(owner_alive=False).owner_alive is False


def test_the_default_placeholder_is_postgresql_s(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    try:
        table = KeyTable(store)
        assert table._sql("a = %s") == "a = %s"
        assert KeyTable(store, placeholder="?")._sql("a = %s AND b = %s") == "a = ? AND b = ?"
    finally:
        store.close()
