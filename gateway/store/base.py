"""The records the state store keeps, and the interface every store implements.

The server, the CLI and the approval page share two kinds of state: bearer tokens (only a hash of
each secret) and proposals of the two-phase confirmation flow. ``StateStore`` is the small
interface they code against; ``gateway.store.sqlite.SqliteStore`` implements it on one SQLite file,
and a shared database can implement it for several replicas behind one load balancer.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from gateway.guard.lifecycle import FINAL_STATES, STATES, check_edge

#: every state a proposal can be in; the moves between them are ``gateway.guard.lifecycle.EDGES``
PROPOSAL_STATES: Final = STATES
__all__ = ["FINAL_STATES", "PROPOSAL_STATES", "Proposal", "StateStore", "TokenRecord", "check_edge", "new_id"]

_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
ID_LENGTH: Final = 12


def new_id() -> str:
    """A short random id (12 lowercase letters/digits, ~62 bits): never starts with ``-`` on a command
    line and contains no ``_``, so it can sit between the separators of a token."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(ID_LENGTH))


@dataclass(frozen=True)
class TokenRecord:
    """One bearer token as stored: the secret itself is never kept, only its argon2id ``hash``."""

    token_id: str
    name: str
    role: str
    hash: str = field(repr=False)
    created_at: float
    expires_at: float | None = None
    last_used: float | None = None
    revoked: bool = False

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def usable(self, now: float) -> bool:
        return not self.revoked and not self.expired(now)


@dataclass(frozen=True)
class Proposal:
    """A destructive call waiting for confirmation. Only the sha256 of its confirmation token is kept.

    ``args`` is redacted for display; ``args_digest`` binds the proposal to the exact call;
    ``plan_params`` holds everything needed to execute it later, possibly in another process.
    """

    id: str
    token_hash: str
    caller: str
    role: str
    surface: str
    target: str
    target_host: str
    tool: str
    args: dict[str, Any]
    args_digest: str
    plan_summary: str
    affected: list[dict[str, Any]]
    plan_params: dict[str, Any]
    created_at: float
    expires_at: float
    state: str = "pending"
    require_web_approval: bool = False
    approved_by: str | None = None
    decided_at: float | None = None
    outcome: str | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    correlation_id: str | None = None
    #: who holds the ``executing`` claim: ``<instance id>`` of the gateway process running the change
    executor: str | None = None

    def __post_init__(self) -> None:
        if self.state not in PROPOSAL_STATES:
            raise ValueError(f"unknown proposal state {self.state!r}")


#: proposal fields ``StateStore.transition`` may set besides the state
TRANSITION_FIELDS: Final = frozenset(
    {"approved_by", "decided_at", "outcome", "result", "error", "expires_at", "executor"}
)


class StateStore(Protocol):
    """State shared by every process of one gateway. Every method is safe to call from any thread.

    Failures of the storage itself raise ``gateway.errors.StateUnavailable``.
    """

    def ping(self) -> bool:
        """True if the store answers a trivial query (for /readyz)."""
        ...

    def add_token(self, rec: TokenRecord) -> None:
        """Store a new token; ``InvalidArgument`` if its name was ever used (revoked names stay taken)."""
        ...

    def token_by_id(self, token_id: str) -> TokenRecord | None: ...

    def token_by_name(self, name: str) -> TokenRecord | None: ...

    def list_tokens(self) -> list[TokenRecord]:
        """Every token, revoked ones included, ordered by name."""
        ...

    def update_token(self, name: str, *, role: str | None = None, revoked: bool | None = None) -> TokenRecord:
        """Change a token's role and/or revoked flag; ``NotFound`` for an unknown name."""
        ...

    def touch_token(self, token_id: str, when: float) -> None:
        """Record that the token was used at ``when``; does not count as a token change."""
        ...

    def token_generation(self) -> int:
        """A counter bumped by every token change (create, revoke, set-role) in any process."""
        ...

    def add_proposal(self, p: Proposal) -> None: ...

    def get_proposal(self, proposal_id: str) -> Proposal | None: ...

    def proposal_by_token_hash(self, token_hash: str) -> Proposal | None: ...

    def list_proposals(
        self, states: Sequence[str] | None = None, limit: int = 200, *, due_before: float | None = None
    ) -> list[Proposal]:
        """Proposals in ``states`` (all if None), newest first; with ``due_before`` only those whose
        ``expires_at`` is at or before it, oldest first."""
        ...

    def transition(self, proposal_id: str, from_states: Sequence[str], to_state: str, **fields: Any) -> bool:
        """Atomic compare-and-set of a proposal's state (plus ``fields``, see ``TRANSITION_FIELDS``).

        True iff the proposal was in one of ``from_states`` and this caller moved it: of two racing
        callers, in any processes, exactly one wins. Every implementation first calls
        ``check_edge(from_states, to_state)`` (raising ``IllegalTransition``, a ValueError): only the
        lifecycle table's edges can ever be taken, whatever calls the store."""
        ...

    def close(self) -> None: ...
