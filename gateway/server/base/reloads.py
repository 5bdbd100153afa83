"""Every load of a configuration file as one audit row, ``phase: config_reload``.

A row names the file, the SHA-256 of the bytes read, and either ``loaded`` with counts and what changed,
or ``refused`` with the problems and what stays in force. A roles.yaml load the audit cannot take does
not apply; a CLI run writes only a load that is news to the audit (``already_audited``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from gateway.audit.readers import AuditReader
from gateway.config import Target
from gateway.errors import ConfigError, GatewayError
from gateway.guard.policy.model import Policy
from gateway.guard.policy.store import RulesLoad
from gateway.identity.service import IdentityService, open_identity
from gateway.settings import Settings

PHASE: Final = "config_reload"
#: at most this many problems are kept in a refusal row (the audit bounds each string on its own)
MAX_PROBLEMS: Final = 20

#: a configuration as sections of named entries, each entry as a fingerprint of its content
Summary = Mapping[str, Mapping[str, str]]
T = TypeVar("T")


def fingerprint(value: Any) -> str:
    """A short digest of a JSON-able entry: equal contents, equal fingerprints."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def rules_summary(policy: Policy | None) -> dict[str, dict[str, str]]:
    """rules.yaml's named entries by section (None: no rules)."""
    if policy is None:
        return {}
    return {
        "rules": {r.name: fingerprint(r.to_dict()) for r in policy.rules},
        "protected": {p.name: fingerprint(p.to_dict()) for p in policy.protected},
        "targets": {t.pattern: fingerprint({k: getattr(v, "value", v) for k, v in t.values.items()})
                    for t in policy.targets},
        "maintenance_windows": {w.name: fingerprint(w.to_dict()) for w in policy.maintenance_windows},
        "defaults": {k: fingerprint(getattr(v, "value", v)) for k, v in policy.defaults.items()},
    }


def names_summary(section: str, names: Iterable[str]) -> dict[str, dict[str, str]]:
    """A file known only by the names it defines (roles.yaml through ``RoleBook``)."""
    return {section: dict.fromkeys(sorted(names), "")}


def targets_summary(targets: Sequence[Target]) -> dict[str, dict[str, str]]:
    return {"targets": {t.name: fingerprint([t.host, t.port, list(t.tags)]) for t in targets}}


def counts(summary: Summary) -> dict[str, int]:
    """How many entries each section holds."""
    return {section: len(entries) for section, entries in summary.items()}


def changes(before: Summary | None, after: Summary) -> dict[str, dict[str, int]]:
    """Per section, how many entries were added, removed and changed from ``before`` to ``after``
    (sections without a change left out; ``before`` None: everything is added). Pure."""
    out: dict[str, dict[str, int]] = {}
    for section in dict.fromkeys([*(before or {}), *after]):
        old, new = (before or {}).get(section, {}), after.get(section, {})
        moved = {
            "added": sum(1 for name in new if name not in old),
            "removed": sum(1 for name in old if name not in new),
            "changed": sum(1 for name in new if name in old and old[name] != new[name]),
        }
        if any(moved.values()):
            out[section] = {k: v for k, v in moved.items() if v}
    return out


def loaded_row(file: str, path: Path, sha256: str | None, summary: Summary,
               before: Summary | None, *, first: bool) -> dict[str, Any]:
    """The row of a file loaded and in force. Pure."""
    return {**_base(file, path, sha256, first), "outcome": "loaded", "counts": counts(summary),
            "changed": changes(before, summary)}


def refused_row(file: str, path: Path, sha256: str | None, problems: Sequence[str], effect: str,
                *, first: bool) -> dict[str, Any]:
    """The row of a file that could not be used. Pure."""
    kept = list(problems[:MAX_PROBLEMS])
    return {**_base(file, path, sha256, first), "outcome": "refused", "error": "; ".join(kept),
            "problems": len(problems), "effect": effect}


def _base(file: str, path: Path, sha256: str | None, first: bool) -> dict[str, Any]:
    return {"phase": PHASE, "caller": "gateway", "surface": "server", "file": file, "path": str(path),
            "sha256": sha256, "at_start": first}


def rules_row(load: RulesLoad) -> dict[str, Any]:
    """The row of one new content of rules.yaml (``PolicyStore.on_reload``): a refusal (the file broken,
    at start or by an edit: every call the policy decides is refused, no earlier rules stay) or a load,
    ``recovered: true`` when it ends a broken spell."""
    if load.policy is None:
        effect = "every call the policy decides is refused until it is fixed (no earlier rules stay in force)"
        return refused_row("rules", load.path, load.sha256, load.problems, effect, first=load.first)
    before = None if load.previous is None else rules_summary(load.previous)
    row = loaded_row("rules", load.path, load.sha256, rules_summary(load.policy), before, first=load.first)
    return {**row, "recovered": True} if load.recovered else row


#: how many of the newest configuration rows a CLI run looks through for its files' last loads
RECENT_ROWS: Final = 50


def already_audited(row: Mapping[str, Any], recent: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``row`` (a load by a CLI run) tells nothing new: the newest row of the same file and
    path in ``recent`` (configuration rows, oldest first) has its sha256 and outcome. Pure."""
    same = [r for r in recent if r.get("file") == row.get("file") and r.get("path") == row.get("path")]
    return bool(same) and all(same[-1].get(k) == row.get(k) for k in ("sha256", "outcome"))


def last_loaded_path(file: str, recent: Sequence[Mapping[str, Any]]) -> Path | None:
    """Where the newest row in ``recent`` (oldest first) loaded ``file`` from (a server's own setting,
    such as the GATEWAY_NOTIFICATIONS_FILE of its unit), or None. Pure."""
    for row in reversed(recent):
        if row.get("file") == file and row.get("outcome") == "loaded" and isinstance(row.get("path"), str):
            return Path(row["path"])
    return None


def file_sha256(path: Path | None) -> str | None:
    """The SHA-256 of the file's bytes; None when it does not exist or cannot be read."""
    if path is None:
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def load_audited(file: str, path: Path, load: Callable[[], T], summary: Callable[[T], Summary],
                 write: Callable[[dict[str, Any]], None]) -> T:
    """``load()`` a file read once at start, writing its row; a refusal is written, then raised
    (the gateway does not start)."""
    sha = file_sha256(path)
    try:
        value = load()
    except ConfigError as exc:
        problems = exc.details.get("problems") or [exc.message]
        write(refused_row(file, path, sha, problems, "the gateway did not start", first=True))
        raise
    write(loaded_row(file, path, sha, summary(value), None, first=True))
    return value


class RolesReloads:
    """Rows of roles.yaml's loads, remembering the names of the content before (``RoleBook`` hooks)."""

    def __init__(self, path: Path, write: Callable[[dict[str, Any]], None]) -> None:
        self.path = path
        self.write = write
        self._before: Summary | None = None
        self._first = True

    def loaded(self, sha256: str, names: list[str]) -> None:
        summary = names_summary("roles", names)
        self.write(loaded_row("roles", self.path, sha256, summary, self._before, first=self._first))
        self._before, self._first = summary, False

    def refused(self, sha256: str | None, problems: list[str]) -> None:
        effect = "custom roles are off until it is fixed; the built-in roles reader and admin keep working"
        self.write(refused_row("roles", self.path, sha256, problems, effect, first=self._first))
        self._before, self._first = None, False


def unless_audited(reader: AuditReader, write: Callable[[dict[str, Any]], None],
                    quiet: bool) -> Callable[[dict[str, Any]], None]:
    """``write``, or (``quiet``: a CLI run) ``write`` only for a load that is news to the audit."""
    if not quiet:
        return write

    def maybe(row: dict[str, Any]) -> None:
        try:
            recent = reader.rows(phase=PHASE, last=RECENT_ROWS)
        except (OSError, ValueError, GatewayError):  # the audit cannot say: the row is written
            recent = []
        if not already_audited(row, recent):
            write(row)

    return maybe


class RowWriter(Protocol):
    """The audit trail's two ways to write a row (``server.base.audit_trail.AuditTrail``)."""

    def write_now(self, row: Mapping[str, Any]) -> None: ...

    def write_or_wait(self, row: Mapping[str, Any]) -> None: ...


class ConfigRows:
    """Writes the row of each configuration load through the audit trail (a CLI run: only the news)."""

    def __init__(self, trail: RowWriter, reader: AuditReader, *, quiet: bool) -> None:
        self.trail = trail
        self.reader = reader
        self.quiet = quiet

    def write(self, row: Mapping[str, Any], *, strict: bool = False) -> None:
        """One load's row; it waits in memory while the audit cannot take it, or with ``strict`` raises
        ``AuditUnavailable`` (the load must not apply). Blocking: the stores call it from the thread that
        read the file."""
        write = self.trail.write_now if strict else self.trail.write_or_wait
        unless_audited(self.reader, write, self.quiet)(dict(row))


def with_servers_notifications(settings: Settings, reader: AuditReader) -> Settings:
    """``settings`` with the notifications file the server last loaded (its audited row names it) when
    this shell's own is only the default and does not exist, so a decision made here is told too."""
    own = settings.notifications_file
    if own is None or own in settings.named_files or own.exists():
        return settings
    try:
        found = last_loaded_path("notifications", reader.rows(phase=PHASE,
                                                                      last=RECENT_ROWS))
    except (OSError, ValueError, GatewayError):
        return settings
    return replace(settings, notifications_file=found) if found is not None and found.exists() else settings


def load_identity(path: Path | None, audit: Callable[[Mapping[str, Any]], None],
                  write: Callable[[dict[str, Any]], None]) -> IdentityService | None:
    """identity.yaml (``gateway.identity``), its load audited like the other files; None without it."""
    if path is None or not path.is_file():
        return None

    def summary(service: IdentityService | None) -> Summary:
        if service is None:
            return {}
        web = service.config.web_sign_in
        return {"issuers": {i.issuer: i.audience for i in service.config.issuers},
                "web_sign_in": {web.client_id: web.issuer} if web is not None else {}}

    return load_audited("identity", path, lambda: open_identity(path, audit), summary, write)
