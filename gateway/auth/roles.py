"""Roles from roles.yaml: which tools and targets a token may use, and whether it may approve proposals.

``reader`` and ``admin`` are built in and cannot be redefined. Parsing is strict so a mistake narrows
instead of widening: every key required, "all" spelled ``"*"``, write and destructive tools granted by
name only. While the file is broken, ``RoleBook`` serves the built-in roles only and says why in the log.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal, cast

from gateway.config import ConfigProblems, NameKind, NameRef, load_yaml, located, position, suggestion
from gateway.role import (
    APPROVE_RIGHTS,
    AUDIT_RIGHTS,
    BUILTIN_ROLES,
    FAIR_SHARES,
    ApproveRight,
    AuditRight,
    FairShare,
    Role,
)
from gateway.vsphere.fair_order import DEFAULT_WEIGHT, MAX_WEIGHT, MIN_WEIGHT

log = logging.getLogger(__name__)

#: every custom role sets these
ROLE_KEYS: Final = ("tools", "allow_write", "allow_destructive", "targets", "approve")
#: optional keys and the value a role gets without them (the narrowest)
OPTIONAL_ROLE_KEYS: Final[Mapping[str, str | float]] = {"audit": "none", "queue_weight": DEFAULT_WEIGHT,
                                                         "fair_share": "caller"}
#: the keys a roles file may have at its top level
FILE_KEYS: Final = ("roles", "fair_share")
#: the file's ``fair_share`` when it sets none
DEFAULT_FAIR_SHARE: Final[FairShare] = "caller"
_ROLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,127}")
_GLOB_CHARS = frozenset("*?[]")
#: a roles.yaml modified this recently is re-read even if its stat looks unchanged (same-tick edits)
_RACY_NS: Final = 2_000_000_000


# -- parsing ---------------------------------------------------------------------------------------

class _RoleReader:
    """One role's entry: each problem starts with ``file:line:column: role 'name':``; names of tools and
    targets the role uses are collected in ``refs``."""

    def __init__(self, source: str, name: Any, entry: Any, entries: Any, problems: list[str],
                 refs: list[NameRef]) -> None:
        self.source, self.name, self.entry, self.entries = source, name, entry, entries
        self.problems, self.refs = problems, refs

    def problem(self, message: str, key: str | None = None) -> None:
        at = located(self.source, self.entry, key) if key is not None and position(self.entry, key) \
            else located(self.source, self.entries, self.name)
        self.problems.append(f"{at}: role {self.name!r}: {message}")

    def ref(self, kind: NameKind, key: str, values: Any, *, glob: bool) -> None:
        for index, value in enumerate(values):
            where = located(self.source, self.entry[key], index) if position(self.entry[key], index) \
                else located(self.source, self.entry, key)
            self.refs.append(NameRef(kind, value, where, f"roles.{self.name}.{key}[{index}]", glob=glob))

    def tools(self) -> Literal["read", "*"] | frozenset[str] | None:
        value = self.entry["tools"]
        if value in ("read", "*"):
            return cast(Literal["read", "*"], value)
        if isinstance(value, list):
            return self.names("tools", "tool")
        self.problem(f"'tools' must be read, \"*\" (every tool) or a list of tool names, got {value!r}",
                     "tools")
        return None

    def names(self, key: str, kind: NameKind) -> frozenset[str] | None:
        value = self.entry[key]
        if not isinstance(value, list):
            self.problem(f"'{key}' must be a list of tool names (write [] for none), got {value!r}", key)
            return None
        bad = [v for v in value if not isinstance(v, str) or not _TOOL_NAME.fullmatch(v)]
        for v in bad:
            pattern = isinstance(v, str) and bool(_GLOB_CHARS & set(v))
            hint = "name tools one by one; patterns are not accepted" if pattern else "not a tool name"
            self.problem(f"'{key}' entry {v!r}: {hint}", key)
        if bad:
            return None
        self.ref(kind, key, value, glob=False)
        return frozenset(value)

    def targets(self) -> Literal["*"] | tuple[str, ...] | None:
        value = self.entry["targets"]
        if value == "*":
            return "*"
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            hint = " (spell every target \"*\")" if value == "all" else ""
            self.problem(f"'targets' must be \"*\" or a list of target names or globs{hint}, got {value!r}",
                         "targets")
            return None
        if "*" in value:
            return "*"
        self.ref("target", "targets", value, glob=True)
        return tuple(value)

    def weight(self) -> float | None:
        value = self.entry.get("queue_weight", DEFAULT_WEIGHT)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and MIN_WEIGHT <= value <= MAX_WEIGHT:
            return float(value)
        self.problem(f"'queue_weight' must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g} (the role's "
                     f"share of a busy target's slots; {DEFAULT_WEIGHT:g} unless set), got {value!r}",
                     "queue_weight")
        return None

    def right(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str | None:
        value = self.entry.get(key, default)
        if value in choices:
            return cast(str, value)
        self.problem(f"'{key}' must be one of {', '.join(choices)}{_choice_hint(value, choices)} (quote it "
                     f"if YAML reads it as a boolean), got {value!r}", key)
        return None


def _choice_hint(value: Any, choices: tuple[str, ...]) -> str:
    return suggestion(value, choices) if isinstance(value, str) else ""


_FAIR_SHARE_MEANING: Final = ("caller: one share per caller; person: every agent acting for one person "
                              "shares one with that person")


def _parse_role(name: Any, entry: Any, source: str, problems: list[str], entries: Any = None,
                refs: list[NameRef] | None = None, fair_share: FairShare = DEFAULT_FAIR_SHARE) -> Role | None:
    r = _RoleReader(source, name, entry, entries, problems, [] if refs is None else refs)
    before = len(problems)
    if not isinstance(name, str) or not _ROLE_NAME.fullmatch(name):
        r.problem("a role name is 1-64 letters, digits, '.', '_' or '-'")
    elif name in BUILTIN_ROLES:
        r.problem(f"'{name}' is built in and cannot be redefined; pick another name")
    if not isinstance(entry, Mapping):
        r.problem(f"must be a mapping with the keys {', '.join(ROLE_KEYS)}")
        return None
    known = (*ROLE_KEYS, *OPTIONAL_ROLE_KEYS)
    for key in sorted(set(entry) - set(known), key=str):
        r.problem(f"unknown key {key!r}{suggestion(str(key), known)}; the keys are {', '.join(known)}", key)
    for key in ROLE_KEYS:
        if key not in entry:
            r.problem(f"missing key '{key}' (every key but {', '.join(OPTIONAL_ROLE_KEYS)} is required, so "
                      "a file cut off mid-edit refuses the role instead of widening it)")
    if len(problems) > before:
        return None
    tools = r.tools()
    allow_write = r.names("allow_write", "write tool")
    allow_destructive = r.names("allow_destructive", "destructive tool")
    targets = r.targets()
    approve = r.right("approve", APPROVE_RIGHTS)
    audit = r.right("audit", AUDIT_RIGHTS, "none")
    weight = r.weight()
    share = r.right("fair_share", FAIR_SHARES, fair_share)
    if tools is None or allow_write is None or allow_destructive is None or targets is None:
        return None
    if approve is None or audit is None or weight is None or share is None:
        return None
    return Role(name, tools, allow_write, allow_destructive, targets, cast(ApproveRight, approve),
                cast(AuditRight, audit), weight, cast(FairShare, share))


@dataclass(frozen=True)
class RoleFile:
    """What a roles file says: its custom roles and its ``fair_share`` default (already applied to the
    custom roles that set none; ``builtins`` applies it to the built-in ones)."""

    roles: dict[str, Role] = field(default_factory=dict)
    fair_share: FairShare = DEFAULT_FAIR_SHARE

    def builtins(self) -> dict[str, Role]:
        """The built-in roles with this file's ``fair_share`` (the very ones when it is theirs)."""
        share = self.fair_share
        return {name: role if role.fair_share == share else replace(role, fair_share=share)
                for name, role in BUILTIN_ROLES.items()}


def parse_roles(data: Any, source: str, refs: list[NameRef] | None = None) -> dict[str, Role]:
    """Custom roles from parsed YAML (``{"roles": {name: {...}}}``; an empty file defines none).

    Raises ``ConfigProblems`` listing every problem found. ``refs`` (when given) receives every tool and
    target name the roles use (checked against what exists by ``gateway.guard.names``)."""
    return parse_role_file(data, source, refs).roles


def parse_role_file(data: Any, source: str, refs: list[NameRef] | None = None) -> RoleFile:
    """The whole file from parsed YAML: ``roles`` and the optional top-level ``fair_share`` default;
    ``ConfigProblems`` as ``parse_roles``."""
    if data is None:
        return RoleFile()
    if not isinstance(data, Mapping) or not set(data) & set(FILE_KEYS):
        raise ConfigProblems([f"{located(source, data)}: expected the top-level key 'roles:' mapping role "
                              "names to roles (and optionally 'fair_share:')"])
    problems: list[str] = []
    for key in sorted(set(data) - set(FILE_KEYS), key=str):
        problems.append(f"{located(source, data, key)}: unknown top-level key {key!r}"
                        f"{suggestion(str(key), FILE_KEYS)}; the keys are {', '.join(FILE_KEYS)}")
    fair_share = data.get("fair_share", DEFAULT_FAIR_SHARE)
    if fair_share not in FAIR_SHARES:
        problems.append(f"{located(source, data, 'fair_share')}: 'fair_share' (the default of every role) "
                        f"must be one of {', '.join(FAIR_SHARES)}{_choice_hint(fair_share, FAIR_SHARES)} "
                        f"({_FAIR_SHARE_MEANING}), got {fair_share!r}")
        fair_share = DEFAULT_FAIR_SHARE
    entries = data.get("roles")
    if entries is not None and not isinstance(entries, Mapping):
        problems.append(f"{located(source, data, 'roles')}: 'roles' must map role names to roles")
        entries = None
    roles = {name: _parse_role(name, entry, source, problems, entries, refs, cast(FairShare, fair_share))
             for name, entry in (entries or {}).items()}
    if problems:
        raise ConfigProblems(problems)
    return RoleFile({name: role for name, role in roles.items() if role is not None},
                    cast(FairShare, fair_share))


def _read_roles_file(path: Path) -> tuple[bytes | None, list[str]]:
    """The file's bytes (None if absent) and problems with who may write it."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            content = fh.read()
    except FileNotFoundError:
        return None, []
    except OSError as exc:
        return b"", [f"{path}: cannot read roles file ({exc.strerror}); fix its permissions"]
    problems = []
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problems.append(f"{path}: writable by other users, who could grant themselves any role; chmod 600 it")
    if st.st_uid not in (os.getuid(), 0):
        problems.append(f"{path}: owned by uid {st.st_uid}, not the gateway's user; chown it")
    return content, problems


def load_roles(content: bytes | None, source: str, refs: list[NameRef] | None = None) -> dict[str, Role]:
    """Parse the bytes of a roles file (None: no file, no custom roles); ``ConfigProblems`` if broken.
    ``refs``: see ``parse_roles``."""
    return load_role_file(content, source, refs).roles


def load_role_file(content: bytes | None, source: str, refs: list[NameRef] | None = None) -> RoleFile:
    """``load_roles``, with the file's ``fair_share`` default."""
    if content is None:
        return RoleFile()
    if content and not content.endswith(b"\n"):
        # A write cut off mid-line can still parse, with a name shortened into another one.
        raise ConfigProblems([f"{source}: does not end with a newline, so it may have been cut off "
                              "mid-write; check its end and finish it with a newline"])
    problems: list[str] = []
    data = load_yaml(content, source, problems)
    try:
        parsed = parse_role_file(data, source, refs)
    except ConfigProblems as exc:
        problems += exc.problems
    if problems:
        raise ConfigProblems(problems)
    return parsed


class RoleBook:
    """The roles in force: built-ins always, custom roles from ``path`` while it is valid.

    Each lookup of a custom role checks the file (a ``stat``; the content when that changed) and
    reloads it when its sha256 changed. ``on_reload(sha256, role_names)`` is called for every valid
    content loaded (the first included) before it takes effect, so the server can audit it; if it
    raises, the previous roles stay in force (logged) and the next lookup tries again. Thread-safe.
    """

    def __init__(self, path: Path, on_reload: Callable[[str, list[str]], None] | None = None, *,
                 on_refs: Callable[[list[NameRef]], None] | None = None,
                 on_refused: Callable[[str | None, list[str]], None] | None = None) -> None:
        self.path = Path(path)
        self._on_reload = on_reload
        #: called with the names (tools, targets) of every newly loaded valid file
        self.on_refs = on_refs
        #: called with the sha256 (None: unreadable) and the problems of every new content refused
        self.on_refused = on_refused
        self._lock = threading.RLock()
        self._custom: dict[str, Role] = {}
        #: the built-in roles with the file's ``fair_share`` default (as built while it is broken)
        self._builtins: dict[str, Role] = dict(BUILTIN_ROLES)
        self._signature: tuple[int, ...] | None = None
        self._racy = True
        self._loaded = False
        self._sha256: str | None = None
        self._seen: tuple[str | None, tuple[str, ...]] = (None, ())

    @property
    def sha256(self) -> str | None:
        """The sha256 of the content last read (None when there is no file)."""
        self.refresh()
        return self._sha256

    def get(self, name: str) -> Role | None:
        """The role named ``name``; None if undefined, or custom while the file is broken. A built-in
        role carries the file's ``fair_share`` default (its own while the file is broken)."""
        self.refresh()
        with self._lock:
            return self._builtins.get(name) or self._custom.get(name)

    def get_loaded(self, name: str) -> tuple[bool, Role | None]:
        """``get`` for an event loop: never reads or reloads the file (one ``stat``). (True, the role)
        when the roles in memory are the file as it is now; (False, None) when the file changed since
        (or was just written): ``get`` it off the loop, which reloads it."""
        signature = self._stat()
        with self._lock:
            if not self._loaded or signature != self._signature or self._racy:
                return False, None
            return True, self._builtins.get(name) or self._custom.get(name)

    def roles(self) -> dict[str, Role]:
        """Every role in force: the built-ins, then the custom roles."""
        self.refresh()
        with self._lock:
            return {**self._builtins, **self._custom}

    def check(self) -> list[str]:
        """Every problem of the file as it is now (empty if valid or absent), for ``gateway roles check``."""
        return self.survey()[0]

    def survey(self) -> tuple[list[str], dict[str, Role], list[NameRef]]:
        """The file as it is now: its problems, its custom roles (none while broken) and the tool and
        target names they use (for ``gateway check``)."""
        content, problems = _read_roles_file(self.path)
        refs: list[NameRef] = []
        roles: dict[str, Role] = {}
        try:
            roles = load_roles(content, str(self.path), refs)
        except ConfigProblems as exc:
            problems.extend(exc.problems)
        return problems, ({} if problems else roles), refs

    def refresh(self) -> None:
        """Reload the file if it changed since the last look."""
        signature = self._stat()
        with self._lock:
            if self._loaded and signature == self._signature and not self._racy:
                return
            content, access_problems = _read_roles_file(self.path)
            digest = None if content is None else hashlib.sha256(content).hexdigest()
            seen = (digest, tuple(access_problems))
            if (not self._loaded or seen != self._seen) and not self._apply(content, digest, access_problems):
                return  # on_reload failed: the roles before stay, and the next lookup tries again
            self._seen, self._loaded, self._signature = seen, True, signature
            self._racy = signature is not None and signature[0] >= time.time_ns() - _RACY_NS

    def _apply(self, content: bytes | None, digest: str | None, problems: list[str]) -> bool:
        """Put the content in force; False (nothing changed) when ``on_reload`` refused it."""
        parsed = RoleFile()
        refs: list[NameRef] = []
        try:
            parsed = load_role_file(content, str(self.path), refs)
        except ConfigProblems as exc:
            problems = [*problems, *exc.problems]
        roles = parsed.roles
        if problems:
            for problem in problems:
                log.error("custom roles disabled until fixed (built-in roles keep working): %s", problem)
            parsed, roles = RoleFile(), {}
            if self.on_refused is not None:
                self.on_refused(digest, problems)
        elif digest is None and self._custom:
            log.warning("%s is gone: custom roles are off, built-in roles keep working", self.path)
        elif self._on_reload is not None and digest is not None:
            try:
                self._on_reload(digest, sorted(roles))
            except Exception as exc:  # unaudited, so not in force: fail closed to the roles before
                log.error("%s changed, but its load could not be audited (%s); the roles before stay in "
                          "force until it can be (retried at the next lookup)", self.path, exc)
                return False
        if not problems and self.on_refs is not None:
            self.on_refs(refs)
        self._custom, self._sha256 = roles, digest
        self._builtins = parsed.builtins()
        return True

    def _stat(self) -> tuple[int, ...] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode, st.st_uid)
