"""Idempotency keys: what a call carrying a key the caller already used does (pure, table-tested).

A caller may send an ``idempotency_key`` with any write or destructive call (the tool argument, or the
request's ``_meta["idempotency_key"]`` when the argument is absent: the argument wins). The first call
with a key claims it in the state store, runs, and stores its outcome; a later call with the same key
from the same caller within the window does not run again:

- the same tool and the same arguments (digest), the first one finished: ``REPLAY`` its outcome;
- the same, the first one still running: ``WAIT`` for that very execution (never a second run);
- another tool or other arguments: ``CONFLICT`` (a typed refusal; the caller picks a new key);
- the same, the first one still marked running but its process is gone: ``ORPHANED`` (its outcome is
  unknown: reported as ``outcome_unknown``, never run again);
- the record is older than the window: ``TAKE_OVER`` (the key is free again; the call runs anew);
- no record: ``RUN``.

Keys are per caller: two callers using the same key never see each other's outcomes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Final

from gateway.errors import InvalidArgument

#: how long a key's outcome is kept and replayed, by default (``GATEWAY_IDEMPOTENCY_WINDOW_SECONDS``)
DEFAULT_WINDOW_SECONDS: Final = 24 * 3600.0
#: the argument and ``_meta`` name of the key
KEY_FIELD: Final = "idempotency_key"
#: what a key may look like: 1-128 printable characters without spaces (a UUID, a ULID, a slug)
_KEY = re.compile(r"[\x21-\x7e]{1,128}")
#: error codes after which the change may have happened: kept and replayed, never run again. Any other
#: error says nothing changed (a refusal, a limit, an unreachable target): the key is released so a
#: retry with it runs anew.
KEPT_ERRORS: Final = frozenset({"outcome_unknown", "timeout", "task_failed"})


class Step(Enum):
    RUN = "run"
    REPLAY = "replay"
    WAIT = "wait"
    CONFLICT = "conflict"
    ORPHANED = "orphaned"
    TAKE_OVER = "take_over"


@dataclass(frozen=True)
class Seen:
    """What the store holds for (caller, key)."""

    tool: str
    digest: str
    running: bool
    created_at: float
    #: whether the process that claimed the key still runs (only asked while the record is running)
    owner_alive: bool = True


def decide(seen: Seen | None, *, tool: str, digest: str, now: float, window: float) -> Step:
    """What a call of ``tool`` with arguments ``digest`` does given the record ``seen`` of its key."""
    if seen is None:
        return Step.RUN
    if now - seen.created_at >= window:
        return Step.TAKE_OVER
    if seen.tool != tool or seen.digest != digest:
        return Step.CONFLICT
    if not seen.running:
        return Step.REPLAY
    return Step.WAIT if seen.owner_alive else Step.ORPHANED


def keeps_error(code: str) -> bool:
    """Whether a call that failed with ``code`` keeps its key (the change may have happened)."""
    return code in KEPT_ERRORS


def checked_key(key: str) -> str:
    """``key`` if it is one (1-128 printable ASCII characters, no spaces), else ``InvalidArgument``."""
    if _KEY.fullmatch(key) is None:
        raise InvalidArgument(KEY_FIELD, "must be 1-128 printable ASCII characters without spaces (a UUID)")
    return key
