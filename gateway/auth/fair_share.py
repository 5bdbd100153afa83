"""Which fair-queue share a caller queues in: ``share_of`` says it, ``queue_for`` queues by it.

A share is a caller key's text, never a display name, so look-alike names never share or split a
queue. ``fair_share: caller`` (the default) gives each key its own share; ``fair_share: person`` puts
every agent acting for one person in that person's share.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gateway.auth.principal import Principal
from gateway.role import Role
from gateway.vsphere.lane import Caller, queue_as

__all__ = ["queue_for", "share_of"]


def share_of(principal: Principal, role: Role | None) -> str:
    """The share ``principal`` queues in under ``role`` (None: a caller with no role in force, which
    the gate refuses; it queues alone)."""
    if role is not None and role.fair_share == "person" and principal.person_key is not None:
        return str(principal.person_key)
    return str(principal.key)


@contextlib.contextmanager
def queue_for(principal: Principal, role: Role | None) -> Iterator[Caller]:
    """Every vSphere call made inside queues in ``principal``'s share (``share_of``) with ``role``'s
    ``queue_weight``."""
    with queue_as(share_of(principal, role), role.queue_weight if role is not None else None) as caller:
        yield caller
