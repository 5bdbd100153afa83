"""Policy: what ``rules.yaml`` allows, decided by a pure function of the call, the file and the clock.

Sections of the file, all optional (``rules.example.yaml`` shows each one):

- ``defaults``: allow / deny / require_approval per category (read, write, destructive), flags
  (require_web_approval, auto_snapshot_before_destroy, dry_run) and limits (max_bulk_objects,
  max_calls_per_minute per caller and category, target_max_calls_per_minute for all callers together)
  for every target. Whatever it leaves out keeps the built-in
  strict value: destructive calls denied, reads and writes allowed, no web approval, safety snapshots
  on, no dry run, 20 objects per bulk call, 30 writes and 10 destructive calls per minute per caller
  on each target.
- ``protected``: objects that destructive calls may never touch.
- ``rules``: ordered; the first rule whose ``match`` fits a call decides it.
- ``targets``: settings for one target (exact name) or several (glob), layered over ``defaults``.
- ``maintenance_windows``: when calls of the listed risk levels may run.

How ``evaluate`` decides, in this order:

1. protected: a destructive call affecting a protected object is denied; so is a write call whose
   risk reaches the entry's ``min_risk_level`` when one is set. ``override=true`` does not apply.
2. bulk limit: a write or destructive call affecting more objects than the target's
   ``max_bulk_objects`` is denied.
3. rules: the first rule whose ``match`` fits decides (deny, allow or require_approval). A deny rule
   with ``unless_override: true`` is skipped when the request carries ``override=true``, and the
   evaluation goes on with the next rules and then step 4: an override removes that rule's
   objection but never grants more than the rest of the policy does. The decision names it.
4. per-target settings over defaults: the action for the call's category on its target.
5. maintenance windows, on top of any allow: when windows are declared for the call's target and
   risk level, the call must fall inside one of them, otherwise it is denied naming the next opening.

An allowed destructive call on a target with ``require_web_approval`` needs a human's approval, as
does any call allowed through a ``require_approval`` action (for a plain write, the pipeline turns it
into a proposal that a human approves).

Matching: every pattern is a glob (``*``, ``?``, ``[...]``) compared case-insensitively. Fields of a
``match`` are ANDed, the items of one field ORed, absent fields match anything. ``tools`` holds
category names (read, write, destructive) or tool names. ``vm_patterns`` (names of affected VMs),
``folders``, ``resource_pools`` and ``names`` (names or moids of affected objects of any type) look
at the affected objects: for deny and require_approval rules one matching object is enough, so a
bulk call touching one matching VM is caught; for allow rules every relevant object must match, so
an allow never reaches a VM it does not name. On reads the objects are those the read would show:
each is decided as if it were the call's one affected object (``gateway.guard.read_filter``), and a
denied one is withheld from a listing, or refuses a read about it.

Effective settings of a target: built-in values, then ``defaults``, then every glob entry under
``targets`` matching the name (in file order), then the entry naming it exactly. Each layer replaces
only the keys it sets (``max_calls_per_minute`` per category).

Reading the file (every section required, the last good rules kept on a bad reload) is
``gateway.guard.policy_store``; this module only parses and decides.
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, time, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gateway.config import ConfigProblems, NameKind, NameRef, Target, load_yaml, located, position
from gateway.guard.limits import bulk_denial
from gateway.vocabulary import AffectedObject, Category, Risk

log = logging.getLogger(__name__)


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

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["overridden"] = list(self.overridden)
        return out


# --------------------------------------------------------------------------- matching


def _glob(value: str, patterns: Sequence[str]) -> bool:
    folded = value.casefold()
    return any(fnmatch.fnmatchcase(folded, p.casefold()) for p in patterns)


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _is_vm(obj: AffectedObject) -> bool:
    return obj.type.casefold() in ("vm", "virtualmachine")


_CATEGORY_NAMES = tuple(c.value for c in Category)


def _tool_fits(facts: CallFacts, items: Sequence[str]) -> bool:
    return any(item == facts.category.value if item in _CATEGORY_NAMES else _glob(facts.tool, (item,))
               for item in items)


#: match fields answered by the call itself
_CALL_FIELDS: Mapping[str, Callable[[CallFacts, Sequence[str]], bool]] = {
    "targets": lambda f, p: _glob(f.target, p),
    "target_tags": lambda f, p: any(_glob(tag, p) for tag in f.target_tags),
    "tools": _tool_fits,
    "callers": lambda f, p: _glob(f.caller, p),
    "roles": lambda f, p: _glob(f.role, p),
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
_MATCH_FIELDS = (*_CALL_FIELDS, *_OBJECT_FIELDS)


def _objects_fit(affected: Sequence[AffectedObject], spec: _ObjectField, patterns: Sequence[str],
                 every: bool) -> bool:
    relevant, values_of = spec
    hits = [any(v is not None and _glob(v, patterns) for v in values_of(o)) for o in affected if relevant(o)]
    return (bool(hits) and all(hits)) if every else any(hits)


@dataclass(frozen=True)
class Match:
    """The ``match`` of a rule: ``fields`` maps a field name to its patterns."""

    fields: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    min_risk_level: Risk | None = None

    def fits(self, facts: CallFacts, *, every_object: bool) -> bool:
        if not self.fits_call(facts):
            return False
        return all(_objects_fit(facts.affected, _OBJECT_FIELDS[name], patterns, every_object)
                   for name, patterns in self.fields.items() if name in _OBJECT_FIELDS)

    def fits_call(self, facts: CallFacts) -> bool:
        """Whether the fields answered by the call itself (not its objects) fit ``facts``."""
        if self.min_risk_level is not None and facts.risk.rank < self.min_risk_level.rank:
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
        return out


@dataclass(frozen=True)
class Rule:
    name: str
    action: Action
    match: Match = field(default_factory=Match)
    unless_override: bool = False
    reason: str | None = None
    #: ``file:line:column`` of the rule (for problems found after parsing)
    where: str = field(default="", compare=False)

    def matches(self, facts: CallFacts) -> bool:
        return self.match.fits(facts, every_object=self.action is Action.ALLOW)

    def may_apply_to(self, target: Target) -> bool:
        """Whether the rule's target fields admit ``target`` (for ``describe``)."""
        names, tags = self.match.fields.get("targets"), self.match.fields.get("target_tags")
        return ((names is None or _glob(target.name, names))
                and (tags is None or any(_glob(t, tags) for t in target.tags)))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "action": self.action.value, "match": self.match.to_dict(),
                "unless_override": self.unless_override, "reason": self.reason}


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
        if self.targets and not _glob(facts.target, self.targets):
            return False
        if facts.category is Category.DESTRUCTIVE:
            return True
        return (facts.category is Category.WRITE and self.min_risk_level is not None
                and facts.risk.rank >= self.min_risk_level.rank)

    def protects(self, obj: AffectedObject) -> bool:
        if self.vm_patterns and _is_vm(obj) and _glob(obj.name, self.vm_patterns):
            return True
        return (bool(self.names) and (not self.types or _glob(obj.type, self.types))
                and (_glob(obj.name, self.names) or _glob(obj.moid, self.names)))

    def to_dict(self) -> dict[str, Any]:
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        out["min_risk_level"] = self.min_risk_level.value if self.min_risk_level else None
        return out


DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_ALL_DAYS = frozenset(range(7))


@dataclass(frozen=True)
class MaintenanceWindow:
    """Weekly window in which calls of ``risk_levels`` may run. ``end <= start`` wraps past midnight."""

    name: str
    start: time
    end: time
    timezone: str = "UTC"
    days: frozenset[int] = _ALL_DAYS
    risk_levels: frozenset[Risk] = frozenset({Risk.HIGH, Risk.CRITICAL})
    targets: tuple[str, ...] = ()

    def applies(self, target: str, risk: Risk) -> bool:
        return risk in self.risk_levels and (not self.targets or _glob(target, self.targets))

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
        days = "every day" if self.days == _ALL_DAYS else ",".join(DAYS[d] for d in sorted(self.days))
        return f"{days} {self.start:%H:%M}-{self.end:%H:%M} {self.timezone}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "days": [DAYS[d] for d in sorted(self.days)],
                "start": f"{self.start:%H:%M}", "end": f"{self.end:%H:%M}", "timezone": self.timezone,
                "risk_levels": sorted((r.value for r in self.risk_levels), key=lambda v: Risk(v).rank),
                "targets": list(self.targets), "schedule": self.describe()}


# --------------------------------------------------------------------------- per-target settings

_FLAGS = ("require_web_approval", "auto_snapshot_before_destroy", "dry_run")
_RATE = "max_calls_per_minute"
#: the target-wide ceiling every caller's calls count against together
_CEILING = "target_max_calls_per_minute"

#: the strict values every key falls back to, flat: "<category>", flags, "max_calls_per_minute.<category>"
BUILTIN_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "read": Action.ALLOW, "write": Action.ALLOW, "destructive": Action.DENY,
    "require_web_approval": False, "auto_snapshot_before_destroy": True, "dry_run": False,
    "max_bulk_objects": 20,
    f"{_RATE}.read": None, f"{_RATE}.write": 30, f"{_RATE}.destructive": 10,
    f"{_CEILING}.read": None, f"{_CEILING}.write": None, f"{_CEILING}.destructive": None,
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
    #: per category, the calls per minute of every caller together (None: no ceiling)
    target_max_calls_per_minute: Mapping[str, int | None] = field(
        default_factory=lambda: MappingProxyType(dict.fromkeys(Category)))

    @classmethod
    def build(cls, target: str, values: Mapping[str, Any], origins: Mapping[str, str]) -> TargetPolicy:
        return cls(
            target=target,
            categories=MappingProxyType({c: Action(values[c.value]) for c in Category}),
            require_web_approval=bool(values["require_web_approval"]),
            auto_snapshot_before_destroy=bool(values["auto_snapshot_before_destroy"]),
            dry_run=bool(values["dry_run"]),
            max_bulk_objects=values["max_bulk_objects"],
            max_calls_per_minute=MappingProxyType({c: values[f"{_RATE}.{c.value}"] for c in Category}),
            origins=MappingProxyType(dict(origins)),
            target_max_calls_per_minute=MappingProxyType(
                {c: values.get(f"{_CEILING}.{c.value}") for c in Category}),
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
            _RATE: {str(c): n for c, n in self.max_calls_per_minute.items()},
            _CEILING: {str(c): n for c, n in self.target_max_calls_per_minute.items()},
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
        matching = [o for o in self.targets if _glob(target, (o.pattern,))]
        return sorted(matching, key=lambda o: not _is_glob(o.pattern))


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class _Verdict:
    action: Action
    rule: str
    reason: str
    overridden: tuple[str, ...] = ()


def evaluate(facts: CallFacts, policy: Policy, now: datetime) -> Decision:
    """Decide one call. Pure: the same facts, policy and ``now`` (timezone-aware) give the same answer."""
    if now.utcoffset() is None:
        raise ValueError("evaluate needs a timezone-aware 'now', e.g. datetime.now(UTC)")
    settings = policy.target_settings(facts.target)
    flags = {"dry_run": settings.dry_run, "auto_snapshot": settings.auto_snapshot_before_destroy}
    verdict = _protected(facts, policy) or _bulk(facts, settings) or _first_rule(facts, policy, settings)
    if verdict.action is Action.ALLOW or verdict.action is Action.REQUIRE_APPROVAL:
        verdict = _window(facts, policy, now, verdict.overridden) or verdict
    if verdict.action is Action.DENY:
        return Decision(False, verdict.reason, verdict.rule, overridden=verdict.overridden, **flags)
    web = facts.category is Category.DESTRUCTIVE and settings.require_web_approval
    reason = verdict.reason + (f"; target '{facts.target}' requires a human approval for destructive "
                               "calls (require_web_approval)" if web else "")
    approval = verdict.action is Action.REQUIRE_APPROVAL or web
    return Decision(True, reason, verdict.rule, approval, overridden=verdict.overridden, **flags)


def _protected(facts: CallFacts, policy: Policy) -> _Verdict | None:
    for entry in policy.protected:
        if not entry.covers(facts):
            continue
        for obj in facts.affected:
            if entry.protects(obj):
                why = f": {entry.reason}" if entry.reason else ""
                return _Verdict(Action.DENY, f"protected:{entry.name}",
                                f"{obj.type} '{obj.name}' ({obj.moid}) is protected by '{entry.name}'{why}; "
                                "override does not apply (change 'protected' in rules.yaml to allow it)")
    return None


def _bulk(facts: CallFacts, settings: TargetPolicy) -> _Verdict | None:
    if facts.category is Category.READ:
        return None
    reason = bulk_denial(facts.count, settings.max_bulk_objects, facts.target)
    return None if reason is None else _Verdict(Action.DENY, settings.origins["max_bulk_objects"], reason)


def _first_rule(facts: CallFacts, policy: Policy, settings: TargetPolicy) -> _Verdict:
    overridden: list[str] = []
    for rule in policy.rules:
        if not rule.matches(facts):
            continue
        if rule.action is Action.DENY and rule.unless_override and facts.override:
            overridden.append(rule.name)
            continue
        return _rule_verdict(rule, tuple(overridden))
    return _category_verdict(facts, settings, tuple(overridden))


def _rule_verdict(rule: Rule, overridden: tuple[str, ...]) -> _Verdict:
    why = f": {rule.reason}" if rule.reason else ""
    reasons = {
        Action.DENY: f"denied by rule '{rule.name}'{why}"
                     + ("; override=true skips this rule (the rest of the policy still applies)"
                        if rule.unless_override else ""),
        Action.ALLOW: f"allowed by rule '{rule.name}'{why}",
        Action.REQUIRE_APPROVAL: f"rule '{rule.name}' requires a human approval{why}",
    }
    return _Verdict(rule.action, f"rule:{rule.name}", reasons[rule.action] + _override_note(overridden),
                    overridden)


def _category_verdict(facts: CallFacts, settings: TargetPolicy, overridden: tuple[str, ...]) -> _Verdict:
    category, target = facts.category.value, facts.target
    action = settings.categories[facts.category]
    origin = settings.origins[category]
    reasons = {
        Action.ALLOW: f"{category} calls are allowed on target '{target}' ({origin})",
        Action.DENY: f"{category} calls are denied on target '{target}' ({origin}); to permit them set "
                     f"'{category}: allow' under defaults or targets.{target} in rules.yaml",
        Action.REQUIRE_APPROVAL: f"{category} calls on target '{target}' require a human approval ({origin})",
    }
    return _Verdict(action, origin, reasons[action] + _override_note(overridden), overridden)


def _override_note(overridden: tuple[str, ...]) -> str:
    if not overridden:
        return ""
    return f" (override=true skipped deny rule{'s' if len(overridden) > 1 else ''} " \
           f"{', '.join(repr(n) for n in overridden)})"


def _window(facts: CallFacts, policy: Policy, now: datetime, overridden: tuple[str, ...]) -> _Verdict | None:
    windows = [w for w in policy.maintenance_windows if w.applies(facts.target, facts.risk)]
    if not windows or any(w.is_open(now) for w in windows):
        return None
    opening, window = min(((w.next_opening(now), w) for w in windows), key=lambda pair: pair[0])
    return _Verdict(
        Action.DENY, f"window:{window.name}",
        f"{facts.risk.value}-risk calls on target '{facts.target}' may run only inside a maintenance "
        f"window; the next is '{window.name}' ({window.describe()}), opening "
        f"{opening:%Y-%m-%d %H:%M %Z} (in {_span(opening - now)})",
        overridden,
    )


def _span(delta: timedelta) -> str:
    minutes = max(int(delta.total_seconds() // 60), 0)
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{minutes}m"]
    return " ".join(p for p in parts if p)


# --------------------------------------------------------------------------- strict parsing

_E = TypeVar("_E", bound=StrEnum)
_V = TypeVar("_V")


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()} (YAML reads unquoted yes/no/on/off/true/false as booleans)"
    return f"{type(value).__name__} {value!r}"


class _Reader:
    """Collects every problem in a file, each naming ``file:line:column``, the path inside the file and
    the fix; and every name the file uses for a target, tool, role or tag (``refs``)."""

    def __init__(self, source: str, root: Any = None) -> None:
        self.source = source
        self.problems: list[str] = []
        self.refs: list[NameRef] = []
        #: path inside the file -> where it is (registered as the parsers walk the file)
        self._at: dict[str, str] = {"": located(source, root)}

    def at(self, path: str, container: Any, key: Any) -> None:
        """Remember where ``path`` (``key`` of ``container``) is in the file."""
        if position(container, key) is not None:
            self._at[path] = located(self.source, container, key)

    def where(self, path: str) -> str:
        """``file:line:column`` of ``path``, or of the nearest enclosing entry the file says where."""
        probe = path
        while probe not in self._at:
            cut = max(probe.rfind("."), probe.rfind("["))
            probe = probe[:cut] if cut > 0 else ""
        return self._at[probe]

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{self.where(path)}: {path or '(top level)'}: {message}")

    def ref(self, kind: NameKind, values: Sequence[str], path: str, *, exact: bool = False) -> None:
        """Note that the file names ``values`` (items of the list at ``path``) as ``kind``."""
        for index, value in enumerate(values):
            where = f"{path}[{index}]" if not exact else path
            self.refs.append(NameRef(kind, value, self.where(where), where, glob=True, fold_case=True))

    def mapping(self, value: Any, path: str, allowed: Collection[str],
                required: Sequence[str] = ()) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            self.problem(path, f"must be a mapping of keys to values, got {_kind(value)}")
            return {}
        out: dict[str, Any] = {}
        for key, item in value.items():
            self.at(_child(path, str(key)), value, key)
            if key in allowed:
                out[key] = item
            else:
                self.problem(_child(path, str(key)), f"unknown key{_suggest(str(key), allowed)}; "
                             f"allowed keys: {', '.join(sorted(allowed))}")
        for key in required:
            if key not in value:
                self.problem(path, f"missing required key '{key}'")
        return out

    def optional(self, entry: Mapping[str, Any], key: str, path: str, parse: Callable[[Any, str], _V],
                 default: _V) -> _V:
        """``parse`` the value of ``key`` when ``entry`` has it, else ``default``."""
        return parse(entry[key], _child(path, key)) if key in entry else default

    def entries(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.problem(path, f"must be a list ('- ' items), got {_kind(value)}")
            return []
        for index in range(len(value)):
            self.at(f"{path}[{index}]", value, index)
        return value

    def text(self, value: Any, path: str) -> str:
        if isinstance(value, str) and value.strip():
            return value
        self.problem(path, f"must be a non-empty string, got {_kind(value)}")
        return ""

    def strings(self, value: Any, path: str) -> tuple[str, ...]:
        if (isinstance(value, list) and value
                and all(isinstance(v, str) and v.strip() for v in value)):
            for index in range(len(value)):
                self.at(f"{path}[{index}]", value, index)
            return tuple(value)
        self.problem(path, f'must be a non-empty list of strings, e.g. ["prod-*"], got {_kind(value)}')
        return ()

    def boolean(self, value: Any, path: str) -> bool:
        if isinstance(value, bool):
            return value
        self.problem(path, f"must be true or false, got {_kind(value)}")
        return False

    def limit(self, value: Any, path: str) -> int | None:
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        self.problem(path, f"must be a whole number >= 1, or null for no limit; got {_kind(value)}")
        return None

    def choice(self, value: Any, path: str, kind: type[_E]) -> _E | None:
        names = [m.value for m in kind]
        if isinstance(value, str) and value in names:
            return kind(value)
        hint = _suggest(value, names) if isinstance(value, str) else ""
        self.problem(path, f"must be one of {', '.join(names)}{hint}; got {_kind(value)}")
        return None


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _suggest(word: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


_SETTINGS_KEYS = (*_CATEGORY_NAMES, *_FLAGS, "max_bulk_objects", _RATE, _CEILING)


def _settings(r: _Reader, value: Any, path: str) -> dict[str, Any]:
    """A ``defaults`` or ``targets.<name>`` block as flat keys (see ``BUILTIN_DEFAULTS``)."""
    out: dict[str, Any] = {}
    for key, raw in r.mapping(value, path, _SETTINGS_KEYS).items():
        where = f"{path}.{key}"
        if key in _CATEGORY_NAMES:
            out[key] = r.choice(raw, where, Action) or Action.DENY
        elif key in _FLAGS:
            out[key] = r.boolean(raw, where)
        elif key == "max_bulk_objects":
            out[key] = r.limit(raw, where)
        else:
            for category, limit in r.mapping(raw, where, _CATEGORY_NAMES).items():
                out[f"{key}.{category}"] = r.limit(limit, f"{where}.{category}")
    return out


def _parse_defaults(r: _Reader, value: Any, path: str) -> dict[str, Any]:
    return {} if value is None else _settings(r, value, path)


def _parse_targets(r: _Reader, value: Any, path: str) -> tuple[TargetOverride, ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        r.problem(path, f"must map target names or globs to settings, got {_kind(value)}")
        return ()
    out: list[TargetOverride] = []
    for pattern, block in value.items():
        where = f"{path}.{pattern}"
        r.at(where, value, pattern)
        if not isinstance(pattern, str) or not pattern.strip():
            r.problem(where, "a target name or glob must be a non-empty string (quote it)")
            continue
        r.ref("target", (pattern,), where, exact=True)
        out.append(TargetOverride(pattern, MappingProxyType(_settings(r, block, where))))
    return tuple(out)


_RULE_KEYS = ("name", "match", "action", "unless_override", "reason")


def _parse_rule(r: _Reader, value: Any, path: str) -> Rule | None:
    entry = r.mapping(value, path, _RULE_KEYS, required=("name", "action"))
    if not isinstance(value, Mapping):
        return None
    action = r.optional(entry, "action", path, lambda v, p: r.choice(v, p, Action), None)
    unless = r.optional(entry, "unless_override", path, r.boolean, False)
    if unless and action not in (Action.DENY, None):
        r.problem(f"{path}.unless_override", "applies only to 'action: deny'; remove it or make it a deny")
    rule = Rule(
        name=r.optional(entry, "name", path, r.text, ""),
        action=action or Action.DENY,
        match=r.optional(entry, "match", path, lambda v, p: _parse_match(r, v, p), Match()),
        unless_override=unless,
        reason=r.optional(entry, "reason", path, r.text, None),
        where=r.where(path),
    )
    return rule if action else None


def _parse_match(r: _Reader, value: Any, path: str) -> Match:
    entry = r.mapping(value, path, (*_MATCH_FIELDS, "min_risk_level"))
    fields = {k: r.strings(v, f"{path}.{k}") for k, v in entry.items() if k in _MATCH_FIELDS}
    for key, kind in _MATCH_REFS.items():
        items = fields.get(key, ())
        r.ref(kind, [i for i in items if not (kind == "tool" and i in _CATEGORY_NAMES)], f"{path}.{key}")
    risk = r.optional(entry, "min_risk_level", path, lambda v, p: r.choice(v, p, Risk), None)
    return Match(MappingProxyType(fields), risk)


#: match fields naming things other files define
_MATCH_REFS: Mapping[str, NameKind] = {"targets": "target", "tools": "tool", "roles": "role"}

_PROTECTED_KEYS = ("name", "vm_patterns", "names", "types", "targets", "min_risk_level", "reason")


def _parse_protected(r: _Reader, value: Any, path: str) -> Protected | None:
    entry = r.mapping(value, path, _PROTECTED_KEYS, required=("name",))
    if not entry:
        return None
    if "vm_patterns" not in entry and "names" not in entry:
        r.problem(path, "needs 'vm_patterns' (VM names) or 'names' (names or moids of any object type)")
    empty: tuple[str, ...] = ()
    targets = r.optional(entry, "targets", path, r.strings, empty)
    r.ref("target", targets, f"{path}.targets")
    return Protected(
        name=r.optional(entry, "name", path, r.text, ""),
        vm_patterns=r.optional(entry, "vm_patterns", path, r.strings, empty),
        names=r.optional(entry, "names", path, r.strings, empty),
        types=r.optional(entry, "types", path, r.strings, empty),
        targets=targets,
        min_risk_level=r.optional(entry, "min_risk_level", path, lambda v, p: r.choice(v, p, Risk), None),
        reason=r.optional(entry, "reason", path, r.text, None),
    )


_WINDOW_KEYS = ("name", "days", "start", "end", "timezone", "risk_levels", "targets")
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})$")


def _parse_clock(r: _Reader, value: Any, path: str) -> time:
    if isinstance(value, int) and not isinstance(value, bool):
        # YAML 1.1 reads an unquoted 22:00 as the base-60 number 1320.
        r.problem(path, f'write the time in quotes, e.g. "{value // 60:02d}:{value % 60:02d}" '
                        f"(YAML read the unquoted time as the number {value})")
        return time()
    found = _CLOCK.match(value) if isinstance(value, str) else None
    if found and int(found[1]) < 24 and int(found[2]) < 60:
        return time(int(found[1]), int(found[2]))
    r.problem(path, f'must be a time "HH:MM" between "00:00" and "23:59", got {_kind(value)}')
    return time()


def _parse_zone(r: _Reader, value: Any, path: str) -> str:
    if isinstance(value, str):
        try:
            ZoneInfo(value)
            return value
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass
    r.problem(path, f"unknown time zone {_kind(value)}; use an IANA name such as 'Europe/Berlin' or 'UTC'")
    return "UTC"


def _parse_days(r: _Reader, value: Any, path: str) -> frozenset[int]:
    days: set[int] = set()
    for index, day in enumerate(r.strings(value, path)):
        if day.lower() in DAYS:
            days.add(DAYS.index(day.lower()))
        else:
            r.problem(f"{path}[{index}]", f"unknown day {day!r}{_suggest(day.lower(), DAYS)}; "
                                          f"use {', '.join(DAYS)}")
    return frozenset(days) or _ALL_DAYS


def _parse_window(r: _Reader, value: Any, path: str) -> MaintenanceWindow | None:
    entry = r.mapping(value, path, _WINDOW_KEYS, required=("name", "start", "end"))
    if not entry:
        return None
    empty: tuple[str, ...] = ()
    default_risks: tuple[str, ...] = (Risk.HIGH.value, Risk.CRITICAL.value)
    risks = r.optional(entry, "risk_levels", path, r.strings, default_risks)
    targets = r.optional(entry, "targets", path, r.strings, empty)
    r.ref("target", targets, f"{path}.targets")
    levels = {r.choice(v, f"{path}.risk_levels[{i}]", Risk) for i, v in enumerate(risks)}
    return MaintenanceWindow(
        name=r.optional(entry, "name", path, r.text, ""),
        start=r.optional(entry, "start", path, lambda v, p: _parse_clock(r, v, p), time()),
        end=r.optional(entry, "end", path, lambda v, p: _parse_clock(r, v, p), time()),
        timezone=r.optional(entry, "timezone", path, lambda v, p: _parse_zone(r, v, p), "UTC"),
        days=r.optional(entry, "days", path, lambda v, p: _parse_days(r, v, p), _ALL_DAYS),
        risk_levels=frozenset(level for level in levels if level is not None),
        targets=targets,
    )


_T = TypeVar("_T", Rule, Protected, MaintenanceWindow)


_EntryParser = Callable[[_Reader, Any, str], _T | None]


def _named_list(parse: _EntryParser[_T]) -> Callable[[_Reader, Any, str], tuple[_T, ...]]:
    """A parser for a list section whose entries carry unique names."""

    def parse_list(r: _Reader, value: Any, path: str) -> tuple[_T, ...]:
        items: list[_T] = []
        seen: set[str] = set()
        for index, raw in enumerate(r.entries(value, path)):
            item = parse(r, raw, f"{path}[{index}]")
            if item is None:
                continue
            if item.name in seen:
                r.problem(f"{path}[{index}].name", f"duplicate name '{item.name}'; each entry needs its own "
                                                    "name (decisions and audit rows cite it)")
            seen.add(item.name)
            items.append(item)
        return tuple(items)

    return parse_list


_SECTIONS: Mapping[str, Callable[[_Reader, Any, str], Any]] = {
    "defaults": _parse_defaults,
    "protected": _named_list(_parse_protected),
    "rules": _named_list(_parse_rule),
    "targets": _parse_targets,
    "maintenance_windows": _named_list(_parse_window),
}


def parse_policy(data: Any, source: str) -> Policy:
    """Turn parsed YAML into a ``Policy``; raise ``ConfigProblems`` listing every problem found.

    ``None`` or an empty mapping (an empty file) gives the built-in strict defaults.
    """
    if data is None or data == {}:
        return Policy(source, builtin=True, note=f"{source} is empty: the built-in strict defaults apply")
    r = _Reader(source, data)
    sections = r.mapping(data, "", _SECTIONS)
    parsed = {name: parse(r, sections.get(name), name) for name, parse in _SECTIONS.items()}
    if r.problems:
        raise ConfigProblems(r.problems)
    return Policy(
        source=source,
        defaults=MappingProxyType({**BUILTIN_DEFAULTS, **parsed["defaults"]}),
        protected=parsed["protected"],
        rules=parsed["rules"],
        targets=parsed["targets"],
        maintenance_windows=parsed["maintenance_windows"],
        refs=tuple(r.refs),
    )


def parse_policy_text(text: str, source: str) -> Policy:
    """Parse the YAML text of a rules file (``gateway.config.load_yaml``: duplicate keys are errors,
    positions kept) into a ``Policy``."""
    return parse_policy(load_yaml(text, source), source)
