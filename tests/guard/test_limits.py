"""Rate limits, bulk limit and runaway breaker, driven by a plain-number clock."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from support.gateway_env import HUMAN, PERMISSIVE, Env

from gateway.auth.tokens import Principal
from gateway.errors import (
    PolicyDenied,
    RateLimited,
)
from gateway.guard.limits import RateLimiter, RunawayBreaker, check_bulk
from gateway.vocabulary import Category

W, D, R = Category.WRITE, Category.DESTRUCTIVE, Category.READ


RateCall = tuple[str, Category, int | None, float]


def outcomes(limiter: RateLimiter, calls: Sequence[RateCall]) -> list[object]:
    """'ok' or the retry_after of each call, in order."""
    out: list[object] = []
    for target, category, limit, now in calls:
        try:
            limiter.check(target, category, limit, now)
            out.append("ok")
        except RateLimited as exc:
            out.append(round(exc.retry_after, 3))
    return out


RATE_CASES: list[tuple[str, Sequence[RateCall], Sequence[object]]] = [
    ("unlimited", [("a", R, None, 0.0)] * 50, ["ok"] * 50),
    ("fills-then-refuses", [("a", W, 3, 0.0), ("a", W, 3, 1.0), ("a", W, 3, 2.0), ("a", W, 3, 3.0)],
     ["ok", "ok", "ok", 57.0]),
    ("frees-when-oldest-expires", [("a", W, 2, 0.0), ("a", W, 2, 10.0), ("a", W, 2, 59.9), ("a", W, 2, 60.0)],
     ["ok", "ok", 0.1, "ok"]),
    ("refusals-use-no-capacity", [("a", W, 1, 0.0), ("a", W, 1, 30.0), ("a", W, 1, 59.0), ("a", W, 1, 60.0)],
     ["ok", 30.0, 1.0, "ok"]),
    ("per-target", [("a", W, 1, 0.0), ("b", W, 1, 0.0), ("a", W, 1, 1.0)], ["ok", "ok", 59.0]),
    ("per-category", [("a", W, 1, 0.0), ("a", D, 1, 0.0), ("a", D, 1, 1.0)], ["ok", "ok", 59.0]),
    ("lowered-limit", [("a", W, 5, float(t)) for t in range(5)] + [("a", W, 2, 10.0)], ["ok"] * 5 + [53.0]),
]


@pytest.mark.parametrize(("calls", "expected"), [c[1:] for c in RATE_CASES], ids=[c[0] for c in RATE_CASES])
def test_rate_limiter(calls: Sequence[RateCall], expected: Sequence[object]) -> None:
    assert outcomes(RateLimiter(), calls) == expected


CallerCall = tuple[str | None, int | None, int | None, float]
"""(caller, per-caller limit, target-wide ceiling, now) of a write on target 'a'."""

CALLER_CASES: list[tuple[str, Sequence[CallerCall], Sequence[object]]] = [
    ("callers-count-apart", [("r", 2, None, 0.0), ("r", 2, None, 1.0), ("r", 2, None, 2.0),
                             ("admin", 2, None, 3.0)], ["ok", "ok", 58.0, "ok"]),
    ("ceiling-counts-all", [("r", 5, 2, 0.0), ("admin", 5, 2, 1.0), ("x", 5, 2, 2.0)], ["ok", "ok", 58.0]),
    ("ceiling-refusal-spends-no-caller-budget", [("r", 1, 1, 0.0), ("s", 1, 1, 1.0), ("s", 1, None, 2.0)],
     ["ok", 59.0, "ok"]),
    ("caller-refusal-spends-no-ceiling", [("r", 1, 2, 0.0), ("r", 1, 2, 1.0), ("s", 1, 2, 2.0)],
     ["ok", 59.0, "ok"]),
    ("ceiling-alone", [("r", None, 1, 0.0), ("s", None, 1, 1.0)], ["ok", 59.0]),
]


@pytest.mark.parametrize(("calls", "expected"), [c[1:] for c in CALLER_CASES],
                         ids=[c[0] for c in CALLER_CASES])
def test_rate_limits_per_caller_and_target_ceiling(calls: Sequence[CallerCall],
                                                   expected: Sequence[object]) -> None:
    limiter = RateLimiter()
    out: list[object] = []
    for caller, limit, ceiling, now in calls:
        try:
            limiter.check("a", W, limit, now, caller=caller, target_limit=ceiling)
            out.append("ok")
        except RateLimited as exc:
            out.append(round(exc.retry_after, 3))
    assert out == expected


def test_rate_limited_error_names_the_limit_and_fix() -> None:
    limiter = RateLimiter()
    limiter.check("prod", W, 1, 0.0)
    with pytest.raises(RateLimited) as info:
        limiter.check("prod", W, 1, 12.5)
    wire = info.value.to_wire()
    assert wire["code"] == "rate_limited" and wire["retry_after_seconds"] == 47.5
    assert "target 'prod'" in wire["message"] and "max_calls_per_minute.write" in wire["message"]


def test_rate_limiter_forgets_idle_keys() -> None:
    limiter = RateLimiter()
    for index in range(1000):
        limiter.check(f"t{index}", W, 10, 0.0)
    assert limiter.tracked_keys() == 1000
    for _ in range(300):
        limiter.check("busy", W, None, 100.0)  # unlimited checks record nothing and sweep nothing
    assert limiter.tracked_keys() == 1000
    for index in range(300):
        limiter.check("busy", W, 1000, 100.0 + index / 1000)
    assert limiter.tracked_keys() == 1


def test_rate_limiter_is_exact_under_threads() -> None:
    limiter = RateLimiter()
    allowed: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = 0
        for _ in range(200):
            try:
                limiter.check("prod", W, 250, 0.0)
                mine += 1
            except RateLimited:
                pass
        with lock:
            allowed.append(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(allowed) == 250


# --------------------------------------------------------------------------- runaway breaker

Call = tuple[str, str, str, Category, float]


def breaker_outcomes(breaker: RunawayBreaker, calls: Sequence[Call]) -> list[object]:
    out: list[object] = []
    for caller, tool, digest, category, now in calls:
        try:
            breaker.check(caller, tool, digest, category, now)
            out.append("ok")
        except RateLimited as exc:
            out.append(round(exc.retry_after, 3))
    return out


def same(n: int, start: float = 0.0, step: float = 1.0, caller: str = "bot", digest: str = "d1",
         category: Category = W) -> list[Call]:
    return [(caller, "power_off_vm", digest, category, start + i * step) for i in range(n)]


BREAKER_CASES: list[tuple[str, Sequence[Call], Sequence[object]]] = [
    ("five-repeats-pass", same(5), ["ok"] * 5),
    ("sixth-trips", same(6), ["ok"] * 5 + [120.0]),
    ("stays-tripped", same(6) + same(2, start=10.0, step=50.0), ["ok"] * 5 + [120.0, 115.0, 65.0]),
    ("cooldown-ends-and-resets", same(6) + same(6, start=125.0),
     ["ok"] * 5 + [120.0] + ["ok"] * 5 + [120.0]),
    ("spread-out-never-trips", same(20, step=15.0), ["ok"] * 20),
    ("reads-never-counted", same(50, category=R), ["ok"] * 50),
    ("different-args-independent", same(5) + same(1, start=5.0, digest="d2") + same(1, start=6.0),
     ["ok"] * 6 + [120.0]),
    ("different-callers-independent", same(5) + same(5, caller="other") + same(1, start=9.0, caller="other"),
     ["ok"] * 10 + [120.0]),
    ("destructive-counted", same(6, category=D), ["ok"] * 5 + [120.0]),
]


@pytest.mark.parametrize(("calls", "expected"), [c[1:] for c in BREAKER_CASES],
                         ids=[c[0] for c in BREAKER_CASES])
def test_runaway_breaker(calls: Sequence[Call], expected: Sequence[object]) -> None:
    assert breaker_outcomes(RunawayBreaker(max_repeats=5, window=60.0, cooldown=120.0), calls) == expected


def test_runaway_error_is_distinguishable() -> None:
    breaker = RunawayBreaker(max_repeats=1)
    breaker.check("bot", "reset_vm", "d", W, 0.0)
    with pytest.raises(RateLimited) as info:
        breaker.check("bot", "reset_vm", "d", W, 1.0)
    wire = info.value.to_wire()
    assert wire["code"] == "rate_limited" and wire["limit"] == "runaway_breaker"
    assert "caller 'bot'" in wire["message"] and "reset_vm" in wire["message"]


def test_runaway_breaker_forgets_idle_entries() -> None:
    breaker = RunawayBreaker()
    for index in range(500):
        breaker.check("bot", "create_snapshot", f"d{index}", W, 0.0)
    assert breaker.tracked_keys() == 500
    for index in range(300):
        breaker.check("bot", "create_snapshot", "late", W, 1000.0 + index * 61.0)
    assert breaker.tracked_keys() == 1


@pytest.mark.parametrize("kwargs", [{"max_repeats": 0}, {"window": 0.0}, {"cooldown": -1.0}])
def test_runaway_breaker_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RunawayBreaker(**kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- bulk

@pytest.mark.parametrize(("count", "limit", "denied"), [
    (20, 20, False), (21, 20, True), (0, 1, False), (10_000, None, False), (2, 1, True),
])
def test_check_bulk(count: int, limit: int | None, denied: bool) -> None:
    if not denied:
        check_bulk(count, limit, "prod")
        return
    with pytest.raises(PolicyDenied) as info:
        check_bulk(count, limit, "prod")
    wire = info.value.to_wire()
    assert wire["code"] == "policy_denied" and wire["rule"] == "limits:max_bulk_objects"
    assert (wire["count"], wire["limit"], wire["target"]) == (count, limit, "prod")
    assert f"batches of at most {limit}" in wire["message"]


# ---------------------------------------------------------------- read limits in the pipeline


@pytest.mark.anyio
async def test_read_rate_limit_is_enforced(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"max_calls_per_minute": {"read": 2}}}})
    reader = Principal(name="watcher", role="reader", surface="test")
    for _ in range(2):
        await gw.calls.call(reader, "list_vms", {"target": "vc1"})
    with pytest.raises(RateLimited):
        await gw.calls.call(reader, "list_vms", {"target": "vc1"})


@pytest.mark.anyio
async def test_one_callers_reads_never_spend_another_callers_budget(env: Env) -> None:
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"max_calls_per_minute": {"read": 3}}}})
    reader = Principal(name="watcher", role="reader", surface="test")
    for _ in range(3):
        await gw.calls.call(reader, "list_vms", {"target": "vc1"})
    with pytest.raises(RateLimited) as spent:
        await gw.calls.call(reader, "list_vms", {"target": "vc1"})
    assert (await gw.calls.call(HUMAN, "list_vms", {"target": "vc1"}))["count"] >= 2  # alice's own budget
    assert "caller 'watcher'" in spent.value.message


@pytest.mark.anyio
async def test_the_target_wide_ceiling_counts_every_caller_together(env: Env) -> None:
    limits = {"max_calls_per_minute": {"read": 5}, "target_max_calls_per_minute": {"read": 3}}
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": limits}})
    callers = [Principal(name=f"agent-{i}", role="reader", surface="test") for i in range(3)]
    for caller in callers:
        await gw.calls.call(caller, "list_vms", {"target": "vc1"})
    with pytest.raises(RateLimited, match=r"target_max_calls_per_minute\.read"):
        await gw.calls.call(HUMAN, "list_vms", {"target": "vc1"})
    (row,) = env.rows(phase="denied", tool="list_vms")
    assert row["caller"] == "alice" and row["error_code"] == "rate_limited"
