"""Call-volume limits: rate per caller, target and category, objects per bulk call, and the runaway breaker.

The clock is passed in, so behaviour is a function of the calls and times given. A refused call uses
no capacity; the breaker never counts reads and trips only on identical writes. Thread-safe, bounded memory.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from gateway.errors import PolicyDenied, RateLimited
from gateway.vocabulary import Category

RATE_WINDOW_SECONDS = 60.0
#: how many checks may pass between two sweeps of idle keys
_SWEEP_EVERY = 256


def bulk_denial(count: int, limit: int | None, target: str) -> str | None:
    """The reason a call changing ``count`` objects exceeds ``limit``, or None when it fits."""
    if limit is None or count <= limit:
        return None
    return (f"this call would change {count} objects on target '{target}', more than its limit of "
            f"{limit} (max_bulk_objects); split it into batches of at most {limit}, or raise "
            "max_bulk_objects for this target in rules.yaml")


def check_bulk(count: int, limit: int | None, target: str) -> None:
    """Raise ``PolicyDenied`` when a call would change more than ``limit`` objects (None: no limit)."""
    reason = bulk_denial(count, limit, target)
    if reason is not None:
        raise PolicyDenied(reason, rule="limits:max_bulk_objects", target=target, count=count, limit=limit)


def rate_refusal(target: str, category: Category, limit: int, retry_after: float,
                 caller: str | None = None) -> RateLimited:
    """The error of a call over a per-minute budget (this process's or all replicas'): the caller's own
    on ``target`` when ``caller`` is given, else the target-wide ceiling every caller shares."""
    if caller is not None:
        what = (f"rate limit reached for caller '{caller}' on target '{target}': at most {limit} {category} "
                f"calls per minute per caller; retry in {retry_after:.1f} s, or raise "
                f"max_calls_per_minute.{category} for this target in rules.yaml")
    else:
        what = (f"rate limit reached on target '{target}': at most {limit} {category} calls per minute "
                f"from all callers together; retry in {retry_after:.1f} s, or raise "
                f"target_max_calls_per_minute.{category} for this target in rules.yaml")
    return RateLimited(what, retry_after)


@dataclass(frozen=True)
class RateBudget:
    """One per-minute budget a call spends: a caller's on a target and category, or (``caller`` None)
    the target-wide ceiling all callers share."""

    target: str
    category: Category
    limit: int
    caller: str | None = None
    #: the caller as its refusal names it (its display name; ``caller`` is the key the budget counts by)
    shown: str | None = None

    @property
    def key(self) -> str:
        """The budget's key in a store (the unit separator cannot occur in a name from a config file)."""
        scope = () if self.caller is None else (self.caller,)
        return "\x1f".join((self.target, str(self.category), *scope))

    def refusal(self, retry_after: float) -> RateLimited:
        return rate_refusal(self.target, self.category, self.limit, retry_after, self.shown or self.caller)


def budgets(target: str, category: Category, limit: int | None, caller: str | None,
            target_limit: int | None, shown: str | None = None) -> list[RateBudget]:
    """The budgets one call spends: the caller's ``limit`` (target-wide when ``caller`` is None) and the
    ``target_limit`` ceiling; a None limit is no budget. Pure."""
    out = [] if limit is None else [RateBudget(target, category, limit, caller, shown)]
    if target_limit is not None and caller is not None:
        out.append(RateBudget(target, category, target_limit))
    return out


class RateLimiter:
    """At most ``limit`` calls per rolling minute for each (caller, target, category), and at most
    ``target_limit`` for each (target, category) from every caller together."""

    def __init__(self, window: float = RATE_WINDOW_SECONDS) -> None:
        self._window = window
        self._lock = threading.Lock()
        self._calls: dict[str, deque[float]] = {}
        self._checks = 0

    def check(self, target: str, category: Category, limit: int | None, now: float, *,
              caller: str | None = None, target_limit: int | None = None, shown: str | None = None) -> None:
        """Record the call in every budget it spends, or raise ``RateLimited`` (with ``retry_after``)
        for the first one that is full, recording nothing. ``caller`` is the caller's key text (the
        budget's scope; ``shown`` its name in the message); ``caller=None`` counts ``limit`` for the
        target as a whole; a None limit is unlimited (nothing recorded)."""
        spent = budgets(target, category, limit, caller, target_limit, shown)
        if not spent:
            return
        with self._lock:
            self._maybe_sweep(now)
            queues = [self._calls.setdefault(b.key, deque()) for b in spent]
            for budget, calls in zip(spent, queues, strict=True):
                _prune(calls, now - self._window)
                if len(calls) >= budget.limit:
                    raise budget.refusal(max(calls[len(calls) - budget.limit] + self._window - now, 0.0))
            for calls in queues:
                calls.append(now)

    def tracked_keys(self) -> int:
        """How many budgets hold state (for tests and metrics)."""
        with self._lock:
            return len(self._calls)

    def _maybe_sweep(self, now: float) -> None:
        self._checks += 1
        if self._checks % _SWEEP_EVERY:
            return
        horizon = now - self._window
        for key in list(self._calls):
            calls = self._calls[key]
            _prune(calls, horizon)
            if not calls:
                del self._calls[key]


@dataclass
class _Repeats:
    """Recent times of one identical call, and until when it is refused (0: not tripped)."""

    times: deque[float] = field(default_factory=deque)
    tripped_until: float = 0.0


class RunawayBreaker:
    """Stops a caller stuck in a loop that repeats the same write over and over."""

    def __init__(self, max_repeats: int = 5, window: float = 60.0, cooldown: float = 120.0) -> None:
        if max_repeats < 1 or window <= 0 or cooldown <= 0:
            raise ValueError("max_repeats must be >= 1 and window, cooldown positive")
        self._max_repeats = max_repeats
        self._window = window
        self._cooldown = cooldown
        self._lock = threading.Lock()
        self._repeats: dict[tuple[str, str, str], _Repeats] = {}
        self._checks = 0

    def check(self, caller: str, tool: str, args_digest: str, category: Category, now: float, *,
              shown: str | None = None) -> None:
        """Count an identical write; raise ``RateLimited`` while the breaker is tripped for it
        (``caller``: the caller's key text, what repeats are counted by; ``shown``: its name)."""
        if category is Category.READ:
            return
        key = (caller, tool, args_digest)
        with self._lock:
            self._maybe_sweep(now)
            state = self._repeats.setdefault(key, _Repeats())
            if now < state.tripped_until:
                raise self._refusal(shown or caller, tool, state.tripped_until - now)
            if state.tripped_until:
                self._repeats[key] = state = _Repeats()
            _prune(state.times, now - self._window)
            state.times.append(now)
            if len(state.times) > self._max_repeats:
                state.times.clear()
                state.tripped_until = now + self._cooldown
                raise self._refusal(shown or caller, tool, self._cooldown)

    def tracked_keys(self) -> int:
        """How many (caller, tool, digest) entries hold state (for tests and metrics)."""
        with self._lock:
            return len(self._repeats)

    def _refusal(self, caller: str, tool: str, retry_after: float) -> RateLimited:
        error = RateLimited(
            f"runaway protection: caller '{caller}' sent the same {tool} call more than "
            f"{self._max_repeats} times within {self._window:g} s; this identical call is refused for "
            f"{retry_after:.0f} s more. Check the agent's retry loop; different calls are not affected",
            retry_after,
        )
        error.details["limit"] = "runaway_breaker"
        return error

    def _maybe_sweep(self, now: float) -> None:
        self._checks += 1
        if self._checks % _SWEEP_EVERY:
            return
        horizon = now - self._window
        for key in list(self._repeats):
            state = self._repeats[key]
            _prune(state.times, horizon)
            if not state.times and now >= state.tripped_until:
                del self._repeats[key]


def _prune(times: deque[float], horizon: float) -> None:
    """Drop times at or before ``horizon`` (deques are in call order, so from the left)."""
    while times and times[0] <= horizon:
        times.popleft()
