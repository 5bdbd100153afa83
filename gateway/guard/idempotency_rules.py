"""Idempotency keys: what a call carrying a key the caller already used does (pure, table-tested).

A repeated key never runs twice: the same call replays or waits for the first, other arguments
conflict, and a running record whose process is gone is ``outcome_unknown``, never run again. Keys
are per caller.
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
