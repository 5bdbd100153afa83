"""The rules file in force: ``PolicyStore`` reads it on every call and re-parses it when its bytes change.

A rules file can lose a gate without being "wrong": cut at a section boundary (a full disk, an editor
killed mid-save, a bad copy) it still parses, with fewer protections. So:

- **Every top-level section is required** (``gateway.guard.policy.parse.SECTIONS``), each with a
  value: ``[]`` or ``{}`` for none. A missing section, one cut right after its ``key:``, or a file
  holding no section at all is refused with the section named. (A missing *file* still means the
  built-in strict defaults.)
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.config import ConfigProblems
from gateway.guard.policy.model import Policy, TargetPolicy
from gateway.guard.policy.parse import parse_rules_file

log = logging.getLogger(__name__)


class PolicyUnavailable(ConfigProblems):
    """The rules file exists but cannot be used (the problems name each fix)."""


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

    @property
    def last_good(self) -> Policy | None:
        """The last good rules loaded (None: none yet), whatever the file holds now."""
        return self._good

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


