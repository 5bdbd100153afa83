"""N of M: whether one person's approval counts, and whether the approvals so far are enough. Pure.

An approval counts from a person of an admitted role, once per person, on the proposal as shown: its
digest (``shown_digest``) covers the tool, arguments, resolved objects and blast radius, and a
different digest when re-read voids the approvals (the proposal becomes ``stale``).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.guard.callers import within
from gateway.proposals import Approval
from gateway.vocabulary import Kind

#: longest reason kept (characters, after sanitizing); a longer one is cut with a marker
MAX_REASON_CHARS: Final = 500


@dataclass(frozen=True)
class ApprovalRule:
    """What a proposal's approval needs: ``required`` distinct persons, of ``roles`` (empty: any role with
    the approve right), each giving a reason when ``reason_required``."""

    required: int = 1
    roles: tuple[str, ...] = ()
    reason_required: bool = False

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None) -> ApprovalRule:
        """From ``Proposal.approval_rule`` (None: one approval, any approver, no reason needed)."""
        if not stored:
            return cls()
        return cls(required=max(1, int(stored.get("required", 1))),
                   roles=tuple(str(r) for r in stored.get("roles") or ()),
                   reason_required=bool(stored.get("reason_required", False)))

    def stricter(self, other: ApprovalRule) -> ApprovalRule:
        """The stricter of two rules (the proposal's as made, and the policy's now): more approvals, a
        reason if either wants one, the roles of whichever names some (both: those in both)."""
        roles = (tuple(r for r in self.roles if r in other.roles) if self.roles and other.roles
                 else self.roles or other.roles)
        return ApprovalRule(max(self.required, other.required), roles,
                            self.reason_required or other.reason_required)

    def to_dict(self) -> dict[str, Any]:
        return {"required": self.required, "roles": list(self.roles), "reason_required": self.reason_required}


@dataclass(frozen=True)
class Tally:
    """The approvals that count on a proposal now: ``have`` of ``need``, by whom; ``complete``: it may run."""

    have: int
    need: int
    #: the display names of the persons counted (rows and cards show them), and their keys (decided on)
    by: tuple[str, ...]
    keys: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return self.have >= self.need

    @property
    def text(self) -> str:
        """e.g. ``1 of 2 approvals``."""
        return f"{self.have} of {self.need} approval{'s' if self.need != 1 else ''}"


def approval_refusal(approver: str | None, role: str, rule: ApprovalRule, approved_by: Sequence[str],
                     *, deciding: str) -> str | None:
    """Why the person with key text ``approver`` (of ``role``; None: no key, approves nothing) may not
    approve (``deciding="approve"``) or deny (``"deny"``) a proposal with ``rule`` that the persons keyed
    ``approved_by`` already approved, as a reason code; None: no objection
    here (``proposal_rights`` checked kind, right and self-approval first). A person who approved may
    still deny (they changed their mind); nobody approves twice."""
    if rule.roles and role not in rule.roles:
        return "not_an_approver_role"
    if deciding == "approve" and (approver is None or within(approver, approved_by)):
        return "already_approved"
    return None


def reason_missing(rule: ApprovalRule, reason: str | None) -> bool:
    """Whether a decision with ``reason`` is refused because the rule wants one (None: not asked yet,
    e.g. the page deciding which buttons to offer)."""
    return reason is not None and rule.reason_required and not visible(reason)


def visible(text: str) -> bool:
    """Whether ``text`` holds a character a reader sees: not only spaces and the invisible ones
    (zero-width, format, control, private-use and unassigned characters: a reason made of them is none)."""
    return any(not ch.isspace() and unicodedata.category(ch) not in _INVISIBLE for ch in text)


#: Unicode categories that show nothing: control, format (zero-width space, joiners, bidi marks),
#: surrogate, private use, unassigned; separators are caught by ``isspace`` or are listed here too
_INVISIBLE: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp", "Mn", "Me"})


def counts(approval: Approval, rule: ApprovalRule, digest: str | None) -> bool:
    """Whether one recorded approval counts toward ``rule`` on the proposal as shown now (``digest``):
    an approval stored without its approver's key (before keys were kept) counts for nobody."""
    return (approval.approver_key is not None and approval.kind == Kind.PERSON.value
            and (not rule.roles or approval.role in rule.roles)
            and (digest is None or approval.digest == digest))


def tally(rule: ApprovalRule, approvals: Sequence[Approval], digest: str | None) -> Tally:
    """The approvals that count (``counts``), each person (by ``approver_key``) once, in the order they
    landed: one person signing in again under a new name (a changed email) is still one."""
    by: list[str] = []
    keys: list[str] = []
    for approval in approvals:
        if counts(approval, rule, digest) and not within(approval.approver_key, keys):
            by.append(approval.approver)
            keys.append(str(approval.approver_key))
    return Tally(len(keys), rule.required, tuple(by), tuple(keys))


def shown_digest(tool: str, args_digest: str, affected: Sequence[Mapping[str, Any]],
                 blast_radius: Mapping[str, Any] | None) -> str:
    """The sha256 of a proposal as shown: tool, arguments' digest, objects (type, moid, name), blast
    radius."""
    objects = sorted((str(a.get("type")), str(a.get("moid")), str(a.get("name"))) for a in affected)
    body = {"tool": tool, "args": args_digest, "objects": objects, "blast_radius": blast_radius or {}}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def blast_changes(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    """Which facts of the blast radius differ (top level and per object, named), for the stale message."""
    old, new = before or {}, after or {}
    changed = [key for key in sorted(set(old) | set(new))
               if key != "objects" and old.get(key) != new.get(key)]
    old_objects = {str(o.get("moid")): o for o in old.get("objects") or ()}
    for obj in new.get("objects") or ():
        prior = old_objects.get(str(obj.get("moid")))
        if prior is None:
            changed.append(f"{obj.get('name')}: new object")
            continue
        changed += [f"{obj.get('name')}: {key}" for key in sorted(set(prior) | set(obj))
                    if prior.get(key) != obj.get(key)]
    return changed


def approval_view(p: Any) -> dict[str, Any]:
    """What a proposal (``gateway.proposals.Proposal``) shows of its N of M and blast radius, for the card,
    ``list_pending_actions``, ``gateway pending list`` and notifications: plain values (the caller
    redacts and bounds them with the rest of the view)."""
    rule = ApprovalRule.of(p.approval_rule)
    counted = tally(rule, p.approvals, p.shown_digest)
    view: dict[str, Any] = {"blast_radius": p.blast_radius}
    if p.require_web_approval:
        view.update({
            "approvals_required": rule.required,
            "approver_roles": list(rule.roles),
            "reason_required": rule.reason_required,
            "approvals_progress": counted.text,
            "approvals": [a.to_dict() for a in p.approvals if within(a.approver_key, counted.keys)],
        })
    denial = p.result if p.state == "denied" and isinstance(p.result, Mapping) else None
    if denial is not None and denial.get("reason"):
        view["deny_reason"] = denial["reason"]
    return view
