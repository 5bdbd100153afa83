"""The rules of the two-phase flow for destructive calls, as pure functions with the clock passed in.

A destructive call is never executed when made: the pipeline persists a ``Proposal`` and hands the
caller a confirmation token (shown once; only its sha256 is stored). The token is

- single use: confirming moves the proposal out of ``pending`` by an atomic compare-and-set in the
  store (``StateStore.transition``), so of two racing confirms exactly one executes;
- short lived: past ``expires_at`` it is refused with a remedy (make a fresh proposal);
- bound to the proposing caller, and the proposal to the exact tool, target and arguments
  (``args_digest``); another caller's confirm is told only that the token is not valid for them;
- gated by a human where the target requires web approval: the agent's own confirm is refused and
  a human with the ``approve`` right confirms on the page (/ui) or with ``gateway pending approve``.

The moves a proposal can make are the table in ``gateway.proposals``; who may make them, and
whether the rules still allow the change, is ``gateway.guard.decision.authorize``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping
from typing import Any, Final

from gateway.errors import ConfirmationExpired, ConfirmationInvalid, GatewayError
from gateway.ids import new_id
from gateway.proposals import Proposal

TOKEN_PREFIX: Final = "gwc_"

_FRESH = "make a fresh proposal (call the tool again) and confirm it within its time limit"

#: why a proposal that is no longer pending cannot be confirmed, keyed by its state
_STATE_ERRORS: Final[Mapping[str, tuple[type[GatewayError], str]]] = {
    "approved": (ConfirmationInvalid, "this proposal was already approved and is being executed"),
    "executing": (ConfirmationInvalid, "this confirmation token was already used; the action is running"),
    "executed": (ConfirmationInvalid, "this confirmation token was already used; the action ran"),
    "failed": (ConfirmationInvalid, f"this token was already used and the action failed; {_FRESH}"),
    "cancelled": (ConfirmationInvalid, f"this proposal was cancelled; {_FRESH}"),
    "denied": (ConfirmationInvalid, f"a human denied this proposal; if the change is still wanted, {_FRESH}"),
    "expired": (ConfirmationExpired, f"this proposal expired; {_FRESH}"),
    "stale": (ConfirmationInvalid,
              f"the objects of this proposal changed in vSphere since it was made; {_FRESH}"),
    "outcome_unknown": (ConfirmationInvalid, "this token was already used; whether the change finished is "
                        "unknown: check the objects and get_tasks before doing anything again"),
}


def new_confirmation_token() -> str:
    """A fresh confirmation token: ``gwc_`` + 192 random bits, URL-safe."""
    return TOKEN_PREFIX + secrets.token_urlsafe(24)


def new_proposal_id() -> str:
    """A short id naming a proposal in lists, the approval page and ``gateway pending``; not a secret."""
    return new_id()


def token_hash(token: str) -> str:
    """The sha256 (hex) under which a confirmation token is looked up; the token itself is never stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def args_digest(tool: str, target: str, args: Mapping[str, Any]) -> str:
    """The sha256 of the call as canonical JSON (sorted keys, no spaces): binds a proposal to it."""
    canonical = json.dumps({"tool": tool, "target": target, "args": args}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def proposal_problem(p: Proposal, now: float) -> tuple[str, str] | None:
    """Why ``p`` itself cannot be confirmed or approved now, as (error code, message), or None.

    Only the proposal's own state: used, cancelled, denied, stale, expired, or past ``expires_at``. Who
    may act on it (the proposer, an approver) and whether the rules still allow it are decided by
    ``gateway.guard.decision.authorize``, which takes this answer as its last fact.
    """
    if p.state != "pending":
        unknown = (ConfirmationInvalid, f"this proposal is {p.state}; {_FRESH}")
        kind, message = _STATE_ERRORS.get(p.state, unknown)
        return kind.code, message
    if now >= p.expires_at:
        return ConfirmationExpired.code, f"this proposal expired {now - p.expires_at:.0f}s ago; {_FRESH}"
    return None
