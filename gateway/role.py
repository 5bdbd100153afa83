"""What a role may do: the ``Role`` record, the two built-in roles and the pure ``permits`` check."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Final, Literal

from gateway.vocabulary import Category

ApproveRight = Literal["none", "any", "others"]
APPROVE_RIGHTS: Final = ("none", "any", "others")
AuditRight = Literal["none", "own", "all"]
AUDIT_RIGHTS: Final = ("none", "own", "all")
#: whose fair-queue share a caller queues in: its own (``caller``), or, for an agent acting for a
#: person, that person's (``person``: every agent acting for one person shares one)
FairShare = Literal["caller", "person"]
FAIR_SHARES: Final = ("caller", "person")
#: target values that mean "every target" in a call (names reserved by targets.yaml)
ALL_TARGETS: Final = frozenset({"all", "*"})


@dataclass(frozen=True)
class Role:
    """What a role may do. ``tools`` is ``"read"``, ``"*"`` or a set of tool names."""

    name: str
    tools: Literal["read", "*"] | frozenset[str]
    allow_write: frozenset[str] = frozenset()
    allow_destructive: frozenset[str] = frozenset()
    targets: Literal["*"] | tuple[str, ...] = "*"
    approve: ApproveRight = "none"
    #: which audit rows the role may read: none, its own calls (caller_key = the viewer's), or all
    #: rows of its targets
    audit: AuditRight = "none"
    #: the role's share of a busy target's slots against other callers' (``queue_weight`` in
    #: roles.yaml; every principal alike by default): a caller of weight 3 is served three calls a turn
    queue_weight: float = 1.0
    #: whose share of a busy target's slots the role's callers queue in (``fair_share`` in roles.yaml,
    #: per role or the file's default for every role; ``gateway.auth.fair_share.share_of``)
    fair_share: FairShare = "caller"

    @property
    def all_targets(self) -> bool:
        return self.targets == "*"

    def permits_tool(self, tool: str, category: Category) -> bool:
        """``tools`` first ("read": the read category; "*": everything; a list: those names), then the
        write or destructive tools named in ``allow_write`` / ``allow_destructive`` for that category."""
        if self.tools == "*" or (self.tools == "read" and category == Category.READ):
            return True
        if isinstance(self.tools, frozenset) and tool in self.tools:
            return True
        extra = {Category.WRITE: self.allow_write, Category.DESTRUCTIVE: self.allow_destructive}
        return tool in extra.get(category, frozenset())

    def permits_target(self, target: str) -> bool:
        """A target name matched against the globs; "all" (every target) needs ``targets: "*"``."""
        if self.all_targets:
            return True
        if target in ALL_TARGETS:
            return False
        return any(fnmatchcase(target, pattern) for pattern in self.targets)

    def describe(self, catalog: Mapping[str, Category] | None = None) -> dict[str, Any]:
        """What the role really allows, as plain JSON-able values (for ``gateway roles list``):
        ``allow_write`` / ``allow_destructive`` are every write / destructive tool the role may call,
        whichever key grants it ("*" when ``tools: "*"``); ``catalog`` (tool name -> category) lets a
        ``tools`` list count too."""
        def listed(value: frozenset[str] | str | tuple[str, ...]) -> list[str] | str:
            return value if isinstance(value, str) else sorted(value)

        def granted(category: Category, extra: frozenset[str]) -> list[str] | str:
            if self.tools == "*":
                return "*"
            named = {t for t in self.tools if catalog and catalog.get(t) == category} \
                if isinstance(self.tools, frozenset) else set()
            return sorted(named | extra)

        return {"name": self.name, "tools": listed(self.tools),
                "allow_write": granted(Category.WRITE, self.allow_write),
                "allow_destructive": granted(Category.DESTRUCTIVE, self.allow_destructive),
                "targets": listed(self.targets), "approve": self.approve, "audit": self.audit,
                "queue_weight": self.queue_weight, "fair_share": self.fair_share}


BUILTIN_ROLES: Final[Mapping[str, Role]] = {
    "reader": Role("reader", tools="read", targets="*", approve="none", audit="own"),
    "admin": Role("admin", tools="*", targets="*", approve="any", audit="all"),
}


def permits(role: Role, tool: str, category: Category, target: str | None) -> bool:
    """May ``role`` call ``tool`` (of ``category``) on ``target``? ``target=None`` for tools that take
    none (list_targets, confirm_action, ...); ``"all"`` only for roles with every target. Pure."""
    return role.permits_tool(tool, category) and (target is None or role.permits_target(target))
