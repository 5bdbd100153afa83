"""The records the state store keeps, and the ``StateStore`` interface every engine implements.

Both engines run their schema migrations when opened and refuse a schema newer than they know.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from gateway.errors import ConfigError, InvalidArgument
from gateway.proposals import STATES, Approval, Proposal, check_edge
from gateway.vocabulary import Kind


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
    #: a person's token may sign in to the approval page and approve; an agent's never
    kind: Kind = Kind.AGENT

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def usable(self, now: float) -> bool:
        return not self.revoked and not self.expired(now)


@dataclass(frozen=True)
class WebSessionRecord:
    """One signed-in browser of the approval page as stored. ``key`` is the sha256 of the session id
    that travels in the cookie (the id itself is never stored); ``csrf`` is compared in constant time."""

    key: str = field(repr=False)
    token_id: str
    name: str
    csrf: str = field(repr=False)
    created_at: float
    expires_at: float
    last_seen: float
    #: the signed-in caller's ``CallerKey`` text (None: a session from before keys were kept: nobody)
    caller_key: str | None = None


#: proposal fields ``StateStore.transition`` may set besides the state
TRANSITION_FIELDS: Final = frozenset(
    {"approved_by", "decided_at", "outcome", "result", "error", "expires_at", "executor"}
)


class AuditWriter(Protocol):
    """The small interface audit rows are written through: the JSONL ``gateway.audit.file_sink.AuditSink``
    (embedded mode) or ``gateway.audit.pg_sink.PgAuditSink`` (PostgreSQL). ``write`` returns the row as
    stored, or raises ``AuditUnavailable`` and the caller refuses the call."""

    def write(self, event: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]: ...

    def writable(self) -> bool: ...

    def close(self) -> None: ...


class StateStore(Protocol):
    """State shared by every process of one gateway. Every method is safe to call from any thread.

    Failures of the storage itself raise ``gateway.errors.StateUnavailable``.
    """

    def ping(self) -> bool:
        """True if the store answers a trivial query (for /readyz)."""
        ...

    def add_token(self, rec: TokenRecord) -> None:
        """Store a new token; ``InvalidArgument`` if its name, compared case-folded, was ever used (revoked
        names stay taken)."""
        ...

    def token_by_id(self, token_id: str) -> TokenRecord | None: ...

    def token_by_name(self, name: str) -> TokenRecord | None: ...

    def list_tokens(self) -> list[TokenRecord]:
        """Every token, revoked ones included, ordered by name."""
        ...

    def update_token(self, name: str, *, role: str | None = None, revoked: bool | None = None,
                     kind: Kind | None = None) -> TokenRecord:
        """Change a token's role, revoked flag and/or kind; ``NotFound`` for an unknown name."""
        ...

    def touch_token(self, token_id: str, when: float) -> None:
        """Record that the token was used at ``when``; does not count as a token change."""
        ...

    def token_generation(self) -> int:
        """A counter bumped by every token change (create, revoke, set-role, set-kind) in any process."""
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

    def add_approval(self, a: Approval) -> bool:
        """Record one person's approval while its proposal is ``pending``; False when that person already
        approved it or it is no longer pending (nothing is written then)."""
        ...

    def transition(self, proposal_id: str, from_states: Sequence[str], to_state: str, **fields: Any) -> bool:
        """Atomic compare-and-set of a proposal's state (plus ``fields``, see ``TRANSITION_FIELDS``).

        True iff the proposal was in one of ``from_states`` and this caller moved it: of two racing
        callers, in any processes, exactly one wins. Every implementation first calls
        ``check_edge(from_states, to_state)`` (raising ``IllegalTransition``, a ValueError): only the
        lifecycle table's edges can ever be taken, whatever calls the store."""
        ...

    def add_web_session(self, rec: WebSessionRecord, *, idle: float, max_sessions: int) -> None:
        """Store a new session (its ``created_at`` is now), first dropping ended ones (see
        ``touch_web_session``) and then the oldest until fewer than ``max_sessions`` remain."""
        ...

    def touch_web_session(self, key: str, now: float, idle: float) -> WebSessionRecord | None:
        """The session with this key if it is alive at ``now`` (before its ``expires_at`` and used less
        than ``idle`` seconds ago), marked used at ``now``; an ended session is deleted, None."""
        ...

    def end_web_session(self, key: str) -> WebSessionRecord | None:
        """Delete the session; return it if it existed."""
        ...

    def count_web_sessions(self) -> int: ...

    def schema_version(self) -> int:
        """The version of the schema this store's database holds (after the migrations it ran)."""
        ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------- rows shared by the engines

#: proposal columns in table order; the JSON ones are stored as canonical JSON text on both engines
PROPOSAL_COLUMNS: Final = (
    "id", "token_hash", "caller", "role", "surface", "target", "target_host", "tool", "args", "args_digest",
    "plan_summary", "affected", "plan_params", "created_at", "expires_at", "state", "require_web_approval",
    "approved_by", "decided_at", "outcome", "result", "error", "correlation_id", "executor",
    "approval_rule", "blast_radius", "shown_digest", "caller_key", "acting_for_key",
)
JSON_COLUMNS: Final = frozenset({"args", "affected", "plan_params", "result", "error", "approval_rule",
                                 "blast_radius"})
#: one person's approval of one proposal (``gateway.proposals.Approval``); one row per person per proposal
APPROVAL_COLUMNS: Final = ("proposal_id", "approver", "kind", "role", "at", "reason", "digest",
                            "approver_key")


def approvals_migration(real: str) -> tuple[str, ...]:
    """The schema step of both engines for N of M (``real``: the engine's float type): what an approval
    needs, the blast radius and the digest shown on each proposal, and the approvals table."""
    return (
        "ALTER TABLE proposals ADD COLUMN approval_rule TEXT",
        "ALTER TABLE proposals ADD COLUMN blast_radius TEXT",
        "ALTER TABLE proposals ADD COLUMN shown_digest TEXT",
        f"""CREATE TABLE approvals (
    proposal_id TEXT NOT NULL REFERENCES proposals (id) ON DELETE CASCADE,
    approver    TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('person', 'agent')),
    role        TEXT NOT NULL,
    at          {real} NOT NULL,
    reason      TEXT NOT NULL,
    digest      TEXT NOT NULL,
    PRIMARY KEY (proposal_id, approver)
)""",
    )
TOKEN_COLUMNS: Final = (
    "token_id", "name", "role", "hash", "created_at", "expires_at", "last_used", "revoked", "kind",
)
#: schema step of both engines adding ``tokens.kind``: every token made before it is an agent's
TOKEN_KIND_COLUMN: Final = (
    "ALTER TABLE tokens ADD COLUMN kind TEXT NOT NULL DEFAULT 'agent' CHECK (kind IN ('person', 'agent'))"
)
WEB_SESSION_COLUMNS: Final = ("key", "token_id", "name", "csrf", "created_at", "expires_at", "last_seen",
                               "caller_key")
#: the schema step of both engines keeping each caller's ``CallerKey`` text beside its display name.
#: Rows written before carry none (NULL) and match no caller: a proposal nobody may confirm (it expires),
#: an approval that counts for nobody, a task nobody sees, a page session that signs nobody in. The
#: idempotency rows named their caller by display name in ``caller``, the column keys now live in: those
#: names get a prefix no key text has (``unkeyed:``), so they match no caller either (a retry with such a
#: key runs as a new call, as any key of a caller it does not match).
CALLER_KEYS_MIGRATION: Final = (
    "ALTER TABLE proposals ADD COLUMN caller_key TEXT",
    "ALTER TABLE proposals ADD COLUMN acting_for_key TEXT",
    "ALTER TABLE approvals ADD COLUMN approver_key TEXT",
    "ALTER TABLE mcp_tasks ADD COLUMN caller_key TEXT",
    "ALTER TABLE web_sessions ADD COLUMN caller_key TEXT",
    "UPDATE idempotency_keys SET caller = 'unkeyed:' || caller",
    "CREATE INDEX mcp_tasks_caller_key ON mcp_tasks (caller_key, created_at)",
)


class Row(Protocol):
    """A database row addressable by column name (``sqlite3.Row``, psycopg's ``dict_row``)."""

    def __getitem__(self, key: str, /) -> Any: ...


def to_json(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def from_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def taken_name(names: Sequence[str], name: str) -> str | None:
    """The name among ``names`` that ``name`` repeats, compared case-folded (``IdPerson`` repeats
    ``idperson``: two token names that read alike would be two callers that look like one), or None."""
    folded = name.casefold()
    return next((n for n in names if n.casefold() == folded), None)


def name_refused(name: str, taken: str) -> InvalidArgument:
    return InvalidArgument("name", f"a token named {taken!r} already exists, and token names are compared "
                           f"ignoring case, so {name!r} is taken too (names of revoked tokens stay taken, so "
                           "sessions of a leaked token cannot be continued); pick a new name")


def token_from_row(row: Row) -> TokenRecord:
    values = {c: row[c] for c in TOKEN_COLUMNS}
    values["revoked"] = bool(values["revoked"])
    values["kind"] = Kind(values["kind"])
    return TokenRecord(**values)


def token_values(rec: TokenRecord) -> tuple[Any, ...]:
    """A record's values in ``TOKEN_COLUMNS`` order (the kind as its text)."""
    return tuple(rec.kind.value if c == "kind" else getattr(rec, c) for c in TOKEN_COLUMNS)


def proposal_from_row(row: Row, approvals: Sequence[Approval] = ()) -> Proposal:
    values = {c: (from_json(row[c]) if c in JSON_COLUMNS else row[c]) for c in PROPOSAL_COLUMNS}
    values["require_web_approval"] = bool(values["require_web_approval"])
    return Proposal(**values, approvals=tuple(approvals))


def approval_from_row(row: Row) -> Approval:
    return Approval(**{c: row[c] for c in APPROVAL_COLUMNS})


def approval_values(a: Approval) -> tuple[Any, ...]:
    return tuple(getattr(a, c) for c in APPROVAL_COLUMNS)


def with_approvals(proposals: Sequence[Proposal], approvals: Sequence[Approval]) -> list[Proposal]:
    """``proposals`` each with its approvals (``approvals`` in the order they landed)."""
    by_id: dict[str, list[Approval]] = {}
    for a in approvals:
        by_id.setdefault(a.proposal_id, []).append(a)
    return [replace(p, approvals=tuple(by_id.get(p.id, ()))) for p in proposals]


def proposal_values(p: Proposal) -> tuple[Any, ...]:
    return tuple(to_json(getattr(p, c)) if c in JSON_COLUMNS else getattr(p, c) for c in PROPOSAL_COLUMNS)


def web_session_from_row(row: Row) -> WebSessionRecord:
    return WebSessionRecord(**{c: row[c] for c in WEB_SESSION_COLUMNS})


def check_transition(from_states: Sequence[str], to_state: str, fields: Mapping[str, Any]) -> Sequence[str]:
    """Refuse a ``transition`` call that is not an edge of the lifecycle table (``check_edge``) or names
    fields it may not set (both engines); return the states to move from, as ``check_edge`` does."""
    checked = check_edge(from_states, to_state)
    unknown = set(fields) - TRANSITION_FIELDS
    if unknown:
        raise TypeError(f"transition() cannot set {', '.join(sorted(unknown))}")
    return checked


def check_states(states: Sequence[str]) -> None:
    unknown = set(states) - STATES
    if unknown:
        raise ValueError(f"unknown proposal states: {sorted(unknown)}")


# ---------------------------------------------------------------------------- schema migrations

#: one migration: (the version it brings the schema to, its SQL statements in order)
Migration = tuple[int, tuple[str, ...]]


def pending_migrations(current: int, migrations: Sequence[Migration], where: str) -> list[Migration]:
    """The migrations to run on a schema at version ``current``, in order; ``ConfigError`` when the
    schema is newer than the newest migration known here (a newer gateway wrote it: this replica must
    not serve it)."""
    versions = [version for version, _ in migrations]
    if versions != sorted(set(versions)) or (versions and versions[0] < 1):
        raise ValueError("migrations must have increasing versions from 1")
    latest = versions[-1] if versions else 0
    if current > latest:
        raise ConfigError(f"{where} holds schema {current}, written by a newer gateway (this one knows up to "
                          f"{latest}); upgrade this gateway before pointing it at that database")
    return [m for m in migrations if m[0] > current]
