"""The rules file in force: ``PolicyStore`` reads it on every call and re-parses it when its bytes change.

A file cut at a section boundary still parses with fewer protections, so every section is required.
A file that cannot be used fails closed: no rules are in force, nothing falls back to the previous
ones, and every call the policy decides is refused until it is fixed (a missing file is the strict defaults).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
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
    the rules in force before it (None at the first load or while the file was broken), and whether
    it ends a broken spell (``recovered``: good content after unusable content)."""

    path: Path
    sha256: str | None
    policy: Policy | None
    problems: tuple[str, ...] = ()
    previous: Policy | None = None
    first: bool = False
    recovered: bool = False


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
        #: the rules before the latest content, for the reload rows' ``changed`` (None while broken)
        self._good: Policy | None = None
        #: (since, message) while the file cannot be used
        self._broken: tuple[float, str] | None = None

    def current(self) -> Policy:
        """The file as it is now; raise ``PolicyUnavailable`` while it cannot be used."""
        latest = self._refresh()
        if isinstance(latest, ConfigProblems):
            raise PolicyUnavailable(latest.problems)
        return latest

    @property
    def broken(self) -> tuple[float, str] | None:
        """While the file cannot be used: since when (epoch seconds: the file's modification time when
        it could be read, else when this store first saw it unusable) and the refusal's message; None
        while its rules are in force. As of the last read (``snapshot`` reads)."""
        return self._broken

    def state(self) -> dict[str, str]:
        """The rules' state as JSON values, for /readyz's detail: ``{"status": "ok"}``, or ``broken`` with
        ``since`` (ISO 8601, UTC) and ``error``. Reads the file first (as a call would)."""
        self.snapshot()
        broken = self._broken
        if broken is None:
            return {"status": "ok", "file": str(self.path)}
        since = datetime.fromtimestamp(broken[0], UTC).isoformat(timespec="seconds")
        return {"status": "broken", "file": str(self.path), "since": since, "error": broken[1]}

    def snapshot(self) -> tuple[Policy | None, str | None]:
        """The rules in force and None, or None and why no rules can be used (for
        ``guard.decision.authorize``, which then refuses). Never raises."""
        try:
            latest = self._refresh()
        except Exception:
            log.exception("reading the policy file %s failed", self.path)
            return None, f"policy file {self.path} could not be read (see the gateway log)"
        if isinstance(latest, ConfigProblems):
            return None, unusable_message(self.path, latest)
        return latest, None


    def target_limits(self, target: str) -> TargetPolicy:
        """The effective settings (limits, flags) for ``target`` under the rules in force; the built-in
        strict values while none can be used (every call is refused meanwhile). Never raises."""
        return self.targets_limits([target])[0]

    def targets_limits(self, targets: Iterable[str]) -> list[TargetPolicy]:
        """``target_limits`` of each of ``targets``, the file read once."""
        policy, _why = self.snapshot()
        rules = policy or Policy(str(self.path))
        return [rules.target_settings(target) for target in targets]

    def _refresh(self) -> Policy | ConfigProblems:
        """Read the file; parse it when its bytes changed. Returns the latest parse."""
        raw, unreadable = self._read()
        seen = (raw, tuple(unreadable.problems) if unreadable is not None else None)
        load: RulesLoad | None = None
        with self._lock:
            if self._latest is None or seen != self._seen:
                latest = unreadable or self._parse(raw)
                load = self._loaded(raw, latest)
                self._latest, self._seen = latest, seen
            latest = self._latest
        if load is not None and self.on_reload is not None:
            self.on_reload(load)
        return latest

    def _loaded(self, raw: bytes | None, latest: Policy | ConfigProblems) -> RulesLoad:
        """Take ``latest`` in force, good or broken (called with the lock); the record of this load."""
        previous, first = self._good, self._latest is None
        sha = None if raw is None else hashlib.sha256(raw).hexdigest()
        if isinstance(latest, ConfigProblems):
            since = self._broken[0] if self._broken is not None else self._modified()
            self._good, self._broken = None, (since, unusable_message(self.path, latest))
            log.warning("policy file %s is unusable (every call the policy decides is refused until it is "
                        "fixed): %s", self.path, latest)
            return RulesLoad(self.path, sha, None, tuple(latest.problems), previous, first)
        recovered = self._broken is not None
        if recovered:
            log.warning("policy file %s is usable again: its rules are in force", self.path)
        self._good, self._broken = latest, None
        log.info("policy loaded from %s: %d rules, %d protected, %d target entries, %d windows",
                 self.path, len(latest.rules), len(latest.protected), len(latest.targets),
                 len(latest.maintenance_windows))
        if self.on_load is not None:
            self.on_load(latest)
        return RulesLoad(self.path, sha, latest, (), previous, first, recovered)

    def _modified(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return time.time()

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




def unusable_message(path: Path, problems: ConfigProblems) -> str:
    """The refusal while ``path`` cannot be used: the file and each problem (line and parse error)."""
    return f"policy file {path} is unusable: {PolicyUnavailable(problems.problems).message}"
