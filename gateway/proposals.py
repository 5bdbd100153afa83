"""The proposal record and its life as one pure transition table: the only moves a proposal can make.

::

    pending ──human approves──> approved ──> executing ──> executed | failed | outcome_unknown
       │ └──agent confirms (or the approver runs it) ──────┘
       └──> denied | cancelled | expired | stale (its objects changed since shown: approvals void)

``executing`` is a claim: its process runs the change and settles it. ``outcome_unknown`` (nobody can
tell whether vSphere finished) is never retried. Stores accept only these edges (``check_edge``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

EDGES: Final[Mapping[str, frozenset[str]]] = {
    "pending": frozenset({"approved", "executing", "denied", "cancelled", "expired", "stale"}),
    "approved": frozenset({"executing", "cancelled", "expired", "stale"}),
    "executing": frozenset({"executed", "failed", "outcome_unknown"}),
    "executed": frozenset(),
    "failed": frozenset(),
    "outcome_unknown": frozenset(),
    "denied": frozenset(),
    "cancelled": frozenset(),
    "expired": frozenset(),
    "stale": frozenset(),
}
STATES: Final = frozenset(EDGES)
FINAL_STATES: Final = frozenset(s for s, out in EDGES.items() if not out)
#: states a proposal waits in for a decision (listed as pending work; expired when due)
OPEN_STATES: Final = ("pending", "approved")


class IllegalTransition(ValueError):
    """A move the table does not have: a programming error, never a user's."""


def allowed(from_state: str, to_state: str) -> bool:
    return to_state in EDGES.get(from_state, frozenset())


def check_edge(from_states: Iterable[str], to_state: str) -> tuple[str, ...]:
    """The ``from_states`` as a tuple if every one of them has an edge to ``to_state``; raise otherwise."""
    states = tuple(from_states)
    if to_state not in STATES:
        raise IllegalTransition(f"unknown proposal state {to_state!r}")
    bad = [s for s in states if not allowed(s, to_state)]
    if bad or not states:
        raise IllegalTransition(f"no transition {bad or '()'} -> {to_state!r} in the proposal lifecycle")
    return states


def sources(to_state: str) -> tuple[str, ...]:
    """Every state with an edge to ``to_state`` (what a compare-and-set to it may start from)."""
    return tuple(sorted(s for s, out in EDGES.items() if to_state in out))


@dataclass(frozen=True)
class Approval:
    """One person's approval of a proposal: who, of which kind and role, when, why, and the digest of the
    proposal as it was when they approved (``Proposal.shown_digest`` at that moment)."""

    proposal_id: str
    approver: str
    kind: str
    role: str
    at: float
    reason: str
    digest: str
    #: the approver's ``CallerKey`` text: N of M counts persons by it (None: written before keys were
    #: kept; such an approval counts for nobody)
    approver_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"by": self.approver, "kind": self.kind, "role": self.role, "at": self.at,
                "reason": self.reason}


@dataclass(frozen=True)
class Proposal:
    """A destructive call waiting for confirmation. Only the sha256 of its confirmation token is kept.

    ``args`` is the call as made: confirm and approve plan again from it, possibly in another process,
    so it is kept as given and never shown (views leave it out, audit rows redact it); it never holds
    credential-shaped text, which argument validation refuses for every tool whose calls become
    proposals (``ToolSpec.keeps_arguments``); ``args_digest``
    binds the proposal to the exact call; ``plan_params`` holds everything needed to execute it later.
    ``plan_summary`` and ``affected`` are made redacted and bounded (``gateway.audit.redact.displayable``).
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
    #: what a human approval needs, as the policy said when it was made: ``{"required": N,
    #: "roles": [...], "reason_required": bool}`` (``gateway.guard.approvals.ApprovalRule``); None: one
    approval_rule: dict[str, Any] | None = None
    #: what the proposal will affect, from live reads when it was made (disks, snapshots, power, host)
    blast_radius: dict[str, Any] | None = None
    #: the digest of the proposal as shown (tool, arguments, objects, blast radius): an approval binds to it
    shown_digest: str | None = None
    #: the approvals recorded so far, oldest first (kept in their own table; filled in by the store)
    approvals: tuple[Approval, ...] = ()
    #: the proposer's ``CallerKey`` text, and the person's an agent made it for: who may confirm it and
    #: who may never approve it compare these, never ``caller`` (None: written before keys were kept;
    #: such a proposal matches no caller)
    caller_key: str | None = None
    acting_for_key: str | None = None

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"unknown proposal state {self.state!r}")
