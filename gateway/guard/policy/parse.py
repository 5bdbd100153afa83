"""Reading a rules file strictly: every problem named with ``file:line:column`` and its fix.

Every section is required, so a file cut short is refused rather than read as fewer rules.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import time
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gateway.config import ConfigProblems, NameKind, NameRef, builtin_name, load_yaml, located, position
from gateway.guard.policy.model import (
    ALL_DAYS,
    APPROVAL_KEYS,
    BUILTIN_DEFAULTS,
    CATEGORY_NAMES,
    CEILING,
    DAYS,
    FLAGS,
    MATCH_FIELDS,
    RATE,
    Action,
    ConfirmBy,
    MaintenanceWindow,
    Match,
    Policy,
    Protected,
    Rule,
    TargetOverride,
)
from gateway.vocabulary import Risk

#: every top-level section of a rules file, with how an empty one is written
SECTIONS: Final[Mapping[str, str]] = {
    "defaults": "{}", "protected": "[]", "rules": "[]", "targets": "{}", "maintenance_windows": "[]",
}


# --------------------------------------------------------------------------- strict parsing

_E = TypeVar("_E", bound=StrEnum)
_V = TypeVar("_V")


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()} (YAML reads unquoted yes/no/on/off/true/false as booleans)"
    return f"{builtin_name(value)} {value!r}"



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


_SETTINGS_KEYS = (*CATEGORY_NAMES, *FLAGS, "max_bulk_objects", RATE, CEILING, "approvals_required",
                  "approver_roles", "confirm_by")


def _settings(r: _Reader, value: Any, path: str) -> dict[str, Any]:
    """A ``defaults`` or ``targets.<name>`` block as flat keys (see ``BUILTIN_DEFAULTS``)."""
    out: dict[str, Any] = {}
    for key, raw in r.mapping(value, path, _SETTINGS_KEYS).items():
        where = f"{path}.{key}"
        if key in CATEGORY_NAMES:
            out[key] = r.choice(raw, where, Action) or Action.DENY
        elif key in FLAGS:
            out[key] = r.boolean(raw, where)
        elif key == "max_bulk_objects":
            out[key] = r.limit(raw, where)
        elif key == "approvals_required":
            out[key] = _approvals(r, raw, where)
        elif key == "approver_roles":
            out[key] = _approver_roles(r, raw, where)
        elif key == "confirm_by":
            out[key] = r.choice(raw, where, ConfirmBy) or ConfirmBy.TOOL
        else:
            for category, limit in r.mapping(raw, where, CATEGORY_NAMES).items():
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


def _approvals(r: _Reader, value: Any, path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 10:
        return value
    r.problem(path, f"must be a whole number of distinct approvers from 1 to 10, got {_kind(value)}")
    return 1


def _approver_roles(r: _Reader, value: Any, path: str) -> tuple[str, ...]:
    roles = r.strings(value, path)
    r.ref("role", roles, path)
    return roles


_RULE_KEYS = ("name", "match", "action", "unless_override", "reason", *APPROVAL_KEYS, "confirm_by")


def _parse_rule(r: _Reader, value: Any, path: str) -> Rule | None:
    entry = r.mapping(value, path, _RULE_KEYS, required=("name", "action"))
    if not isinstance(value, Mapping):
        return None
    action = r.optional(entry, "action", path, lambda v, p: r.choice(v, p, Action), None)
    unless = r.optional(entry, "unless_override", path, r.boolean, False)
    if unless and action not in (Action.DENY, None):
        r.problem(f"{path}.unless_override", "applies only to 'action: deny'; remove it or make it a deny")
    for key in APPROVAL_KEYS:
        if key in entry and action not in (Action.REQUIRE_APPROVAL, None):
            r.problem(f"{path}.{key}", "applies only to 'action: require_approval'; remove it or make the "
                      "rule require an approval")
    rule = Rule(
        name=r.optional(entry, "name", path, r.text, ""),
        action=action or Action.DENY,
        match=r.optional(entry, "match", path, lambda v, p: _parse_match(r, v, p), Match()),
        unless_override=unless,
        reason=r.optional(entry, "reason", path, r.text, None),
        confirm_by=r.optional(entry, "confirm_by", path, lambda v, p: r.choice(v, p, ConfirmBy), None),
        where=r.where(path),
        approvals_required=r.optional(entry, "approvals_required", path, lambda v, p: _approvals(r, v, p),
                                      None),
        approver_roles=r.optional(entry, "approver_roles", path, lambda v, p: _approver_roles(r, v, p),
                                  None),
        reason_required=r.optional(entry, "reason_required", path, r.boolean, None),
    )
    return rule if action else None


def _parse_match(r: _Reader, value: Any, path: str) -> Match:
    entry = r.mapping(value, path, (*MATCH_FIELDS, "min_risk_level", "min_affected_objects"))
    fields = {k: r.strings(v, f"{path}.{k}") for k, v in entry.items() if k in MATCH_FIELDS}
    for key, kind in _MATCH_REFS.items():
        for index, item in enumerate(fields.get(key, ())):  # each name cited at its own index
            if not (kind == "tool" and item in CATEGORY_NAMES):
                r.ref(kind, (item,), f"{path}.{key}[{index}]", exact=True)
    risk = r.optional(entry, "min_risk_level", path, lambda v, p: r.choice(v, p, Risk), None)
    least = r.optional(entry, "min_affected_objects", path, _min_objects(r), None)
    return Match(MappingProxyType(fields), risk, least)


def _min_objects(r: _Reader) -> Callable[[Any, str], int | None]:
    def parse(value: Any, path: str) -> int | None:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        r.problem(path, f"must be a whole number >= 1 (the call affects at least that many objects), got "
                  f"{_kind(value)}")
        return None

    return parse


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
    return frozenset(days) or ALL_DAYS


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
        days=r.optional(entry, "days", path, lambda v, p: _parse_days(r, v, p), ALL_DAYS),
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


def section_problems(data: Any, source: str) -> list[str]:
    """What keeps ``data`` (a whole rules file, from ``load_yaml``) from being a complete file: an
    empty file, a missing section, a section with no value. Pure."""
    if data is None or data == {}:
        return [f"{source}: the file holds no section (was it cut off?); write every section "
                f"({', '.join(SECTIONS)}) as rules.example.yaml does, or remove the file to use the "
                "built-in strict defaults"]
    if not isinstance(data, Mapping):
        return []  # parse_policy says what is wrong with it
    problems = []
    for name, empty in SECTIONS.items():
        if name not in data:
            problems.append(f"{located(source, data)}: (top level): missing section '{name}'; every section "
                            f"must be present (write '{name}: {empty}' for none), so that a file cut short "
                            "is refused instead of read as fewer rules")
        elif data[name] is None:
            problems.append(f"{located(source, data, name)}: {name}: has no value (was the file cut off "
                            f"after '{name}:'?); write '{name}: {empty}' for none")
    return problems


def parse_rules_file(raw: bytes, source: str) -> Policy:
    """The bytes of a rules file as a ``Policy``; ``ConfigProblems`` lists every problem (sections
    included). The one way a file becomes rules, for the server, ``gateway check`` and ``policy show``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigProblems([f"{source}: not UTF-8 text (byte {exc.start}); save it as UTF-8"]) from None
    problems: list[str] = []
    data = load_yaml(text, source, problems)
    problems += section_problems(data, source)
    try:
        policy = parse_policy(data, source)
    except ConfigProblems as exc:
        problems += exc.problems
    if problems:
        raise ConfigProblems(problems)
    return policy
