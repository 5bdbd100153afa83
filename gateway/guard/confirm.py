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

State machine (forward only)::

    pending ──confirm──> executing ──> executed | failed
       │  └─human approve─> approved ──> executing
       ├──cancel──> cancelled        ├──deny──> denied
       └──due────> expired           (approved also expires if never executed)
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping
from typing import Any, Final, Literal

from gateway.errors import ApprovalRequired, ConfirmationExpired, ConfirmationInvalid, Forbidden, GatewayError
from gateway.store.base import Proposal, StateStore, new_id

TOKEN_PREFIX: Final = "gwc_"
#: states a due proposal is moved out of by ``expire_due``
EXPIRABLE_STATES: Final = ("pending", "approved")

_NOT_VALID = "this confirmation token is not valid for you; make a fresh proposal"
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


def check_confirmable(
    p: Proposal | None,
    *,
    caller: str,
    now: float,
    via: Literal["agent", "human"],
    approver_role_approve: str | None = None,
) -> None:
    """Raise why ``p`` cannot be confirmed now by ``caller``, or return if it can.

    ``via="agent"``: the proposing caller confirming over MCP. A different caller gets only
    ``ConfirmationInvalid`` ("not valid for you") and learns nothing about the proposal.
    ``via="human"``: ``caller`` is the approver and ``approver_role_approve`` their role's ``approve``
    right: ``none`` (or missing) may not approve, ``others`` may not approve their own proposal.

    Then, in order: a proposal no longer pending is invalid (already used, cancelled, denied) or
    expired; one past ``expires_at`` is expired; an agent confirm of a proposal that requires web
    approval raises ``ApprovalRequired`` naming how a human approves it.
    """
    if p is None:
        raise ConfirmationInvalid("this confirmation token is unknown, already used, cancelled or denied; "
                                  "make a fresh proposal")
    if via == "agent" and p.caller != caller:
        raise ConfirmationInvalid(_NOT_VALID)
    if via == "human":
        _check_approver(p, caller, approver_role_approve)
    if p.state != "pending":
        kind, message = _STATE_ERRORS[p.state]
        raise kind(message, proposal_id=p.id)
    if now >= p.expires_at:
        raise ConfirmationExpired(f"this proposal expired {now - p.expires_at:.0f}s ago; {_FRESH}",
                                  proposal_id=p.id)
    if via == "agent" and p.require_web_approval:
        raise ApprovalRequired(
            f"target '{p.target}' requires a human to approve this action: it waits in the approval page "
            f"(/ui) or for `gateway pending approve {p.id}`; it executes once approved, so do not confirm it "
            "again", proposal_id=p.id)


def _check_approver(p: Proposal, approver: str, approve: str | None) -> None:
    if approve not in ("any", "others"):
        raise Forbidden("your role may not approve actions; ask someone whose role has 'approve: any' or "
                        "'approve: others'")
    if approve == "others" and approver == p.caller:
        raise Forbidden("your role may approve only proposals made by others; ask another approver",
                        proposal_id=p.id)


def expire_due(store: StateStore, now: float) -> list[Proposal]:
    """Move every due pending/approved proposal to ``expired``; return those this call moved (the
    caller audits each). Safe to run in several processes at once: each proposal expires once."""
    expired: list[Proposal] = []
    for p in store.list_proposals(EXPIRABLE_STATES, limit=1000, due_before=now):
        if store.transition(p.id, EXPIRABLE_STATES, "expired", decided_at=now, outcome="expired"):
            moved = store.get_proposal(p.id)
            if moved is not None:
                expired.append(moved)
    return expired
