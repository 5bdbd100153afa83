"""The life of a proposal as one pure transition table: the only moves a proposal can make.

::

    pending ──human approves──> approved ──> executing ──> executed | failed | outcome_unknown
       │ └──agent confirms (or the approver runs it) ──────┘
       ├──> denied      a human said no
       ├──> cancelled   its caller withdrew it, or its token was revoked
       ├──> expired     its time ran out (approved ones too)
       └──> stale       its objects changed in vSphere since it was made (approved ones too)

Every state a proposal can be in is a key of ``EDGES``; a state with no way out is final.
``executing`` is a claim: the process that moved the proposal there runs the change and settles it.
``outcome_unknown`` is how a change ends when nobody can tell whether vSphere finished it (the
gateway died mid-task, or the connection dropped): it is never retried.

Stores accept only these edges (``check_edge``), so an illegal move is impossible whatever calls the
store; the server makes every move through one method that audits it and notifies listeners.
Pure: imports nothing from the gateway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

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
