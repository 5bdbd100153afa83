"""The rules of the two-phase flow for destructive calls, as pure functions with the clock passed in.

A confirmation token is shown once (only its sha256 kept), single use (an atomic compare-and-set in
the store, so of two racing confirms one executes), short lived, bound to the proposing caller and to
the exact call (``args_digest``). On a gated target only a human approves; the agent cannot confirm.
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
