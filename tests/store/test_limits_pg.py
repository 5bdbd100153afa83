"""Rate limits and the runaway breaker counted across replicas, on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.postgres import wait_for

from gateway.errors import RateLimited
from gateway.store.limits_pg import PgRateLimiter, PgRunawayBreaker
from gateway.store.postgres import PostgresStore
from gateway.vocabulary import Category


@pytest.fixture
def replicas(pg_url: str) -> Iterator[tuple[PostgresStore, PostgresStore]]:
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    yield a, b
    a.close()
    b.close()


def test_a_per_caller_limit_counts_each_caller_apart_on_every_replica(
        replicas: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = (PgRateLimiter(s) for s in replicas)
    a.check("vc1", Category.READ, 2, caller="reader", target_limit=4)
    b.check("vc1", Category.READ, 2, caller="reader", target_limit=4)
    with pytest.raises(RateLimited, match="caller 'reader'"):
        a.check("vc1", Category.READ, 2, caller="reader", target_limit=4)
    b.check("vc1", Category.READ, 2, caller="admin", target_limit=4)  # the admin's budget is its own
    a.check("vc1", Category.READ, 2, caller="admin", target_limit=4)
    with pytest.raises(RateLimited, match=r"target_max_calls_per_minute\.read"):
        b.check("vc1", Category.READ, 2, caller="third", target_limit=4)  # 4 reads of all callers: ceiling
    b.check("vc1", Category.READ, 2, caller="third")  # the refusal above spent nothing of third's budget


def test_a_rate_limit_counts_the_calls_of_every_replica(
        replicas: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = (PgRateLimiter(s) for s in replicas)
    a.check("vc1", Category.WRITE, 3)
    b.check("vc1", Category.WRITE, 3)
    a.check("vc1", Category.WRITE, 3)
    with pytest.raises(RateLimited, match="at most 3 write calls per minute") as info:
        b.check("vc1", Category.WRITE, 3)
    assert 0 < info.value.retry_after <= 60
    with pytest.raises(RateLimited):
        a.check("vc1", Category.WRITE, 3)  # a refused call used up nothing, and is still refused
    b.check("vc1", Category.DESTRUCTIVE, 3)  # another category ...
    b.check("vc2", Category.WRITE, 3)  # ... and another target are not affected
    b.check("vc1", Category.WRITE, None)  # no limit: nothing counted


def test_the_window_rolls(replicas: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = (PgRateLimiter(s, window=0.5) for s in replicas)
    a.check("vc1", Category.WRITE, 1)
    with pytest.raises(RateLimited):
        b.check("vc1", Category.WRITE, 1)

    def admitted() -> bool:
        try:
            b.check("vc1", Category.WRITE, 1)
        except RateLimited:
            return False
        return True

    wait_for(admitted, "the call leaving the window")


def test_the_breaker_trips_on_repeats_across_replicas(replicas: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = (PgRunawayBreaker(s, max_repeats=3, window=60, cooldown=120) for s in replicas)
    for breaker in (a, b, a):
        breaker.check("agent", "power_off_vm", "d1", Category.WRITE)
    with pytest.raises(RateLimited, match="runaway protection") as info:
        b.check("agent", "power_off_vm", "d1", Category.WRITE)
    assert info.value.details["limit"] == "runaway_breaker"
    with pytest.raises(RateLimited):
        a.check("agent", "power_off_vm", "d1", Category.WRITE)  # tripped on every replica
    a.check("agent", "power_off_vm", "d2", Category.WRITE)  # a different call is not affected
    for _ in range(10):
        a.check("agent", "list_vms", "d1", Category.READ)  # reads are never counted
    assert a.tracked_keys() == 2


def test_a_tripped_breaker_cools_down(replicas: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = (PgRunawayBreaker(s, max_repeats=1, window=60, cooldown=0.5) for s in replicas)
    a.check("agent", "delete_vm", "d", Category.DESTRUCTIVE)
    with pytest.raises(RateLimited):
        b.check("agent", "delete_vm", "d", Category.DESTRUCTIVE)

    def admitted() -> bool:
        try:
            a.check("agent", "delete_vm", "d", Category.DESTRUCTIVE)
        except RateLimited:
            return False
        return True

    wait_for(admitted, "the cooldown to pass")
