"""The one authorization decision: ``authorize(facts) -> Verdict``, pure, for every entry point.

Every way a call reaches vSphere asks it with the facts of that moment; no entry point keeps a check
of its own. The order is fixed so a caller learns nothing it may not know: token, role, policy, then
state and preconditions, which only a caller the guard let through hears of. With no usable rules
every call is refused, reads included. ``proposal_rights`` is the one rule for who may see, approve
and deny a proposal: only a person, never the proposer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from gateway.errors import (
    Ambiguous,
    ApprovalRequired,
    ConfirmationExpired,
    ConfirmationInvalid,
    Forbidden,
    GatewayError,
    InvalidArgument,
    InvalidState,
    NotFound,
    PolicyDenied,
    ReasonRequired,
    Stale,
)
from gateway.guard import callers
from gateway.guard.approvals import ApprovalRule, approval_refusal, reason_missing, tally
from gateway.guard.policy.evaluate import evaluate
from gateway.guard.policy.model import CallFacts, Decision, Policy
from gateway.guard.policy.read_filter import ReadFilter, read_filter
from gateway.role import Role
from gateway.vocabulary import AffectedObject, Category, Kind, Precondition, Risk


class TokenState(StrEnum):
    USABLE = "usable"
    REVOKED = "revoked"
    EXPIRED = "expired"
    UNKNOWN = "unknown"


class Entry(StrEnum):
    """How a call arrived at the guard."""

    READ = "read"
    WRITE = "write"  # a write or destructive tool call (it may become a proposal)
    BULK_OBJECT = "bulk_object"  # one object of a bulk call, judged as the tool it reaches
    CONFIRM = "confirm"  # the proposer's confirm_action
    CANCEL = "cancel"  # the proposer's cancel_action
    APPROVE = "approve"  # a human's approval (it executes the proposal)
    DENY = "deny"  # a human's denial
    LOCAL = "local"  # a tool the gateway answers itself (list_targets, list_pending_actions)


@dataclass(frozen=True)
class Party:
    """A token holder as the store says it is now: name (shown), token state, current role (None: gone),
    kind (a person or an agent), and the stable keys decisions compare (``guard.callers``): ``key``, the
    caller's ``CallerKey`` text, and ``person_key``, the person behind it (itself when a person, the
    person an agent acts for). A party built without a key (a table of plain values, a refusal row's
    context) is keyed ``unkeyed:<name>`` (``callers.unkeyed``): it matches only parties built the same
    way, never a caller the gateway serves, whose parties always carry their real key."""

    name: str
    token: TokenState
    role: Role | None
    kind: Kind = Kind.AGENT
    key: str | None = None
    person_key: str | None = None

    def __post_init__(self) -> None:
        if self.key is None:
            object.__setattr__(self, "key", callers.unkeyed(self.name))
            if self.kind is Kind.PERSON and self.person_key is None:
                object.__setattr__(self, "person_key", self.key)


@dataclass(frozen=True)
class Proposed:
    """What the rights on one proposal depend on, as plain values: its proposer and target, the persons
    whose approvals count so far and what its approval needs (``guard.approvals.ApprovalRule``)."""

    proposer: str
    target: str
    id: str | None = None
    #: the proposer's key and the key of the person an agent made it for (who may never decide it); a
    #: proposal stored before keys were kept is keyed ``unkeyed:<its caller>`` like a ``Party`` built
    #: without one: no caller the gateway serves matches it
    proposer_key: str | None = None
    acting_for_key: str | None = None
    #: the keys of the persons whose approvals count so far (``guard.approvals.tally``)
    approved_by: tuple[str, ...] = ()
    rule: ApprovalRule = field(default_factory=ApprovalRule)

    def __post_init__(self) -> None:
        if self.proposer_key is None:
            object.__setattr__(self, "proposer_key", callers.unkeyed(self.proposer))

    @classmethod
    def of(cls, proposal: Any) -> Proposed:
        """From a stored proposal (``gateway.proposals.Proposal``)."""
        rule = ApprovalRule.of(proposal.approval_rule)
        return cls(proposer=proposal.caller, target=proposal.target, id=proposal.id,
                   proposer_key=proposal.caller_key, acting_for_key=proposal.acting_for_key,
                   approved_by=tally(rule, proposal.approvals, proposal.shown_digest).keys, rule=rule)


#: an agent acting for a person (an identity provider's token carrying that person's subject, used by
#: an MCP client) is shown as ``<person> via <client>``; only a display name: decisions compare keys
ACTING_FOR: Final = " via "


@dataclass(frozen=True)
class ProposalRights:
    """What one party may do with one proposal: whether it sees it, and the refusal of an approval and
    of a denial (None: allowed, as far as who decides goes; ``authorize`` decides the rest)."""

    see: bool
    approve: Verdict | None
    deny: Verdict | None


@dataclass(frozen=True)
class Facts:
    """Everything the decision may look at. ``owner`` is the proposer for proposal entry points."""

    entry: Entry
    actor: Party
    tool: str
    category: Category
    risk: Risk
    now: datetime
    target: str | None = None
    target_known: bool = True
    target_tags: tuple[str, ...] = ()
    #: tools this call runs on the caller's behalf, with their categories
    reaches: tuple[tuple[str, Category], ...] = ()
    affected: tuple[AffectedObject, ...] = ()
    object_count: int = 0
    override: bool = False
    owner: Party | None = None
    #: the rules in force, or why the rules file cannot be used (exactly one is set)
    rules: Policy | None = None
    rules_error: str | None = None
    #: why the proposal itself cannot move now, as (error code, message), from guard.confirm
    proposal_problem: tuple[str, str] | None = None
    unmet: tuple[Precondition, ...] = ()
    #: the proposal's id, named in the errors of proposal entry points
    proposal_id: str | None = None
    #: False for the gate before anything is read from vSphere: token, role and the proposal's own
    #: state are decided; policy and vSphere state wait for the resolved call (authorize runs again)
    resolved: bool = True
    #: every write and destructive tool served (the proposal tools come with the first one a role holds)
    change_tools: tuple[tuple[str, Category], ...] = ()
    #: for approve and deny: the proposal as its rights see it (who approved, what it needs)
    proposed: Proposed | None = None
    #: for approve and deny: the reason the human gave ("" none; None: not asked, e.g. the page's buttons)
    reason: str | None = None


@dataclass(frozen=True)
class Verdict:
    """The answer. ``code`` is the wire error code of a refusal; ``decision`` the policy's, if consulted."""

    allowed: bool
    reason: str
    rule: str
    code: str | None = None
    decision: Decision | None = None
    require_approval: bool = False
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"allowed": self.allowed, "reason": self.reason, "rule": self.rule}
        if self.decision is not None:
            out.update({k: v for k, v in self.decision.to_dict().items() if k not in out})
            out["allowed"], out["reason"], out["rule"] = self.allowed, self.reason, self.rule
        out["require_approval"] = self.require_approval
        return out

    def raise_if_refused(self) -> None:
        """Raise the refusal as its typed error (carrying this verdict for the audit row)."""
        if self.allowed:
            return
        kind = _ERRORS.get(self.code or "", Forbidden)
        if kind is InvalidArgument:  # a precondition on an argument: its message names the field already
            field_name = str(self.details.get("field", "arguments"))
            error: GatewayError = InvalidArgument(field_name, self.reason.removeprefix(f"{field_name}: "))
            error.details.update({**self.details, "decision": self.to_dict()})
            raise error
        raise kind(self.reason, decision=self.to_dict(), **self.details)


_ERRORS: Final[Mapping[str, type[GatewayError]]] = {
    "not_found": NotFound,
    "forbidden": Forbidden,
    "policy_denied": PolicyDenied,
    "approval_required": ApprovalRequired,
    "confirmation_invalid": ConfirmationInvalid,
    "confirmation_expired": ConfirmationExpired,
    "invalid_state": InvalidState,
    "invalid_argument": InvalidArgument,
    "ambiguous": Ambiguous,
    "stale": Stale,
    "reason_required": ReasonRequired,
}
#: entry points that run a change (the policy is consulted) and those that act on a proposal
_POLICY_ENTRIES: Final = frozenset({Entry.READ, Entry.WRITE, Entry.BULK_OBJECT, Entry.CONFIRM, Entry.APPROVE})
_PROPOSAL_ENTRIES: Final = frozenset({Entry.CONFIRM, Entry.CANCEL, Entry.APPROVE, Entry.DENY})
_EXECUTING_ENTRIES: Final = frozenset({Entry.CONFIRM, Entry.APPROVE})

UNKNOWN_TOOL: Final = "unknown tool '{tool}'; call tools/list to see the tools available to you"


def _refuse(code: str, reason: str, rule: str, decision: Decision | None = None, **details: Any) -> Verdict:
    return Verdict(False, reason, rule, code, decision, details=details)


def proposal_rights(viewer: Party, proposed: Proposed) -> ProposalRights:
    """Who may see, approve and deny a proposal: one rule for every surface. Pure.

    See: a role covering the proposal's target, and either its proposer or a role with the approve
    right. Approve and deny: one who sees it, is a person, has the approve right, and did not
    propose it (by any surface, whatever the role). The refusals are checked in that order, so the
    first reason is the one reported. Then N of M (``guard.approvals.approval_refusal``): a role
    outside the proposal's ``approver_roles`` neither approves nor denies (``not_an_approver_role``),
    and nobody approves twice (``already_approved``)."""
    role = viewer.role
    own = callers.own_proposal(viewer.key, viewer.person_key, proposed.proposer_key, proposed.acting_for_key)
    see = role is not None and role.permits_target(proposed.target) and (own or role.approve != "none")
    refusal = _decider_refusal(viewer, proposed, see=see, own=own)
    if refusal is not None or role is None:
        return ProposalRights(see=see, approve=refusal, deny=refusal)
    approve, deny = (_n_of_m_refusal(viewer.person_key or viewer.key, role.name, proposed, deciding)
                     for deciding in ("approve", "deny"))
    return ProposalRights(see=see, approve=approve, deny=deny)


def _n_of_m_refusal(key: str | None, role: str, proposed: Proposed, deciding: str) -> Verdict | None:
    code = approval_refusal(key, role, proposed.rule, proposed.approved_by, deciding=deciding)
    if code == "not_an_approver_role":
        return _refuse(
            "forbidden",
            f"this proposal needs approvers of role {', '.join(proposed.rule.roles)} (approver_roles in "
            f"rules.yaml), and yours is '{role}'; ask one of them",
            "approver_roles", reason_code=code, proposal_id=proposed.id,
        )
    if code == "already_approved":
        return _refuse(
            "forbidden",
            f"you approved this already ({len(proposed.approved_by)} of {proposed.rule.required} "
            "approvals so far); each approval must come from a different person, so ask another approver",
            "approvals:distinct", reason_code=code, proposal_id=proposed.id,
        )
    return None


def _decider_refusal(viewer: Party, proposed: Proposed, *, see: bool, own: bool) -> Verdict | None:
    role = viewer.role
    if role is None or not see:
        return _refuse("not_found", f"no proposal {proposed.id} that you may see",
                       f"role:{role.name if role else '-'}", reason_code="not_visible")
    if viewer.kind is not Kind.PERSON:
        return _refuse(
            "forbidden",
            "only a person approves or denies a proposal, and you are an agent (an agent's token, or the "
            "stdio session); a person signs in to the page with their own token (`gateway token create "
            "NAME --role ROLE --kind person`) or runs `gateway pending` on the gateway's host",
            "kind:agent", reason_code="not_a_person", proposal_id=proposed.id,
        )
    if role.approve == "none":
        return _refuse(
            "forbidden",
            f"your role '{role.name}' may not approve or deny proposals; ask someone whose role has "
            "'approve: any'",
            "approve:none", reason_code="no_approve_right", proposal_id=proposed.id,
        )
    if own:
        return _refuse(
            "forbidden",
            "you proposed this (or an agent acting for you did), and nobody approves or denies their own "
            "proposal whatever their role; ask "
            "another approver (its proposer may cancel it with cancel_action)",
            "approve:own", reason_code="own_proposal", proposal_id=proposed.id,
        )
    return None


#: tools the gateway answers itself on proposals; granted with the first write or destructive tool
PROPOSAL_TOOLS: Final = frozenset({"list_pending_actions", "confirm_action", "cancel_action"})


def tool_permitted(
    role: Role, tool: str, category: Category, change_tools: tuple[tuple[str, Category], ...]
) -> bool:
    """Whether ``role`` holds ``tool`` (for tools/list and the gate alike)."""
    if tool in PROPOSAL_TOOLS:
        return any(role.permits_tool(name, kind) for name, kind in change_tools if name not in PROPOSAL_TOOLS)
    return role.permits_tool(tool, category)


def authorize(facts: Facts) -> Verdict:
    """Decide one entry point from ``facts``: token -> role -> policy -> state. Pure."""
    step: Callable[[Facts], Verdict | None]
    for step in (_token, _role, _owner):
        refused = step(facts)
        if refused is not None:
            return refused
    if not facts.resolved:
        gate = Verdict(True, "token and role allow this call; policy decides once it is resolved", "gate")
        return _state(replace(facts, unmet=()), gate) or gate
    verdict = _policy(facts)
    if not verdict.allowed:
        return verdict
    return _state(facts, verdict) or verdict


def authorize_resolved(facts: Facts, reached: Sequence[tuple[str, Category, Risk]] = ()) -> Verdict:
    """The whole decision on a resolved call, in its fixed order; the first refusal wins. Pure.

    1. the call itself (``authorize`` without the preconditions): token, role, policy;
    2. each affected object as each tool the call ``reached`` runs on it (``bulk_vm_action`` with
       ``action=delete_vm`` is judged on every VM as ``delete_vm``), by the proposer at execution;
    3. the preconditions vSphere's state does not meet (``facts.unmet``), answered last, so a caller
       any earlier step refuses never hears about power state, disks or snapshots.

    Returns the call's verdict (step 1) when everything allows it."""
    verdict = authorize(replace(facts, unmet=()))
    if not verdict.allowed:
        return verdict
    for one in _as_reached(facts, reached):
        refused = authorize(one)
        if not refused.allowed:
            return refused
    return _state(facts, verdict) or verdict


def _as_reached(facts: Facts, reached: Sequence[tuple[str, Category, Risk]]) -> Iterator[Facts]:
    """The facts of each affected object as each reached tool, in order."""
    for tool, category, risk in reached:
        for obj in facts.affected:
            one = replace(facts, entry=Entry.BULK_OBJECT, tool=tool, category=category, risk=risk,
                          affected=(obj,), object_count=1, reaches=(), proposal_problem=None, unmet=())
            if facts.entry in _EXECUTING_ENTRIES and facts.owner is not None:
                one = replace(one, actor=facts.owner, owner=None)
            yield one


def _token(f: Facts) -> Verdict | None:
    if f.actor.token is not TokenState.USABLE:
        return _refuse(
            "forbidden",
            f"your token is {f.actor.token.value}; ask for a new one",
            f"token:{f.actor.token.value}",
        )
    return None


def _holds(role: Role, f: Facts) -> str | None:
    """Why ``role`` may not make this call (tool, reach, target), or None."""
    if not tool_permitted(role, f.tool, f.category, f.change_tools):
        return "tool"
    for name, category in f.reaches:
        if not role.permits_tool(name, category):
            return name
    if f.target is not None and (not f.target_known or not role.permits_target(f.target)):
        return "target"
    return None


def _role(f: Facts) -> Verdict | None:
    role = f.actor.role
    rule = f"role:{role.name if role else '-'}"
    if role is None:
        if f.entry in (Entry.APPROVE, Entry.DENY):
            return _refuse("not_found", f"no proposal {f.proposal_id} that you may see", rule)
        return _refuse("not_found", UNKNOWN_TOOL.format(tool=f.tool), rule)
    if f.entry in (Entry.CONFIRM, Entry.CANCEL):
        if f.owner is None or not callers.same(f.owner.key, f.actor.key):
            return _refuse(
                "confirmation_invalid",
                "this confirmation token is not valid for you; make a fresh proposal",
                "caller:bound",
            )
        return None
    if f.entry in (Entry.APPROVE, Entry.DENY):
        if f.owner is None or f.target is None:  # a proposal always has both: fail closed
            return _refuse("not_found", f"no proposal {f.proposal_id} that you may see", rule)
        return _decider(f, f.proposed or Proposed(f.owner.name, f.target, f.proposal_id,
                                                  proposer_key=f.owner.key,
                                                  acting_for_key=f.owner.person_key))
    if f.entry is Entry.LOCAL:
        if not tool_permitted(role, f.tool, f.category, f.change_tools):
            return _refuse("not_found", UNKNOWN_TOOL.format(tool=f.tool), rule)
        return None
    missing = _holds(role, f)
    if missing == "tool":
        return _refuse("not_found", UNKNOWN_TOOL.format(tool=f.tool), rule)
    if missing == "target":
        return _refuse("not_found", f"unknown target '{f.target}'", rule)
    if missing is not None:
        return _refuse(
            "forbidden",
            f"{f.tool} here runs {missing}, which your role '{role.name}' does not "
            f"hold; ask for a role with {missing}, or call a tool your role has",
            rule,
        )
    return None


def _decider(f: Facts, proposed: Proposed) -> Verdict | None:
    """An approve or deny: the proposal's rights for the actor, then the reason its rule may require."""
    rights = proposal_rights(f.actor, proposed)
    refused = rights.approve if f.entry is Entry.APPROVE else rights.deny
    if refused is None and reason_missing(proposed.rule, f.reason):
        verb = "approving" if f.entry is Entry.APPROVE else "denying"
        return _refuse(
            "reason_required",
            f"this proposal needs a reason for {verb} it (reason_required in rules.yaml); give one "
            f"(the page's reason field, or `gateway pending {f.entry.value} {f.proposal_id} --reason "
            "TEXT`)",
            "reason_required", reason_code="reason_required", proposal_id=f.proposal_id,
        )
    return refused


def _owner(f: Facts) -> Verdict | None:
    """At execution, the proposer as they are now: usable token, and a role that still holds the call."""
    if f.entry not in _EXECUTING_ENTRIES or f.owner is None:
        return None
    owner = f.owner
    if owner.token is not TokenState.USABLE:
        return _refuse(
            "forbidden",
            f"the token of {owner.name}, who proposed this, is {owner.token.value}; the proposal cannot run",
            f"token:{owner.token.value}",
            proposal_id=f.proposal_id,
        )
    if owner.role is None or _holds(owner.role, f) is not None:
        name = owner.role.name if owner.role else "a role that no longer exists"
        return _refuse(
            "forbidden",
            f"{owner.name}'s role is now {name}, which does not allow {f.tool} on "
            f"target '{f.target}'; the proposal cannot run",
            f"role:{name}",
            proposal_id=f.proposal_id,
        )
    return None


def call_facts(f: Facts) -> CallFacts:
    """What the policy sees of ``f``: at execution the proposer's name and role, else the actor's."""
    who = f.owner if f.entry in _EXECUTING_ENTRIES and f.owner is not None else f.actor
    return CallFacts(
        tool=f.tool,
        category=f.category,
        risk=f.risk,
        target=f.target or "",
        target_tags=f.target_tags,
        affected=f.affected,
        caller=who.name,
        role=who.role.name if who.role else "-",
        override=f.override,
        object_count=f.object_count,
    )


def read_rules(f: Facts) -> ReadFilter | None:
    """What a read authorized on ``f`` may show (``guard.policy.read_filter``), or None: everything."""
    if f.entry is not Entry.READ:
        return None
    return read_filter(f.rules, call_facts(f), f.now)


def _policy(f: Facts) -> Verdict:
    if f.entry not in _POLICY_ENTRIES:
        return Verdict(True, "no policy applies to this entry point", f"entry:{f.entry.value}")
    if f.rules is None:  # the rules file cannot be used (broken at start or by an edit): nothing falls back
        why = f.rules_error or "the rules file cannot be used"
        return _refuse(
            "policy_denied",
            f"{why}; every call the policy decides, reads included, is denied until it is "
            "fixed (`gateway policy show` lists the problems)",
            "policy:error",
        )
    try:
        decision = evaluate(call_facts(f), f.rules, f.now)
    except Exception:  # a bug in the engine denies, it never lets through (reads too: rules filter them)
        return _refuse(
            "policy_denied", "the policy engine failed on this call (see the gateway log)", "policy:error"
        )
    if not decision.allowed:
        return _refuse("policy_denied", decision.reason, decision.rule or "policy", decision)
    if f.entry is Entry.CONFIRM and decision.require_approval:
        refused = _refuse(
            "approval_required",
            f"target '{f.target}' requires a human to approve this action: it waits in the approval "
            f"page (/ui) or for `gateway pending approve {f.proposal_id}`; it executes once approved, "
            "so do not confirm it again",
            decision.rule or "policy",
            decision,
            proposal_id=f.proposal_id,
        )
        return replace(refused, require_approval=True)  # the answer's decision says why it waits
    return Verdict(
        True,
        decision.reason,
        decision.rule or "policy",
        None,
        decision,
        require_approval=decision.require_approval,
    )


def _state(f: Facts, verdict: Verdict) -> Verdict | None:
    if f.proposal_problem is not None:
        code, message = f.proposal_problem
        return replace(
            verdict,
            allowed=False,
            code=code,
            reason=message,
            rule="proposal:state",
            details={"proposal_id": f.proposal_id} if f.proposal_id else {},
        )
    if f.unmet:
        first = f.unmet[0]
        return replace(
            verdict,
            allowed=False,
            code=first.code,
            reason=first.message,
            rule="state",
            details=dict(first.details),
        )
    return None


def token_state(record: Any, now: float) -> TokenState:
    """The state of a stored token record (``store.base.TokenRecord`` or None) at ``now``."""
    if record is None:
        return TokenState.UNKNOWN
    if record.revoked:
        return TokenState.REVOKED
    if record.expired(now):
        return TokenState.EXPIRED
    return TokenState.USABLE


# -- who reads what: the audit views and the targets' addresses -------------------------------------


def audit_view(role: Role) -> Verdict:
    """May ``role`` open the audit views (the web page's Audit tab and its chain check)? Pure."""
    if role.audit == "none":
        return _refuse("forbidden", f"role '{role.name}' may not read the audit log; give it 'audit: own' "
                       "(its own calls) or 'audit: all' in roles.yaml", "role:audit")
    return Verdict(True, f"role '{role.name}' reads {role.audit} audit rows", "role:audit")


def may_read_audit_row(role: Role, viewer: str, row: Mapping[str, Any], *,
                       viewer_key: str | None = None) -> bool:
    """May the caller named ``viewer`` (whose key text is ``viewer_key``) with ``role`` read audit ``row``?
    ``none``: never; ``own``: rows whose ``caller_key`` is ``viewer_key`` (a row without one is nobody's
    own), or, asked without a key, rows whose caller is ``viewer``; ``all``: every row for a role covering
    every target, else rows whose target(s) the role covers. Pure."""
    if role.audit == "own":
        if viewer_key is not None:
            return callers.same_row_caller(row, viewer, viewer_key)
        return row.get("caller") == viewer
    if role.audit != "all":
        return False
    if role.all_targets:
        return True
    target = row.get("target")
    return isinstance(target, str) and bool(target) and all(role.permits_target(t) for t in target.split(","))


def sees_target_addresses(role: Role | None) -> bool:
    """Whether a caller with ``role`` is shown the targets' hosts, addresses and ports (``list_targets``,
    the MCP server's instructions): an admin's only, a role that may call every tool on every target
    (the built-in reader covers every target too, but learns no address from it). Pure."""
    return role is not None and role.all_targets and role.tools == "*"
