"""Replaying audited calls through two rules files: which calls a rules change would decide otherwise.

Each call row is rebuilt into the decision's facts (``guard.decision.Facts``: its tool, target, caller,
role, time, arguments and, where the row records them, the objects it affected) and decided by the
same ``authorize`` (a read) or ``authorize_resolved`` (a change) the server runs, once under the rules
in force and once under a candidate. ``replay`` reports each call whose outcome differs, and each call
that cannot be replayed with why (a change whose row records no objects, where the rules look at
them). Pure: rows, rules and today's tools, roles and targets in; a report out.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, Final

from gateway.guard.decision import (
    PROPOSAL_TOOLS,
    Entry,
    Facts,
    Party,
    TokenState,
    Verdict,
    authorize,
    authorize_resolved,
    call_facts,
)
from gateway.guard.policy.model import Action, CallFacts, Policy, TargetPolicy
from gateway.role import Role
from gateway.vocabulary import AffectedObject, Category, Kind, Risk

#: the phases of a row that records a call as it arrived (its decision, or its refusal)
CALL_PHASES: Final = frozenset({"call", "executing", "dry_run", "proposed", "denied", "failed", "invalid",
                                "refused"})
#: phases that, with an ``outcome``, record what became of a change after its intent row
_OUTCOME_PHASES: Final = frozenset({"executed", "failed", "outcome_unknown"})
#: refusals of one target of a fan-out read that have a ``denied`` row of their own
_FAN_OUT_REFUSALS: Final = frozenset({"policy_denied", "rate_limited"})
#: the objects' key in a bounded list: how many items the audit left out
_MORE_ITEMS: Final = "more_items"
#: examples kept per group of changes and per reason a call was not replayed
EXAMPLES: Final = 5
#: an object count no ``min_affected_objects`` exceeds (the count of a row that records none)
_ANY_COUNT: Final = 2**62

ALLOWED, APPROVAL, DENIED, REFUSED = "allowed", "approval required", "denied", "refused"


@dataclass(frozen=True)
class ToolFacts:
    """What the replay needs to know of one tool (today's registry): its category and risk, whether
    the policy decides it (False for a tool the gateway answers itself), and the tools a call with
    given arguments reaches (``ToolSpec.reaches``)."""

    category: Category
    risk: Risk
    policy_decides: bool = True
    reaches: Callable[[Mapping[str, Any]], tuple[str, ...]] | None = None


@dataclass(frozen=True)
class World:
    """Today's configuration the rows are replayed in: the tools, the roles by name and each target's
    tags (a target not in it is one targets.yaml no longer names)."""

    tools: Mapping[str, ToolFacts]
    roles: Mapping[str, Role]
    targets: Mapping[str, tuple[str, ...]]

    @functools.cached_property
    def change_tools(self) -> tuple[tuple[str, Category], ...]:
        """Every write and destructive tool (``Facts.change_tools``)."""
        return tuple((name, t.category) for name, t in self.tools.items()
                     if t.category is not Category.READ and name not in PROPOSAL_TOOLS)


@dataclass(frozen=True)
class Call:
    """One call as its audit row recorded it, on one target (a fan-out read is one per target)."""

    seq: int | None
    ts: str
    when: datetime
    caller: str
    caller_key: str | None
    kind: Kind
    role: str
    tool: str
    target: str
    phase: str
    #: what the row says became of it: its error code, else its outcome, else its phase
    recorded: str
    risk: Risk | None
    args: Mapping[str, Any]
    #: the objects it affected as recorded (None: the row records none, or not all of them)
    objects: tuple[AffectedObject, ...] | None
    #: how many objects it affected (None: not recorded)
    count: int | None
    correlation_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "ts": self.ts, "caller": self.caller, "caller_key": self.caller_key,
                "role": self.role, "tool": self.tool, "target": self.target, "phase": self.phase,
                "recorded": self.recorded, "correlation_id": self.correlation_id}


@dataclass(frozen=True)
class Outcome:
    """What one set of rules decides for one call: allowed, approval required, denied (by the policy)
    or refused before the policy (token, role, target); the rule that decided, and for a change what
    its proposal needs (N of M, confirm_by) and whether it would only be simulated (dry_run)."""

    verdict: str
    rule: str
    reason: str
    #: for a call that waits as a proposal (a destructive call, or one needing an approval)
    confirm_by: str | None = None
    #: for an approval: distinct approvers, their roles (empty: any), whether each gives a reason
    approvals: tuple[int, tuple[str, ...], bool] | None = None
    dry_run: bool = False

    @classmethod
    def of(cls, verdict: Verdict, category: Category) -> Outcome:
        if not verdict.allowed:
            kind = DENIED if verdict.code == "policy_denied" else REFUSED
            return cls(kind, verdict.rule, verdict.reason)
        decision = verdict.decision
        if decision is None:  # allowed without the policy (a tool no policy decides)
            return cls(ALLOWED, verdict.rule, verdict.reason)
        approval = verdict.require_approval
        proposal = approval or category is Category.DESTRUCTIVE
        return cls(
            APPROVAL if approval else ALLOWED, verdict.rule, verdict.reason,
            confirm_by=decision.confirm_by if proposal else None,
            approvals=(decision.approvals_required, decision.approver_roles, decision.reason_required)
            if approval else None,
            dry_run=decision.dry_run and category is not Category.READ,
        )

    def label(self) -> str:
        """The outcome in words: ``approval required (2 of admin, with a reason)``, ``denied``, ..."""
        if self.approvals is None:
            return self.verdict
        return f"{self.verdict} ({approvals_text(self.approvals)})"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.verdict, "rule": self.rule, "reason": self.reason}
        if self.approvals is not None:
            count, roles, why = self.approvals
            out.update(approvals_required=count, approver_roles=list(roles), reason_required=why)
        if self.confirm_by is not None:
            out["confirm_by"] = self.confirm_by
        if self.dry_run:
            out["dry_run"] = True
        return out


def approvals_text(approvals: tuple[int, tuple[str, ...], bool]) -> str:
    count, roles, why = approvals
    text = f"{count} of {', '.join(roles) if roles else 'any approver'}"
    return text + (", with a reason" if why else "")


def change_of(was: Outcome, now: Outcome) -> str | None:
    """How the outcome changed, in words (``allowed -> denied``, ``N of M: 1 of any approver -> 2 of
    admin``, ``confirm_by: tool -> elicitation``, ``dry_run: off -> on``), or None: it did not."""
    if was.verdict != now.verdict:
        return f"{was.verdict} -> {now.verdict}"
    if was.approvals != now.approvals and was.approvals is not None and now.approvals is not None:
        return f"N of M: {approvals_text(was.approvals)} -> {approvals_text(now.approvals)}"
    if was.confirm_by != now.confirm_by:
        return f"confirm_by: {was.confirm_by} -> {now.confirm_by}"
    if was.dry_run != now.dry_run:
        return f"dry_run: {'on' if was.dry_run else 'off'} -> {'on' if now.dry_run else 'off'}"
    return None


@dataclass(frozen=True)
class Change:
    """A call the candidate decides otherwise: the outcome under the rules in force and the candidate's."""

    call: Call
    was: Outcome
    now: Outcome
    change: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.call.to_dict(), "change": self.change, "current": self.was.to_dict(),
                "candidate": self.now.to_dict()}


@dataclass
class Group:
    """The changes of one kind that one candidate rule decides: how many, from which rules in force."""

    change: str
    rule: str
    count: int = 0
    was_rules: Counter[str] = field(default_factory=Counter)
    examples: list[Change] = field(default_factory=list)

    def add(self, change: Change, examples: int) -> None:
        self.count += 1
        self.was_rules[change.was.rule] += 1
        if not examples or len(self.examples) < examples:
            self.examples.append(change)

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.change, "rule": self.rule, "count": self.count,
                "current_rules": dict(self.was_rules.most_common()),
                "examples": [c.to_dict() for c in self.examples]}


@dataclass
class Unreplayed:
    """The calls not replayed for one reason: how many, and the first few."""

    reason: str
    count: int = 0
    examples: list[Call] = field(default_factory=list)

    def add(self, call: Call, examples: int) -> None:
        self.count += 1
        if not examples or len(self.examples) < examples:
            self.examples.append(call)

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "count": self.count, "examples": [c.to_dict() for c in self.examples]}


@dataclass
class Report:
    """What ``replay`` found: rows read, calls compared, the changes (each, and grouped by candidate
    rule), the calls not replayed by reason, and the rows that record no call (by why)."""

    rows: int = 0
    calls: int = 0
    unchanged: int = 0
    changes: list[Change] = field(default_factory=list)
    groups: dict[tuple[str, str], Group] = field(default_factory=dict)
    not_replayed: dict[str, Unreplayed] = field(default_factory=dict)
    not_calls: Counter[str] = field(default_factory=Counter)
    #: examples kept per group and per reason (0: every one)
    examples: int = EXAMPLES

    def read(self, calls: list[Call] | str) -> None:
        """Count one row: the calls it records, or why it records none."""
        self.rows += 1
        if isinstance(calls, str):
            self.not_calls[calls] += 1

    def record(self, call: Call, judged: tuple[Outcome, Outcome] | str) -> None:
        """Count one call: its outcomes under the rules in force and the candidate, or why it was not
        replayed."""
        if isinstance(judged, str):
            self.not_replayed.setdefault(judged, Unreplayed(judged)).add(call, self.examples)
            return
        self.calls += 1
        was, now = judged
        change = change_of(was, now)
        if change is None:
            self.unchanged += 1
            return
        one = Change(call, was, now, change)
        self.changes.append(one)
        key = (change, now.rule)
        self.groups.setdefault(key, Group(*key)).add(one, self.examples)

    @property
    def ordered_groups(self) -> list[Group]:
        return sorted(self.groups.values(), key=lambda g: (-g.count, g.change, g.rule))

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows, "calls": self.calls, "changed": len(self.changes), "unchanged": self.unchanged,
            "not_replayed": sum(u.count for u in self.not_replayed.values()),
            "groups": [g.to_dict() for g in self.ordered_groups],
            "changes": [c.to_dict() for c in self.changes],
            "reasons_not_replayed": [u.to_dict() for u in
                                     sorted(self.not_replayed.values(), key=lambda u: -u.count)],
            "rows_without_a_call": dict(self.not_calls.most_common()),
        }


# --------------------------------------------------------------------------- rows into calls


def calls_of(row: Mapping[str, Any], world: World) -> list[Call] | str:
    """The calls ``row`` records (one per target of a fan-out read), or why it records none: an outcome
    row of an earlier intent, a move of an existing proposal, a tool no policy decides, ..."""
    phase, tool = row.get("phase"), row.get("tool")
    if not isinstance(phase, str) or not isinstance(tool, str):
        return "not a tool call"
    if phase in _OUTCOME_PHASES and "outcome" in row:
        return "the outcome of a change already counted (its intent row)"
    if phase not in CALL_PHASES:
        return f"phase {phase}"
    if row.get("via") is not None or (row.get("proposal_id") is not None and phase != "proposed"):
        return "a step of an existing proposal (confirm, approve, deny, cancel)"
    facts = world.tools.get(tool)
    if facts is None:
        return "a tool this gateway does not offer (refused before any policy)"
    if not facts.policy_decides:
        return "a tool the gateway answers itself (no policy decides it)"
    targets = _targets(row)
    when = _when(row)
    if when is None:
        return "no readable time"
    args = row.get("args")
    objects, count = _objects(row.get("affected"))
    recorded_count = row.get("object_count")  # a plan's own count (a bulk call's matches), when recorded
    if isinstance(recorded_count, int) and not isinstance(recorded_count, bool) and recorded_count >= 0:
        count = max(recorded_count, count or 0)
    code = row.get("error_code") or row.get("outcome")
    kind = Kind.PERSON if row.get("kind") == Kind.PERSON.value else Kind.AGENT
    base = Call(
        seq=row.get("seq") if isinstance(row.get("seq"), int) else None,
        ts=str(row.get("ts", "")), when=when, caller=str(row.get("caller") or "-"),
        caller_key=row.get("caller_key") if isinstance(row.get("caller_key"), str) else None,
        kind=kind, role=str(row.get("role") or "-"), tool=tool, target="", phase=phase,
        recorded=str(code) if code else phase,
        risk=_risk(row.get("risk")),
        args=args if isinstance(args, Mapping) else {}, objects=objects, count=count,
        correlation_id=row.get("correlation_id") if isinstance(row.get("correlation_id"), str) else None,
    )
    return [replace(base, target=t) for t in targets]


def _risk(value: Any) -> Risk | None:
    try:
        return Risk(value)
    except ValueError:
        return None


def _targets(row: Mapping[str, Any]) -> list[str]:
    """The targets a row's call was decided on: a fan-out read's from its per-target ``outcomes``
    (leaving out the targets refused there, each of which has a ``denied`` row of its own); else its
    ``target``; none for a call that named no single target (a fan-out refused as a whole)."""
    outcomes = row.get("outcomes")
    if isinstance(outcomes, Mapping):
        return [str(name) for name, outcome in outcomes.items() if outcome not in _FAN_OUT_REFUSALS]
    target = row.get("target")
    if not isinstance(target, str) or not target or target == "all" or "," in target:
        return [""]  # replayed as "no single target": not replayable, said so
    return [target]


def _when(row: Mapping[str, Any]) -> datetime | None:
    epoch = row.get("ts_epoch")
    if isinstance(epoch, int | float) and not isinstance(epoch, bool):
        return datetime.fromtimestamp(epoch, UTC)
    text = row.get("ts")
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _objects(value: Any) -> tuple[tuple[AffectedObject, ...] | None, int | None]:
    """A row's ``affected`` list as objects and their count; (None, count) when the list was cut by the
    audit's bounds (the count is still known) or an item is not an object; (None, None) without one."""
    if not isinstance(value, list):
        return None, None
    objects: list[AffectedObject] = []
    more = 0
    whole = True
    for item in value:
        if isinstance(item, Mapping) and set(item) == {_MORE_ITEMS} and isinstance(item[_MORE_ITEMS], int):
            more, whole = item[_MORE_ITEMS], False
            continue
        one = _object(item)
        if one is None:
            whole = False
            continue
        objects.append(one)
    count = len(objects) + more
    return (tuple(objects) if whole else None), (count if whole or more else None)


def _object(item: Any) -> AffectedObject | None:
    if not isinstance(item, Mapping):
        return None
    kind, name, moid = item.get("type"), item.get("name"), item.get("moid")
    if not (isinstance(kind, str) and isinstance(name, str) and isinstance(moid, str)):
        return None
    extra = {k: item.get(k) for k in ("folder", "resource_pool", "connection_state")}
    if not all(v is None or isinstance(v, str) for v in extra.values()):
        return None
    return AffectedObject(kind, name, moid, **extra)


# --------------------------------------------------------------------------- one call, one set of rules


def facts_of(call: Call, tool: ToolFacts, role: Role | None, world: World, rules: Policy) -> Facts:
    """The facts ``authorize`` would have had for ``call`` under ``rules``: the caller with a usable
    token and today's definition of its recorded role, the target's tags today, the recorded risk,
    arguments, time and objects."""
    reaches: tuple[tuple[str, Category], ...] = ()
    if tool.reaches is not None:
        reached = tool.reaches(call.args)
        reaches = tuple((name, world.tools[name].category if name in world.tools else Category.DESTRUCTIVE)
                        for name in reached)
    objects = call.objects or ()
    return Facts(
        entry=Entry.READ if tool.category is Category.READ else Entry.WRITE,
        actor=Party(call.caller, TokenState.USABLE, role, call.kind, key=call.caller_key),
        tool=call.tool, category=tool.category, risk=call.risk or tool.risk, now=call.when,
        target=call.target, target_known=call.target in world.targets,
        target_tags=world.targets.get(call.target, ()), reaches=reaches, affected=objects,
        object_count=call.count if call.count is not None else len(objects),
        override=call.args.get("override") is True, rules=rules, change_tools=world.change_tools,
    )


def decide(facts: Facts, world: World) -> Verdict:
    """The server's decision on ``facts``: ``authorize`` for a read (as the read path asks it per
    target), ``authorize_resolved`` for a change (each object as each tool it reaches)."""
    if facts.entry is Entry.READ:
        return authorize(facts)
    reached = tuple((name, world.tools[name].category, world.tools[name].risk)
                    for name, _ in facts.reaches if name in world.tools)
    return authorize_resolved(facts, reached)


def object_blind_spot(facts: CallFacts, policy: Policy, *, count_known: bool) -> str | None:
    """For a change whose row records no objects: the first entry of ``policy`` whose answer depends on
    them (a protected entry covering the call, or a rule reached before the deciding one that matches
    on objects, or on their number when it is unknown), or None: the policy decides it without them.
    Asks the model's own predicates (``Protected.covers``, ``Match.fits_call``); decides nothing."""
    for entry in policy.protected:
        if entry.covers(facts):
            return f"protected:{entry.name}"
    probe = facts if count_known else replace(facts, object_count=_ANY_COUNT)  # every count fits
    for rule in policy.rules:
        if not rule.match.fits_call(probe):
            continue
        if rule.match.object_fields or (not count_known and rule.match.min_affected_objects is not None):
            return f"rule:{rule.name}"
        if rule.action is Action.DENY and rule.unless_override and facts.override:
            continue
        return None
    return None


# --------------------------------------------------------------------------- the replay


class _Settled(Policy):
    """The same rules, each target's settings worked out once per replay: ``Policy.target_settings`` is
    pure, and every call on a target asks it again (the layering of defaults and globs)."""

    @classmethod
    def of(cls, policy: Policy) -> Policy:
        return cls(**{f.name: getattr(policy, f.name) for f in fields(policy)})

    def target_settings(self, target: str) -> TargetPolicy:
        memo: dict[str, TargetPolicy] = self.__dict__.setdefault("_settings", {})
        found = memo.get(target)
        if found is None:
            found = memo[target] = super().target_settings(target)
        return found


def replay(rows: Iterable[Mapping[str, Any]], current: Policy, candidate: Policy, world: World, *,
           examples: int = EXAMPLES) -> Report:
    """Decide every call ``rows`` record under ``current`` and under ``candidate``; report the calls
    whose outcome differs and those that cannot be replayed (with why). Pure."""
    report = Report(examples=examples)
    current, candidate = _Settled.of(current), _Settled.of(candidate)
    for row in rows:
        calls = calls_of(row, world)
        report.read(calls)
        for call in calls if not isinstance(calls, str) else ():
            report.record(call, judge(call, current, candidate, world))
    return report


def judge(call: Call, current: Policy, candidate: Policy, world: World) -> tuple[Outcome, Outcome] | str:
    """``call``'s outcome under ``current`` and under ``candidate``, or why it cannot be replayed."""
    why = _unreplayable(call, world)
    if why is not None:
        return why
    tool, role = world.tools[call.tool], world.roles[call.role]
    before = facts_of(call, tool, role, world, current)
    if tool.category is not Category.READ and call.objects is None:
        blind = _blind(before, current, candidate, count_known=call.count is not None)
        if blind is not None:
            return blind
    was = Outcome.of(decide(before, world), tool.category)
    if was.verdict == REFUSED:  # refused before the policy under both (roles and targets are today's)
        return f"refused before the policy by today's roles and targets ({was.rule})"
    return was, Outcome.of(decide(replace(before, rules=candidate), world), tool.category)


def _unreplayable(call: Call, world: World) -> str | None:
    if not call.target:
        return "the row names no single target (a fan-out refused as a whole, or no target)"
    if call.target not in world.targets:
        return f"target '{call.target}' is not in targets.yaml now"
    if call.role not in world.roles:
        return f"role '{call.role}' is not defined now (roles.yaml)"
    return None


def _blind(facts: Facts, current: Policy, candidate: Policy, *, count_known: bool) -> str | None:
    """Why a change whose row records no objects cannot be replayed, or None."""
    seen = call_facts(facts)
    for name, policy in (("rules in force", current), ("candidate", candidate)):
        spot = object_blind_spot(seen, policy, count_known=count_known)
        if spot is not None:
            return f"its row records no affected objects, and {spot} ({name}) looks at them"
    if not count_known:
        target = facts.target or ""
        if (current.target_settings(target).max_bulk_objects
                != candidate.target_settings(target).max_bulk_objects):
            return "its row records no object count, and the bulk limit (max_bulk_objects) changes"
    return None
