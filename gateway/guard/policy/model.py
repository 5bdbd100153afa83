"""The policy model: what a parsed ``rules.yaml`` holds and how each entry matches a call.

Whatever the file leaves out keeps the built-in strict value (``rules.example.yaml`` shows each
section). Patterns are case-insensitive globs. A deny or require_approval rule needs one matching
object; an allow rule needs every object to match, so an allow never reaches a VM it does not name.
Target settings layer: built-ins, ``defaults``, matching globs in file order, then the exact name.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, time, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Any
from zoneinfo import ZoneInfo

from gateway.config import NameRef, Target
from gateway.vocabulary import AffectedObject, Category, Risk


class ConfirmBy(StrEnum):
    """Who may confirm a destructive call's proposal: the calling agent with its token (``tool``, the
    default), the person at the MCP client asked in-band (``elicitation``), or either."""

    TOOL = "tool"
    ELICITATION = "elicitation"
    EITHER = "either"


class Action(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    REQUIRE_APPROVAL = "require_approval"


# --------------------------------------------------------------------------- the call and the answer


@dataclass(frozen=True)
class CallFacts:
    """Everything policy may look at about one call on one target."""

    tool: str
    category: Category
    risk: Risk
    target: str
    target_tags: tuple[str, ...]
    affected: tuple[AffectedObject, ...]
    caller: str
    role: str
    override: bool = False
    object_count: int = 0

    @property
    def count(self) -> int:
        """Objects the call changes: the declared count, never fewer than the objects listed."""
        return max(self.object_count, len(self.affected))


@dataclass(frozen=True)
class Decision:
    """The verdict on one call. ``rule`` names what decided it, e.g. ``rule:no-prod-deletes``."""

    allowed: bool
    reason: str
    rule: str | None
    require_approval: bool = False
    dry_run: bool = False
    auto_snapshot: bool = True
    #: deny rules this call skipped with override=true (for the audit trail)
    overridden: tuple[str, ...] = ()
    #: N of M, when ``require_approval``: distinct persons needed, of which roles (empty: any approver),
    #: and whether each must give a reason
    approvals_required: int = 1
    approver_roles: tuple[str, ...] = ()
    reason_required: bool = False
    #: who may confirm its proposal (``ConfirmBy``): the deciding rule's ``confirm_by``, else the target's
    confirm_by: str = "tool"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["overridden"] = list(self.overridden)
        out["approver_roles"] = list(self.approver_roles)
        return out


# --------------------------------------------------------------------------- matching


def glob_fits(value: str, patterns: Sequence[str]) -> bool:
    folded = value.casefold()
    return any(fnmatch.fnmatchcase(folded, p.casefold()) for p in patterns)


def _isglob_fits(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _is_vm(obj: AffectedObject) -> bool:
    return obj.type.casefold() in ("vm", "virtualmachine")


CATEGORY_NAMES = tuple(c.value for c in Category)


def _tool_fits(facts: CallFacts, items: Sequence[str]) -> bool:
    return any(item == facts.category.value if item in CATEGORY_NAMES else glob_fits(facts.tool, (item,))
               for item in items)


#: match fields answered by the call itself
_CALL_FIELDS: Mapping[str, Callable[[CallFacts, Sequence[str]], bool]] = {
    "targets": lambda f, p: glob_fits(f.target, p),
    "target_tags": lambda f, p: any(glob_fits(tag, p) for tag in f.target_tags),
    "tools": _tool_fits,
    "callers": lambda f, p: glob_fits(f.caller, p),
    "roles": lambda f, p: glob_fits(f.role, p),
}

_ObjectField = tuple[Callable[[AffectedObject], bool], Callable[[AffectedObject], tuple[str | None, ...]]]
#: match fields answered by the affected objects: (which objects count, which values of theirs)
_OBJECT_FIELDS: Mapping[str, _ObjectField] = {
    "vm_patterns": (_is_vm, lambda o: (o.name,)),
    "folders": (lambda o: True, lambda o: (o.folder,)),
    "resource_pools": (lambda o: True, lambda o: (o.resource_pool,)),
    "names": (lambda o: True, lambda o: (o.name, o.moid)),
}
#: the match fields answered by the affected objects (on reads: the objects a read shows)
OBJECT_FIELDS = tuple(_OBJECT_FIELDS)
MATCH_FIELDS = (*_CALL_FIELDS, *_OBJECT_FIELDS)


def _objects_fit(affected: Sequence[AffectedObject], spec: _ObjectField, patterns: Sequence[str],
                 every: bool) -> bool:
    relevant, values_of = spec
    hits = [any(v is not None and glob_fits(v, patterns) for v in values_of(o))
            for o in affected if relevant(o)]
    return (bool(hits) and all(hits)) if every else any(hits)


@dataclass(frozen=True)
class Match:
    """The ``match`` of a rule: ``fields`` maps a field name to its patterns."""

    fields: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    min_risk_level: Risk | None = None
    #: the call affects at least this many objects (a bulk call's count; one for a single VM)
    min_affected_objects: int | None = None

    def fits(self, facts: CallFacts, *, every_object: bool) -> bool:
        if not self.fits_call(facts):
            return False
        return all(_objects_fit(facts.affected, _OBJECT_FIELDS[name], patterns, every_object)
                   for name, patterns in self.fields.items() if name in _OBJECT_FIELDS)

    def fits_call(self, facts: CallFacts) -> bool:
        """Whether the fields answered by the call itself (not its objects) fit ``facts``."""
        if self.min_risk_level is not None and facts.risk.rank < self.min_risk_level.rank:
            return False
        if self.min_affected_objects is not None and facts.count < self.min_affected_objects:
            return False
        return all(_CALL_FIELDS[name](facts, patterns)
                   for name, patterns in self.fields.items() if name in _CALL_FIELDS)

    @property
    def object_fields(self) -> tuple[str, ...]:
        """The fields this match answers from the affected objects."""
        return tuple(name for name in self.fields if name in _OBJECT_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: list(patterns) for name, patterns in self.fields.items()}
        if self.min_risk_level is not None:
            out["min_risk_level"] = self.min_risk_level.value
        if self.min_affected_objects is not None:
            out["min_affected_objects"] = self.min_affected_objects
        return out


@dataclass(frozen=True)
class Rule:
    name: str
    action: Action
    match: Match = field(default_factory=Match)
    unless_override: bool = False
    reason: str | None = None
    #: who may confirm the proposals this rule lets through (None: the target's ``confirm_by``)
    confirm_by: ConfirmBy | None = None
    #: ``file:line:column`` of the rule (for problems found after parsing)
    where: str = field(default="", compare=False)
    #: N of M on a ``require_approval`` rule (None: the target's settings say)
    approvals_required: int | None = None
    approver_roles: tuple[str, ...] | None = None
    reason_required: bool | None = None

    def matches(self, facts: CallFacts) -> bool:
        return self.match.fits(facts, every_object=self.action is Action.ALLOW)

    def may_apply_to(self, target: Target) -> bool:
        """Whether the rule's target fields admit ``target`` (for ``describe``)."""
        names, tags = self.match.fields.get("targets"), self.match.fields.get("target_tags")
        return ((names is None or glob_fits(target.name, names))
                and (tags is None or any(glob_fits(t, tags) for t in target.tags)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "action": self.action.value, "match": self.match.to_dict(),
               "unless_override": self.unless_override, "reason": self.reason}
        for key in APPROVAL_KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple) else value
        if self.confirm_by is not None:
            out["confirm_by"] = self.confirm_by.value
        return out


@dataclass(frozen=True)
class Protected:
    """Objects no destructive call may affect. ``names`` match names or moids of any type in ``types``."""

    name: str
    vm_patterns: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    min_risk_level: Risk | None = None
    reason: str | None = None

    def covers(self, facts: CallFacts) -> bool:
        if self.targets and not glob_fits(facts.target, self.targets):
            return False
        if facts.category is Category.DESTRUCTIVE:
            return True
        return (facts.category is Category.WRITE and self.min_risk_level is not None
                and facts.risk.rank >= self.min_risk_level.rank)

    def protects(self, obj: AffectedObject) -> bool:
        if self.vm_patterns and _is_vm(obj) and glob_fits(obj.name, self.vm_patterns):
            return True
        return (bool(self.names) and (not self.types or glob_fits(obj.type, self.types))
                and (glob_fits(obj.name, self.names) or glob_fits(obj.moid, self.names)))

    def to_dict(self) -> dict[str, Any]:
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        out["min_risk_level"] = self.min_risk_level.value if self.min_risk_level else None
        return out


DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
ALL_DAYS = frozenset(range(7))


@dataclass(frozen=True)
class MaintenanceWindow:
    """Weekly window in which calls of ``risk_levels`` may run. ``end <= start`` wraps past midnight."""

    name: str
    start: time
    end: time
    timezone: str = "UTC"
    days: frozenset[int] = ALL_DAYS
    risk_levels: frozenset[Risk] = frozenset({Risk.HIGH, Risk.CRITICAL})
    targets: tuple[str, ...] = ()

    def applies(self, target: str, risk: Risk) -> bool:
        return risk in self.risk_levels and (not self.targets or glob_fits(target, self.targets))

    def is_open(self, now: datetime) -> bool:
        local = now.astimezone(ZoneInfo(self.timezone))
        clock, day = local.time(), local.weekday()
        if self.start < self.end:
            return day in self.days and self.start <= clock < self.end
        # Wrapping (or 24 h when start == end): open from start on a listed day until end the next day.
        return (day in self.days and clock >= self.start) or ((day - 1) % 7 in self.days and clock < self.end)

    def next_opening(self, now: datetime) -> datetime:
        zone = ZoneInfo(self.timezone)
        today = now.astimezone(zone).date()
        for offset in range(8):
            day = today + timedelta(days=offset)
            opening = datetime.combine(day, self.start, tzinfo=zone)
            if day.weekday() in self.days and opening > now:
                return opening
        raise AssertionError("a window with at least one day opens within 8 days")

    def describe(self) -> str:
        days = "every day" if self.days == ALL_DAYS else ",".join(DAYS[d] for d in sorted(self.days))
        return f"{days} {self.start:%H:%M}-{self.end:%H:%M} {self.timezone}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "days": [DAYS[d] for d in sorted(self.days)],
                "start": f"{self.start:%H:%M}", "end": f"{self.end:%H:%M}", "timezone": self.timezone,
                "risk_levels": sorted((r.value for r in self.risk_levels), key=lambda v: Risk(v).rank),
                "targets": list(self.targets), "schedule": self.describe()}


# --------------------------------------------------------------------------- per-target settings

FLAGS = ("require_web_approval", "auto_snapshot_before_destroy", "dry_run", "reason_required")
#: N of M keys, on a target's settings and on a ``require_approval`` rule
APPROVAL_KEYS = ("approvals_required", "approver_roles", "reason_required")
RATE = "max_calls_per_minute"
#: the target-wide ceiling every caller's calls count against together
CEILING = "target_max_calls_per_minute"

#: the strict values every key falls back to, flat: "<category>", flags, "max_calls_per_minute.<category>"
BUILTIN_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "read": Action.ALLOW, "write": Action.ALLOW, "destructive": Action.DENY,
    "require_web_approval": False, "auto_snapshot_before_destroy": True, "dry_run": False,
    "max_bulk_objects": 20, "confirm_by": ConfirmBy.TOOL,
    "approvals_required": 1, "approver_roles": (), "reason_required": False,
    f"{RATE}.read": None, f"{RATE}.write": 30, f"{RATE}.destructive": 10,
    f"{CEILING}.read": None, f"{CEILING}.write": None, f"{CEILING}.destructive": None,
})


@dataclass(frozen=True)
class TargetOverride:
    """One entry under ``targets``: a name or glob and the flat settings it sets."""

    pattern: str
    values: Mapping[str, Any]

    @property
    def label(self) -> str:
        return f"targets:{self.pattern}"


@dataclass(frozen=True)
class TargetPolicy:
    """Effective settings for one target; ``origins`` says which layer set each flat key."""

    target: str
    categories: Mapping[Category, Action]
    require_web_approval: bool
    auto_snapshot_before_destroy: bool
    dry_run: bool
    max_bulk_objects: int | None
    #: keyed by category; Category is a str, so "write" and Category.WRITE find the same entry
    max_calls_per_minute: Mapping[str, int | None]
    origins: Mapping[str, str]
    #: who may confirm a proposal on this target (``ConfirmBy``)
    confirm_by: ConfirmBy = ConfirmBy.TOOL
    #: per category, the calls per minute of every caller together (None: no ceiling)
    target_max_calls_per_minute: Mapping[str, int | None] = field(
        default_factory=lambda: MappingProxyType(dict.fromkeys(Category)))
    #: N of M for a human approval on this target
    approvals_required: int = 1
    approver_roles: tuple[str, ...] = ()
    reason_required: bool = False

    @classmethod
    def build(cls, target: str, values: Mapping[str, Any], origins: Mapping[str, str]) -> TargetPolicy:
        return cls(
            target=target,
            categories=MappingProxyType({c: Action(values[c.value]) for c in Category}),
            require_web_approval=bool(values["require_web_approval"]),
            auto_snapshot_before_destroy=bool(values["auto_snapshot_before_destroy"]),
            dry_run=bool(values["dry_run"]),
            max_bulk_objects=values["max_bulk_objects"],
            max_calls_per_minute=MappingProxyType({c: values[f"{RATE}.{c.value}"] for c in Category}),
            origins=MappingProxyType(dict(origins)),
            confirm_by=ConfirmBy(values.get("confirm_by", ConfirmBy.TOOL)),
            target_max_calls_per_minute=MappingProxyType(
                {c: values.get(f"{CEILING}.{c.value}") for c in Category}),
            approvals_required=int(values.get("approvals_required") or 1),
            approver_roles=tuple(values.get("approver_roles") or ()),
            reason_required=bool(values.get("reason_required", False)),
        )

    def rate_limit(self, category: Category) -> int | None:
        """Calls per minute one caller may make for ``category`` on this target (None: unlimited)."""
        return self.max_calls_per_minute[category]

    def target_rate_limit(self, category: Category) -> int | None:
        """Calls per minute of every caller together for ``category`` on this target (None: no ceiling)."""
        return self.target_max_calls_per_minute[category]

    def to_dict(self) -> dict[str, Any]:
        return {
            **{c.value: a.value for c, a in self.categories.items()},
            "require_web_approval": self.require_web_approval,
            "auto_snapshot_before_destroy": self.auto_snapshot_before_destroy,
            "dry_run": self.dry_run,
            "max_bulk_objects": self.max_bulk_objects,
            "confirm_by": self.confirm_by.value,
            "approvals_required": self.approvals_required,
            "approver_roles": list(self.approver_roles),
            "reason_required": self.reason_required,
            RATE: {str(c): n for c, n in self.max_calls_per_minute.items()},
            CEILING: {str(c): n for c, n in self.target_max_calls_per_minute.items()},
            "set_by": dict(self.origins),
        }


@dataclass(frozen=True)
class Policy:
    """One parsed rules file. ``builtin`` is true when the file is missing or empty."""

    source: str
    defaults: Mapping[str, Any] = field(default_factory=lambda: BUILTIN_DEFAULTS)
    protected: tuple[Protected, ...] = ()
    rules: tuple[Rule, ...] = ()
    targets: tuple[TargetOverride, ...] = ()
    maintenance_windows: tuple[MaintenanceWindow, ...] = ()
    builtin: bool = False
    note: str = ""
    #: every target, tool, role and tag name the file uses, with where (``gateway.guard.names``)
    refs: tuple[NameRef, ...] = ()

    def target_settings(self, target: str) -> TargetPolicy:
        """The effective settings for ``target`` (see the module doc for the layering)."""
        values = dict(self.defaults)
        origins = dict.fromkeys(values, "defaults")
        for layer in self._layers(target):
            values.update(layer.values)
            origins.update(dict.fromkeys(layer.values, layer.label))
        return TargetPolicy.build(target, values, origins)

    def default_settings(self) -> TargetPolicy:
        """The settings of a target no entry under ``targets`` names."""
        return TargetPolicy.build("", self.defaults, dict.fromkeys(self.defaults, "defaults"))

    def _layers(self, target: str) -> list[TargetOverride]:
        matching = [o for o in self.targets if glob_fits(target, (o.pattern,))]
        return sorted(matching, key=lambda o: not _isglob_fits(o.pattern))
