"""The call vocabulary every layer shares: categories, risk levels, plans, affected objects, preconditions.

It imports nothing from ``gateway``, so vsphere, guard, auth and tools share these words without
importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Category(StrEnum):
    """What a tool does: reads change nothing, writes change things, destructive calls cannot be undone."""

    READ = "read"
    WRITE = "write"
    DESTRUCTIVE = "destructive"


class Kind(StrEnum):
    """Who a principal is. Only a person approves or denies a proposal (and never their own); an agent
    calls tools. Tokens are agents' unless created ``--kind person``; the OS user running the CLI on
    the host is a person, the stdio caller (a desktop user's agent session) an agent."""

    PERSON = "person"
    AGENT = "agent"


class Risk(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return list(Risk).index(self)


@dataclass(frozen=True)
class AffectedObject:
    """One vSphere object a write touches, with the facts policy matches on."""

    type: str
    name: str
    moid: str
    folder: str | None = None
    resource_pool: str | None = None
    connection_state: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Precondition:
    """A state of vSphere a change needs and does not have now (e.g. a powered-on VM to delete), or an
    argument that names nothing on the VM (a disk or snapshot it does not have).

    Plan functions record these instead of raising, so the pipeline answers them only after the
    call was authorized: a denied caller never hears about power state, disks or snapshots.
    ``details`` are JSON-able; ``code`` is the wire code of the error it is answered as.
    """

    message: str
    details: Mapping[str, Any] = field(default_factory=dict)
    code: str = "invalid_state"


@dataclass(frozen=True)
class Plan:
    """A resolved write: what it will do, to which objects, with JSON-able ``params`` to execute it.

    ``params`` must hold everything ``execute`` needs (moids, not names), so a proposal persisted
    in the state store can be executed later by another process. ``unmet`` lists the preconditions
    that do not hold (answered only after the call was authorized).
    """

    summary: str
    affected: tuple[AffectedObject, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    #: set for bulk actions: how many objects the call would change (limits use it)
    object_count: int | None = None
    unmet: tuple[Precondition, ...] = ()
    #: for a destructive plan: what it will affect, read live (disks, snapshots, power state, host;
    #: a bulk call's count and objects), JSON-able; shown with the proposal and bound to its approvals
    blast_radius: Mapping[str, Any] | None = None

    @property
    def count(self) -> int:
        return self.object_count if self.object_count is not None else len(self.affected)


ProgressFn = Callable[[float, str], None]
