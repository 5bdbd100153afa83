"""How a proposal is shown, redacted and bounded (pure).

To its caller (``pending_answer``), in lists, cards and ``gateway pending`` (``proposal_view``), and to
its approvers (``as_shown``: the objects and blast radius their approvals bind to)."""

from __future__ import annotations

from typing import Any

from gateway.audit.redact import displayable, displayable_text
from gateway.errors import Stale
from gateway.guard.approvals import (
    MAX_REASON_CHARS,
    ApprovalRule,
    approval_view,
    shown_digest,
    tally,
    visible,
)
from gateway.guard.callers import key_of, key_text
from gateway.guard.policy.model import Decision
from gateway.proposals import Proposal
from gateway.vocabulary import Plan


def shown_summary(plan: Plan) -> str:
    """A plan's summary as a proposal keeps it: the stored record, the answer, the audit row, the card and
    every notification then carry the same clean text."""
    return displayable_text(plan.summary)


def pending_answer(proposal: Proposal, token: str, ttl: float, rule: ApprovalRule,
                   decision: Decision) -> dict[str, Any]:
    """The answer to the call that made ``proposal``: nothing changed yet, and how to confirm it."""
    people = f"{rule.required} different people" if rule.required > 1 else "a human"
    how = (
        f"{people} must approve proposal {proposal.id} on the web page (/ui) or with "
        f"`gateway pending approve {proposal.id}`; confirm_action is refused until then"
        if decision.require_approval
        else f'confirm_action(token="{token}") within {int(ttl)}s'
    )
    return {
        "state": "pending",
        "proposal_id": proposal.id,
        "target": proposal.target,
        "target_host": proposal.target_host,
        "tool": proposal.tool,
        "summary": proposal.plan_summary,
        "affected": proposal.affected,
        "blast_radius": proposal.blast_radius,
        **({"approvals_required": rule.required, "approvals_progress": tally(rule, (), None).text}
           if decision.require_approval else {}),
        "token": token,
        "expires_in_seconds": int(ttl),
        "requires_human_approval": decision.require_approval,
        "dry_run": decision.dry_run,
        "confirm_with": how,
        "note": f"Nothing has changed yet. This proposal acts on target '{proposal.target}' "
        f"({proposal.target_host}): check the target and the affected objects before confirming.",
    }


def check_not_stale(proposal: Proposal, plan: Plan) -> None:
    before = sorted((a.get("type"), a.get("moid"), a.get("name")) for a in proposal.affected)
    shown = displayable([a.to_dict() for a in plan.affected])
    after = sorted((a["type"], a["moid"], a["name"]) for a in shown)
    if before != after:
        raise Stale(
            f"the objects of proposal {proposal.id} changed since it was made (renamed, replaced or "
            "removed); make a fresh proposal and check it again"
        )


def voided(proposal: Proposal) -> str:
    return ", ".join(a.approver for a in proposal.approvals) or "none"


def void_note(proposal: Proposal) -> str:
    """What a stale proposal's message says of its approvals (all void)."""
    return f"its approvals by {voided(proposal)} are void; " if proposal.approvals else ""


def rule_of(decision: Decision) -> ApprovalRule:
    """The N of M a policy decision asks for."""
    return ApprovalRule(decision.approvals_required, decision.approver_roles, decision.reason_required)


def as_shown(tool: str, args_digest: str, plan: Plan) -> tuple[Any, dict[str, Any] | None, str]:
    """A plan as a proposal shows it (affected objects and blast radius, redacted and bounded) and the
    digest its approvals bind to (``guard.approvals.shown_digest``)."""
    affected = displayable([a.to_dict() for a in plan.affected])
    blast = displayable(dict(plan.blast_radius)) if plan.blast_radius is not None else None
    return affected, blast, shown_digest(tool, args_digest, affected, blast)


def proposer_keys(principal: Any) -> tuple[str, str | None]:
    """The keys a new proposal keeps of its proposer: ``Proposal.caller_key`` and ``acting_for_key``."""
    return key_of(principal), key_text(principal.acting_for_key)


def clean_reason(text: str | None) -> str:
    """A human's reason as kept and shown: redacted (no secret survives), sanitized and bounded; one
    with no visible character (only spaces, zero-width or other invisible ones) is no reason: ``""``."""
    given = " ".join(str(text or "").split())
    return displayable_text(given, MAX_REASON_CHARS) if visible(given) else ""


def proposal_view(p: Proposal, now: float) -> dict[str, Any]:
    """A proposal as shown to callers and humans (redacted and bounded, ``gateway.audit.redact.displayable``;
    never the token or its hash)."""
    view = {
        "proposal_id": p.id,
        "state": p.state,
        "target": p.target,
        "target_host": p.target_host,
        "tool": p.tool,
        "summary": p.plan_summary,
        "affected": p.affected,
        "requested_by": p.caller,
        "requires_human_approval": p.require_web_approval,
        "expires_in_seconds": max(0, int(p.expires_at - now)),
        "created_at": p.created_at,
        "approved_by": p.approved_by,
        "outcome": p.outcome,
        "error": p.error,
        **approval_view(p),
    }
    return displayable(view)  # type: ignore[no-any-return]
