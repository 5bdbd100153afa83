"""Which fair-queue share a caller queues in: ``share_of``, the one place that says it, and ``queue_for``,
the way every entry point queues a caller's vSphere calls.

A share is a caller key's text form (``CallerKey``), never a display name, so an IdP client named like a
local token, or two spellings of one person's email, never share or split a queue. With the role's
``fair_share: caller`` (the default) each caller key has its own share: a holder of ten tokens, or ten
agents, has ten. With ``fair_share: person`` an agent acting for a person (``acting_for_key``) queues in
that person's share: every agent acting for one person, and that person's own calls, share one turn,
one weight and one ``max_queued_per_caller`` bound on each target. A caller acting for nobody keeps
its own share either way.
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
