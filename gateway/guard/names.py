"""Names one configuration file uses for what another defines, checked to exist.

A name that matches nothing is almost always a typo that silently changes the meaning (a misspelt
target lifts its web approval). ``gateway check`` fails on one; the server logs a warning. Tags are
not checked: a rule may wait for a tag no target has yet.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.config import NameRef, Target, suggestion
from gateway.guard.policy.model import Policy
from gateway.guard.policy.read_filter import unreachable_rules
from gateway.role import Role
from gateway.vocabulary import Category

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KnownNames:
    """What exists: target names, every tool of this build with its category, roles. ``targets`` is
    None when targets.yaml could not be read (target names are then not checked)."""

    targets: tuple[str, ...] | None
    tools: Mapping[str, Category]
    roles: tuple[str, ...]

    @classmethod
    def of(cls, targets: Sequence[Target] | None, roles: Iterable[str],
           tools: Mapping[str, Category]) -> KnownNames:
        """Build from loaded targets (None: unknown), role names and the tools with their categories (for
        the server and the CLI: every tool this build offers, destructive ones included, as
        ``gateway.tools.registry.tool_categories`` gives them: a server may enable them later)."""
        names = None if targets is None else tuple(t.name for t in targets)
        return cls(names, dict(tools), tuple(roles))


@dataclass(frozen=True)
class UnknownName:
    """One name that matches nothing; ``str()`` is the full problem line."""

    ref: NameRef
    message: str

    def __str__(self) -> str:
        return f"{self.ref.where}: {self.ref.path}: {self.message}"


def _matches(ref: NameRef, names: Collection[str]) -> bool:
    if ref.fold_case:
        value = ref.value.casefold()
        return any(fnmatch.fnmatchcase(n.casefold(), value) if ref.glob else n.casefold() == value
                   for n in names)
    return any(fnmatch.fnmatchcase(n, ref.value) if ref.glob else n == ref.value for n in names)


def _is_glob(value: str) -> bool:
    return any(ch in value for ch in "*?[")


def _missing(ref: NameRef, what: str, names: Collection[str], where: str, effect: str = "") -> str:
    listed = f" (there are: {', '.join(sorted(names))})" if 0 < len(names) <= 12 else ""
    if _is_glob(ref.value) and ref.glob:
        return f"the glob '{ref.value}' matches no {what} {where}{effect}{listed}"
    return f"no {what} is named '{ref.value}' {where}{effect}{suggestion(ref.value, names)}{listed}"


def _check(ref: NameRef, known: KnownNames) -> str | None:
    if ref.kind == "target":
        if known.targets is None or _matches(ref, known.targets):
            return None
        effect = ", so these settings apply to no target" if ref.path.startswith("targets.") else ""
        return _missing(ref, "target", known.targets, "in targets.yaml", effect)
    if ref.kind == "role":
        return None if _matches(ref, known.roles) else _missing(ref, "role", known.roles,
                                                                "(built-in or in roles.yaml)")
    if not _matches(ref, known.tools):
        return _missing(ref, "tool", known.tools, "in this gateway")
    wanted = {"write tool": Category.WRITE, "destructive tool": Category.DESTRUCTIVE}.get(ref.kind)
    category = known.tools.get(ref.value)
    if wanted is not None and category is not None and category != wanted:
        key = ref.path.rsplit(".", 1)[-1].split("[")[0]
        fix = {Category.WRITE: "allow_write", Category.DESTRUCTIVE: "allow_destructive"}.get(category)
        move = f"move it to {fix}" if fix else "read tools come with 'tools: read' or a tools list"
        return f"'{ref.value}' is a {category.value} tool, so {key} grants nothing; {move}"
    return None


def unknown_names(refs: Iterable[NameRef], known: KnownNames) -> list[UnknownName]:
    """Every reference that matches nothing (or grants nothing), in file order, each once."""
    found: dict[tuple[str, str], UnknownName] = {}
    for ref in refs:
        message = _check(ref, known)
        if message is not None:
            found.setdefault((ref.where, ref.path), UnknownName(ref, message))
    return list(found.values())


def log_unknown_names(refs: Iterable[NameRef], known: KnownNames) -> None:
    """The server's side: one WARNING per name that matches nothing (the server keeps running)."""
    for unknown in unknown_names(refs, known):
        log.warning("%s (the gateway keeps running; `gateway check` lists every such name)", unknown)


class RoleSource(Protocol):
    """What ``rules_watcher`` reads of the roles file (``gateway.auth.roles.RoleBook``): its roles."""

    def roles(self) -> dict[str, Role]: ...


def rules_watcher(roles: RoleSource, targets: Sequence[Target],
                  tools: Mapping[str, Category]) -> Callable[[Policy], None]:
    """The ``on_load`` of the rules file (``PolicyStore``): each new valid content logs the names that
    match nothing and the rules whose object fields can never apply to the tools they name (for the
    server: a warning at load). ``tools``: every tool of this build with its category."""

    def loaded(policy: Policy) -> None:
        known = KnownNames.of(targets, roles.roles(), tools)
        log_unknown_names(policy.refs, known)
        for problem in unreachable_rules(policy, known.tools):
            log.warning("%s (the gateway keeps running; `gateway check` reports it as an error)", problem)

    return loaded


def roles_watcher(targets: Sequence[Target],
                  tools: Mapping[str, Category]) -> Callable[[list[NameRef]], None]:
    """The ``on_refs`` of roles.yaml (``RoleBook``): the names a newly loaded file uses that match nothing."""
    return lambda refs: log_unknown_names(refs, KnownNames.of(targets, (), tools))
