"""Rate limits and the runaway breaker counted across replicas, in PostgreSQL.

The contracts of ``gateway.guard.limits``, but each check is one transaction under a per-key advisory
lock, and time is the database's clock (replicas' monotonic clocks differ), so ``now`` is ignored.
Blocking: call from a worker thread.
"""

from __future__ import annotations

from typing import Any, Final, cast

import psycopg

from gateway.errors import RateLimited
from gateway.guard.limits import RATE_WINDOW_SECONDS, RateLimiter, RunawayBreaker, budgets
from gateway.store.postgres import PostgresStore
from gateway.store.slots import lock_key
from gateway.vocabulary import Category

__all__ = ["PgRateLimiter", "PgRunawayBreaker"]

#: first keys of the advisory locks serialising one rate key / one breaker key
RATE_SPACE: Final = 0x7261  # "ra"
BREAKER_SPACE: Final = 0x6272  # "br"
#: how many checks pass between two sweeps of stale rows
_SWEEP_EVERY: Final = 256


def _clock(db: psycopg.Connection[Any]) -> float:
    row = cast("dict[str, Any]", db.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS t")
               .fetchone())
    return float(row["t"])


class PgRateLimiter(RateLimiter):
    """At most ``limit`` calls per rolling minute for each (caller, target, category), and
    ``target_limit`` for each (target, category), across all replicas."""

    def __init__(self, store: PostgresStore, window: float = RATE_WINDOW_SECONDS) -> None:
        super().__init__(window)
        self.store = store

    def check(self, target: str, category: Category, limit: int | None, now: float = 0.0, *,
              caller: str | None = None, target_limit: int | None = None, shown: str | None = None) -> None:
        """Record the call in every budget it spends, or raise ``RateLimited`` for the first full one,
        recording nothing (``now`` is ignored: the database's clock counts)."""
        spent = budgets(target, category, limit, caller, target_limit, shown)
        if not spent:
            return
        refusal: RateLimited | None = None
        with self.store._write("check a rate limit") as db:
            for lock in sorted({lock_key("rate", b.key) for b in spent}):  # one order: no deadlock
                db.execute("SELECT pg_advisory_xact_lock(%s, %s)", (RATE_SPACE, lock))
            t = _clock(db)
            for budget in spent:
                db.execute("DELETE FROM rate_events WHERE key = %s AND at <= %s",
                           (budget.key, t - self._window))
                times = [float(cast("dict[str, Any]", r)["at"]) for r in db.execute(
                    "SELECT at FROM rate_events WHERE key = %s ORDER BY at", (budget.key,)).fetchall()]
                if len(times) >= budget.limit:
                    refusal = budget.refusal(max(times[len(times) - budget.limit] + self._window - t, 0.0))
                    break
            else:
                for budget in spent:
                    db.execute("INSERT INTO rate_events (key, at) VALUES (%s, %s)", (budget.key, t))
        if refusal is not None:
            raise refusal

    def tracked_keys(self) -> int:
        rows = self.store._read("count rate keys", "SELECT count(DISTINCT key) AS n FROM rate_events")
        return int(rows[0]["n"])


class PgRunawayBreaker(RunawayBreaker):
    """``RunawayBreaker`` whose repeats are counted across replicas (same refusal, same limits)."""

    def __init__(self, store: PostgresStore, max_repeats: int = 5, window: float = 60.0,
                 cooldown: float = 120.0) -> None:
        super().__init__(max_repeats, window, cooldown)
        self.store = store

    def check(self, caller: str, tool: str, args_digest: str, category: Category, now: float = 0.0, *,
              shown: str | None = None) -> None:
        """Count an identical write; raise ``RateLimited`` while tripped for it (``now`` is ignored)."""
        if category is Category.READ:
            return
        key = f"{caller}\x1f{tool}\x1f{args_digest}"
        refusal: RateLimited | None = None
        with self.store._write("check the runaway breaker") as db:
            db.execute("SELECT pg_advisory_xact_lock(%s, %s)", (BREAKER_SPACE, lock_key("breaker", key)))
            t = _clock(db)
            found = db.execute("SELECT times, tripped_until FROM breaker_state WHERE key = %s",
                               (key,)).fetchone()
            row = cast("dict[str, Any] | None", found)
            times = [float(x) for x in row["times"]] if row else []
            tripped_until = float(row["tripped_until"]) if row else 0.0
            if t < tripped_until:
                refusal = self._refusal(shown or caller, tool, tripped_until - t)
            else:
                if tripped_until:
                    times, tripped_until = [], 0.0
                times = [x for x in times if x > t - self._window] + [t]
                if len(times) > self._max_repeats:
                    times, tripped_until = [], t + self._cooldown
                    refusal = self._refusal(shown or caller, tool, self._cooldown)
                db.execute("INSERT INTO breaker_state (key, times, tripped_until) VALUES (%s, %s, %s) "
                           "ON CONFLICT (key) DO UPDATE SET times = EXCLUDED.times, "
                           "tripped_until = EXCLUDED.tripped_until", (key, times, tripped_until))
            self._checks += 1
            if self._checks % _SWEEP_EVERY == 0:
                db.execute("DELETE FROM breaker_state WHERE tripped_until <= %s AND "
                           "coalesce(times[array_upper(times, 1)], 0) <= %s", (t, t - self._window))
        if refusal is not None:
            raise refusal

    def tracked_keys(self) -> int:
        return int(self.store._read("count breaker keys", "SELECT count(*) AS n FROM breaker_state")[0]["n"])
