"""Calls refused as ``busy``, audited once per burst instead of one row each.

A burst is one caller's refusals on one target from its first until ``interval`` seconds later: the
first opens it, the rest only count (on the event loop, no I/O), and when it closes one ``busy`` row
says who, where, how many, since when and through which tools."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.guard.callers import scope_of
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.context import CallContext

#: how long one burst stays open (its row is written when it closes)
BUSY_AUDIT_SECONDS: Final = 10.0
#: tool names one row lists, at most (the count covers every refusal)
MAX_TOOLS: Final = 20


@dataclass
class _Burst:
    row: dict[str, Any]
    since: float = field(default_factory=time.time)
    count: int = 0
    tools: set[str] = field(default_factory=set)


class BusyAudit:
    """Busy refusals counted per (caller, target) and audited once per burst (see the module doc)."""

    def __init__(self, trail: AuditTrail, *, interval: float = BUSY_AUDIT_SECONDS,
                 max_bursts: int = 256) -> None:
        self.trail, self.interval, self.max_bursts = trail, interval, max_bursts
        self._bursts: dict[tuple[str, str], _Burst] = {}
        self._writing: set[asyncio.Task[None]] = set()

    def record(self, ctx: CallContext, target: str) -> None:
        """Count one busy refusal of ``ctx``'s caller on ``target`` (on the event loop)."""
        key = (scope_of(ctx.principal), target)
        if key not in self._bursts and len(self._bursts) >= self.max_bursts:
            key = ("*", target)
        burst = self._bursts.get(key)
        if burst is None:
            row = {k: v for k, v in ctx.row("busy").items()
                   if k in ("phase", "caller", "caller_key", "kind", "role", "surface", "client")}
            if key[0] == "*":
                row.update(caller="*", caller_key=None, kind=None, role=None, client=None)
            burst = self._bursts[key] = _Burst(row)
            asyncio.get_running_loop().call_later(self.interval, self._close, key, burst)
        burst.count += 1
        if len(burst.tools) < MAX_TOOLS:
            burst.tools.add(ctx.spec.name)

    async def flush(self) -> None:
        """Write the row of every open burst now, and wait for rows on their way (at shutdown)."""
        for key, burst in list(self._bursts.items()):
            self._close(key, burst)
        if self._writing:
            await asyncio.gather(*self._writing, return_exceptions=True)

    def _close(self, key: tuple[str, str], burst: _Burst) -> None:
        if self._bursts.get(key) is not burst:
            return  # flushed already
        del self._bursts[key]
        row = {**burst.row, "target": key[1], "outcome": "refused", "error_code": "busy",
               "count": burst.count, "since": round(burst.since, 3), "tools": sorted(burst.tools)}
        task = asyncio.get_running_loop().create_task(self.trail.record_outcome(row))
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)
