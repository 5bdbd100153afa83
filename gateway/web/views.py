"""What the approval page shows, from plain values: a proposal's card, the chain's check, the Agents view."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from gateway.audit.agents import WINDOWS
from gateway.audit.verify import LineFault, VerifyReport
from gateway.guard.callers import key_of, own_proposal, person_of
from gateway.guard.decision import Verdict
from gateway.proposals import Proposal
from gateway.sanitize import clean_text
from gateway.server.proposals.views import proposal_view


def proposed_by(p: Proposal, viewer: Any) -> bool:
    """Whether the viewer (a ``Principal``) proposed ``p`` or is the person an agent proposed it for, by
    key (``guard.callers.own_proposal``): the card's "mine"."""
    return own_proposal(key_of(viewer), person_of(viewer), p.caller_key, p.acting_for_key)


def proposal_card(p: Proposal, now: float, *, mine: bool,
                  rights: tuple[Verdict, Verdict] | None) -> dict[str, Any]:
    """One card. ``rights``: the verdicts of a deny and of an approval by the viewer now
    (``ProposalActions.decision_rights``), asked only for a pending proposal; clicks are decided again."""
    view = proposal_view(p, now)
    view.update({
        "gated": p.require_web_approval, "requested_via": p.surface, "decided_at": p.decided_at,
        "mine": mine,
        "can_decide": False, "decide_note": None, "can_approve": False, "approve_note": None,
    })
    if rights is not None:
        deny, approve = rights
        view.update({
            "can_decide": deny.allowed, "decide_note": None if deny.allowed else clean_text(deny.reason),
            "can_approve": approve.allowed,
            "approve_note": None if approve.allowed else clean_text(approve.reason),
        })
    return view


def verify_body(report: VerifyReport) -> dict[str, Any]:
    """Whether the audit chain verifies, as the page shows it (file names, never their paths)."""
    return {"ok": report.ok, "rows": report.rows, "first_seq": report.first_seq,
            "last_seq": report.last_seq, "problems": report.problems,
            "starts_after_rotation": report.starts_after_rotation,
            "first_broken_line": _fault(report.first_broken_line),
            "torn_last_line": _fault(report.torn_last_line)}


def _fault(fault: LineFault | None) -> dict[str, Any] | None:
    if fault is None:
        return None
    return {"file": fault.file.name, "line": fault.line, "reason": fault.reason, "detail": fault.detail}


def agents_body(callers: list[dict[str, Any]], open_proposals: Iterable[Proposal], *, window: str,
                now: float) -> dict[str, Any]:
    """The Agents view of one window: ``callers`` (``CallerSummary.view``), each with its number of
    open proposals among ``open_proposals`` (those the viewer may see), matched by caller key."""
    opened = Counter(p.caller_key or f"name:{p.caller}" for p in open_proposals)
    for entry in callers:
        entry["open_proposals"] = opened.get(entry["caller_key"] or f"name:{entry['caller']}", 0)
    seconds, step = WINDOWS[window]
    return {"window": window, "window_seconds": seconds, "slot_seconds": step, "now": now,
            "callers": callers}
