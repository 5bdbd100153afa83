"""Per-target call slots and the single leader across replicas, on a real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from support.postgres import wait_for

from gateway.errors import QueueTimeout
from gateway.store.slots import PgInstance, PgLeader, PgSlots, lock_key

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def slots(pg_url: str) -> Iterator[PgSlots]:
    s = PgSlots(pg_url)
    yield s
    s.close()


def test_lock_keys_are_stable_and_distinct() -> None:
    assert lock_key("slot", "vc1") == lock_key("slot", "vc1")
    assert len({lock_key("slot", f"vc{i}") for i in range(1000)}) == 1000
    assert lock_key("slot", "vc1") != lock_key("leader", "vc1")


def test_a_full_target_times_out_and_a_released_slot_is_taken(slots: PgSlots, pg_url: str) -> None:
    other = PgSlots(pg_url)  # another replica
    try:
        held = [slots.acquire("vc1", 2, timeout=5) for _ in range(2)]
        assert sorted(s.index for s in held) == [0, 1]
        with pytest.raises(QueueTimeout, match="pool_size"):
            other.acquire("vc1", 2, timeout=0.3)
        assert other.acquire("vc2", 1, timeout=1).index == 0  # another target is not affected
        slots.release(held[0])
        taken = other.acquire("vc1", 2, timeout=5)
        assert taken.index == held[0].index
    finally:
        other.close()


_HOLDERS = """
import os, sys, threading
import psycopg
from gateway.store.slots import PgSlots
slots = PgSlots(os.environ["STORE_AT"])
def work():
    with psycopg.connect(os.environ["STORE_AT"], autocommit=True) as counter:
        for _ in range(int(sys.argv[1])):
            slot = slots.acquire("vc1", 1, timeout=60)
            counter.execute("UPDATE inflight SET now = now + 1, peak = greatest(peak, now + 1)")
            counter.execute("SELECT pg_sleep(0.005)")  # the call's own duration
            counter.execute("UPDATE inflight SET now = now - 1")
            slots.release(slot)
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_two_replicas_never_exceed_the_pool_size_together(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE inflight (now int NOT NULL, peak int NOT NULL)")
        conn.execute("INSERT INTO inflight VALUES (0, 0)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STORE_AT": pg_url}
    procs = [subprocess.Popen([sys.executable, "-c", _HOLDERS, "25"], env=env) for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with psycopg.connect(pg_url) as conn:
        now, peak = conn.execute("SELECT now, peak FROM inflight").fetchone() or (None, None)
    assert (now, peak) == (0, 1), "pool_size 1: never two calls at once, across 2 replicas x 4 threads"


_DIER = """
import os, sys
from gateway.store.slots import PgSlots, PgLeader
slots = PgSlots(os.environ["STORE_AT"])
held = slots.acquire("vc1", 1, timeout=10)
leader = PgLeader(os.environ["STORE_AT"], "sweeper")
assert leader.is_leader()
print("holding", flush=True)
sys.stdin.read()
"""


def test_a_replica_that_dies_releases_its_slots_and_its_leadership(slots: PgSlots, pg_url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STORE_AT": pg_url}
    proc = subprocess.Popen([sys.executable, "-c", _DIER], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    leader = PgLeader(pg_url, "sweeper")
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        with pytest.raises(QueueTimeout):
            slots.acquire("vc1", 1, timeout=0.3)
        assert not leader.is_leader()
        proc.kill()  # kill -9: no goodbye to the database
        proc.wait(timeout=30)
        slot = slots.acquire("vc1", 1, timeout=30)
        slots.release(slot)
        wait_for(leader.is_leader, "the survivor taking over the leadership")
        assert leader.is_leader()
    finally:
        if proc.poll() is None:
            proc.kill()
        leader.close()


def test_exactly_one_leader_among_many(pg_url: str) -> None:
    leaders = [PgLeader(pg_url, "sweeper") for _ in range(5)]
    try:
        results: list[bool] = []
        threads = [threading.Thread(target=lambda lead=lead: results.append(lead.is_leader()))
                   for lead in leaders]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert results.count(True) == 1
        assert [lead.is_leader() for lead in leaders].count(True) == 1  # and it stays the leader
    finally:
        for lead in leaders:
            lead.close()


_CLAIMER = """
import os, sys
from gateway.store.slots import PgInstance
instance = PgInstance(os.environ["STORE_AT"])
print(instance.acquire(), flush=True)
sys.stdin.read()
"""


def test_a_claim_of_a_live_replica_on_another_host_is_alive_until_it_dies(pg_url: str) -> None:
    """Replicas share no directory: liveness of another replica's claim must come from the database."""
    here = PgInstance(pg_url)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STORE_AT": pg_url}
    proc = subprocess.Popen([sys.executable, "-c", _CLAIMER], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        theirs = proc.stdout.readline().strip()
        assert theirs and theirs != here.acquire()
        assert here.alive(theirs), "a live replica's claim must never be settled"
        assert here.alive(here.id)
        assert not here.alive("12345-000000000000")  # nobody holds it
        proc.kill()  # kill -9
        proc.wait(timeout=30)
        wait_for(lambda: not here.alive(theirs), "the dead replica's claim to show as dead")
    finally:
        if proc.poll() is None:
            proc.kill()
        here.close()
