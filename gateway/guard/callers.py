"""Who is the same caller: every per-caller comparison of the gateway, on ``CallerKey`` text. Pure.

Each decision names its comparison in ``DECISIONS``, so tests can check every one with plain values.
A record without a key matches no caller, ever (fail closed): it stands as ``unkeyed:<name>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = [
    "DECISIONS",
    "UNKEYED",
    "key_of",
    "key_text",
    "own_proposal",
    "person_of",
    "same",
    "same_row_caller",
    "scope_of",
    "unkeyed",
    "within",
]

#: a ``CallerKey`` (anything whose ``str()`` is its key text), its text, or None: no key
Keyish = Any


def key_text(key: Keyish) -> str | None:
    """The stored text of ``key`` (None stays None: a record without a key)."""
    return None if key is None else str(key)


#: the prefix of what a record or party without a stored key is keyed by: no ``CallerKey`` text has it
UNKEYED: Final = "unkeyed:"


def unkeyed(name: str) -> str:
    """The key text of a record or plain-value party that has no key, only the name ``name``: it matches
    only others without a key showing that name, never a key the gateway gives a caller (those begin
    with their namespace: token, person, client, system)."""
    return f"{UNKEYED}{name}"


def same(a: Keyish, b: Keyish) -> bool:
    """Whether ``a`` and ``b`` are one caller: equal key texts; a missing key is nobody."""
    left, right = key_text(a), key_text(b)
    return left is not None and right is not None and left == right


def within(key: Keyish, keys: Iterable[Keyish]) -> bool:
    """Whether ``key`` is one of ``keys`` (``same`` against each)."""
    return any(same(key, other) for other in keys)


def own_proposal(viewer_key: Keyish, viewer_person: Keyish, proposer_key: Keyish,
                 acting_for_key: Keyish) -> bool:
    """Whether a viewer (its key, and the person behind it) proposed a proposal or is the person an
    agent proposed it for: keys only, so a caller showing the proposer's name is still someone else."""
    mine = (proposer_key, acting_for_key)
    return within(viewer_key, mine) or within(viewer_person, mine)


def same_row_caller(row: Mapping[str, Any], name: str, key: Keyish) -> bool:
    """Whether audit ``row`` is about the caller ``name`` keyed ``key``: its ``caller_key`` is ``key``.
    A token's key as kept in the log may have its id masked (``token:***``: the log's redaction reads
    ``token:`` as a credential's label); such a row is the token's whose name it shows, since token
    names are unique among tokens (compared case-folded, revoked ones included). A row without a
    ``caller_key`` is nobody's."""
    kept, mine = key_text(row.get("caller_key")), key_text(key)
    if kept is None or mine is None:
        return False
    if kept == mine:
        return True
    masked = kept.startswith("token:") and kept.endswith("***")
    return masked and mine.startswith("token:") and row.get("caller") == name


def key_of(principal: Any) -> str:
    """The key text a per-caller record stores for ``principal``."""
    return str(principal.key)


def person_of(principal: Any) -> str | None:
    """The key text of the person behind ``principal`` (itself, or the person an agent acts for)."""
    return key_text(principal.person_key)


def scope_of(principal: Any) -> str:
    """What per-caller counters (rate limits, runaway breaker, busy audit) are scoped by: the key."""
    return str(principal.key)


#: every per-caller decision and what it compares (the table tests/guard/test_callers.py checks, row by row)
DECISIONS: Final[Mapping[str, str]] = {
    "own_proposal": "viewer key against the proposal's caller_key and acting_for_key",
    "approver_distinct": "approver key against the keys of the approvals recorded",
    "n_of_m_persons": "approvals counted once per approver_key; an approval without one counts for nobody",
    "confirmation_binding": "the confirming caller's key against the proposal's caller_key",
    "proposal_owner": "the proposer's token looked up by the token id in caller_key, never by name",
    "idempotency_scope": "idempotency rows keyed by the caller's key text",
    "task_ownership": "tasks/get, tasks/result, tasks/list, tasks/cancel, the task ids a "
                      "subscriptions/listen follows: the task's caller_key",
    "rate_limit": "rate-limit counters scoped by the caller's key text",
    "runaway_breaker": "breaker counters scoped by the caller's key text",
    "busy_audit": "the busy-row throttle scoped by (key text, target)",
    "web_session": "a page session keeps the caller key; an SSO person is its (issuer, sub) key",
    "mcp_session": "the MCP session's owner is the caller's key text",
    "audit_own": "audit: own shows rows whose caller_key is the viewer's",
    "fair_queue_share": "a caller queues in its key's share, or its person's with fair_share: person "
                        "(gateway.auth.fair_share.share_of)",
}
