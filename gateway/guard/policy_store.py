"""The rules file in force: ``PolicyStore`` reads it on every call and re-parses it when its bytes change.

A rules file can lose a gate without being "wrong": cut at a section boundary (a full disk, an editor
killed mid-save, a bad copy) it still parses, with fewer protections. So:

- **Every top-level section is required** (``SECTIONS``), each with a value: ``[]`` or ``{}`` for
  none. A missing section, one cut right after its ``key:``, or a file holding no section at all is
  refused with the section named. (A missing *file* still means the built-in strict defaults.)
- **A bad reload keeps the last good rules**: a file that cannot be used after a good one was loaded
  leaves the good one in force (reads stay filtered, gates stay), and the refusal is reported (a
  WARNING, ``on_reload`` for the audit, ``gateway policy show``, ``gateway check``).
- **Nothing good yet fails closed**: while no usable rules were ever loaded (a broken file at start),
  every call the policy decides is refused, reads included.

``on_reload(RulesLoad)`` is called once for every new content of the file (the first load included):
the server audits each, loaded or refused.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway.config import ConfigProblems, Target, load_yaml, located
from gateway.errors import ConfigError
from gateway.guard.names import KnownNames, UnknownName, unknown_names
from gateway.guard.policy import Policy, TargetPolicy, _glob, parse_policy
from gateway.guard.read_filter import unreachable_rules

log = logging.getLogger(__name__)

#: every top-level section of a rules file, with how an empty one is written
SECTIONS: Final[Mapping[str, str]] = {
    "defaults": "{}", "protected": "[]", "rules": "[]", "targets": "{}", "maintenance_windows": "[]",
}


class PolicyUnavailable(ConfigProblems):
    """The rules file exists but cannot be used (the problems name each fix)."""


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
    data = load_yaml(text, source)
    problems = section_problems(data, source)
    try:
        policy = parse_policy(data, source)
    except ConfigProblems as exc:
        problems += exc.problems
    if problems:
        raise ConfigProblems(problems)
    return policy


@dataclass(frozen=True)
class RulesLoad:
    """One new content of the rules file: its sha256 (None: no file), the rules it gave or its problems,
    and the rules in force before it (None at the first load)."""

    path: Path
    sha256: str | None
    policy: Policy | None
    problems: tuple[str, ...] = ()
    previous: Policy | None = None
    first: bool = False


class PolicyStore:
    """The policy behind one rules file, re-read on every call (see the module doc). Thread-safe.

    The file is small, so every look reads its bytes and re-parses only when they differ from the last
    read: a rewrite is noticed even when it keeps the size and the modification time.
    """

    def __init__(self, path: Path, on_load: Callable[[Policy], None] | None = None,
                 on_reload: Callable[[RulesLoad], None] | None = None) -> None:
        self.path = Path(path)
        #: called with every newly parsed valid policy (the server logs names that match nothing)
        self.on_load = on_load
        #: called with every new content of the file, loaded or refused (the server audits it)
        self.on_reload = on_reload
        self._lock = threading.Lock()
        #: the bytes last read, or the problems of a file that could not be read
        self._seen: tuple[bytes | None, tuple[str, ...] | None] = (None, None)
        self._latest: Policy | ConfigProblems | None = None
        self._good: Policy | None = None

    def current(self) -> Policy:
        """The file as it is now; raise ``PolicyUnavailable`` while it cannot be used."""
        latest, _good = self._refresh()
        if isinstance(latest, ConfigProblems):
            raise PolicyUnavailable(latest.problems)
        return latest

    def snapshot(self) -> tuple[Policy | None, str | None]:
        """The rules in force and None (the last good ones while the file is broken), or None and why
        no rules can be used (for ``guard.decision.authorize``, which then refuses). Never raises."""
        try:
            latest, good = self._refresh()
        except Exception:
            log.exception("reading the policy file %s failed", self.path)
            return None, f"policy file {self.path} could not be read (see the gateway log)"
        if good is not None:
            return good, None
        assert isinstance(latest, ConfigProblems)
        return None, f"policy file {self.path} is unusable: {PolicyUnavailable(latest.problems).message}"

    def target_limits(self, target: str) -> TargetPolicy:
        """The effective settings (limits, flags) for ``target`` under the rules in force; the built-in
        strict values while none can be used (every call is refused meanwhile). Never raises."""
        policy, _why = self.snapshot()
        return (policy or Policy(str(self.path))).target_settings(target)

    def describe(self, targets: Sequence[Target], known: KnownNames | None = None) -> dict[str, Any]:
        """The effective policy per target, or why the file cannot be used (for ``gateway policy show``).
        With ``known``, entries naming a target, tool, role or tag that matches nothing are marked."""
        try:
            policy = self.current()
        except ConfigError as exc:
            problems = exc.details.get("problems") or [exc.message]
            good = self._good
            effect = ("the last good rules loaded stay in force until it is fixed" if good is not None else
                      "every call the policy decides is denied until it is fixed (no good rules loaded)")
            return {"file": str(self.path), "status": "error", "errors": problems, "effect": effect}
        unknown = unknown_names(policy.refs, known) if known is not None else []
        shown = _describe(policy, self.path, targets, unknown)
        unreachable = unreachable_rules(policy, known.tools) if known is not None else []
        for index, rule in enumerate(shown["rules"]):
            found = [p for p in unreachable if f": rules[{index}]." in p]
            if found:
                rule["warnings"] = [*rule.get("warnings", []), *found]
        if unreachable:
            shown["warnings"] = [*shown.get("warnings", []), *unreachable]
        return shown

    def _refresh(self) -> tuple[Policy | ConfigProblems, Policy | None]:
        """Read the file; parse it when its bytes changed. Returns the latest parse and the rules in force."""
        raw, unreadable = self._read()
        seen = (raw, tuple(unreadable.problems) if unreadable is not None else None)
        load: RulesLoad | None = None
        with self._lock:
            if self._latest is None or seen != self._seen:
                latest = unreadable or self._parse(raw)
                load = self._loaded(raw, latest)
                self._latest, self._seen = latest, seen
            latest, good = self._latest, self._good
        if load is not None and self.on_reload is not None:
            self.on_reload(load)
        return latest, good

    def _loaded(self, raw: bytes | None, latest: Policy | ConfigProblems) -> RulesLoad:
        """Take ``latest`` in force if good (called with the lock); the record of this load."""
        previous, first = self._good, self._latest is None
        sha = None if raw is None else hashlib.sha256(raw).hexdigest()
        if isinstance(latest, ConfigProblems):
            kept = "the last good rules stay in force" if previous is not None else \
                "no good rules were loaded: every call the policy decides is refused"
            log.warning("policy file %s is unusable (%s until it is fixed): %s", self.path, kept, latest)
            return RulesLoad(self.path, sha, None, tuple(latest.problems), previous, first)
        self._good = latest
        log.info("policy loaded from %s: %d rules, %d protected, %d target entries, %d windows",
                 self.path, len(latest.rules), len(latest.protected), len(latest.targets),
                 len(latest.maintenance_windows))
        if self.on_load is not None:
            self.on_load(latest)
        return RulesLoad(self.path, sha, latest, (), previous, first)

    def _read(self) -> tuple[bytes | None, ConfigProblems | None]:
        try:
            return self.path.read_bytes(), None
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, ConfigProblems([
                f"{self.path}: cannot read the rules file ({exc.strerror}); fix its permissions, or point "
                "GATEWAY_RULES_FILE / --rules at a readable file"])

    def _parse(self, raw: bytes | None) -> Policy | ConfigProblems:
        source = str(self.path)
        if raw is None:
            return Policy(source, builtin=True, note=f"no rules file at {source}: the built-in strict "
                                                     "defaults apply")
        try:
            return parse_rules_file(raw, source)
        except ConfigProblems as exc:
            return exc


def _describe(policy: Policy, path: Path, targets: Sequence[Target],
              unknown: Sequence[UnknownName] = ()) -> dict[str, Any]:
    def warnings(prefix: str) -> list[str]:
        return [u.message for u in unknown if u.ref.path == prefix or u.ref.path.startswith(f"{prefix}.")]

    def marked(entry: dict[str, Any], prefix: str) -> dict[str, Any]:
        found = warnings(prefix)
        return {**entry, "warnings": found} if found else entry

    per_target = {}
    for target in targets:
        settings = policy.target_settings(target.name).to_dict()
        settings["tags"] = list(target.tags)
        settings["rules"] = [rule.name for rule in policy.rules if rule.may_apply_to(target)]
        settings["protected"] = [p.name for p in policy.protected
                                 if not p.targets or _glob(target.name, p.targets)]
        settings["maintenance_windows"] = [w.name for w in policy.maintenance_windows
                                           if not w.targets or _glob(target.name, w.targets)]
        per_target[target.name] = settings
    out: dict[str, Any] = {
        "file": str(path),
        "status": "builtin" if policy.builtin else "ok",
        "defaults": policy.default_settings().to_dict(),
        "protected": [marked(p.to_dict(), f"protected[{i}]") for i, p in enumerate(policy.protected)],
        "rules": [marked(r.to_dict(), f"rules[{i}]") for i, r in enumerate(policy.rules)],
        "maintenance_windows": [marked(w.to_dict(), f"maintenance_windows[{i}]")
                                for i, w in enumerate(policy.maintenance_windows)],
        "target_entries": {},
        "targets": per_target,
    }
    for entry in policy.targets:
        names = [t.name for t in targets if _glob(t.name, (entry.pattern,))]
        shown: dict[str, Any] = {"matches": names,
                                 "settings": {k: getattr(v, "value", v) for k, v in entry.values.items()}}
        found = warnings(f"targets.{entry.pattern}")
        if found:
            shown["warning"] = "; ".join(found)
        out["target_entries"][entry.pattern] = shown
    if unknown:
        out["warnings"] = [str(u) for u in unknown]
    if policy.note:
        out["note"] = policy.note
    return out
