"""Read rules on the read path: the one place a read's answer is filtered (``guard.policy.read_filter``).

The pipeline authorizes a read per target and keeps, per target, what the read may show (a
``ReadFilter``, or None). After the mirror or the sweep answered, ``ReadRules`` filters each
target's answer: it reads the target's VM facts (moid, name, folder, pool of every VM) from the
mirror when it can answer, else with a sweep on the target's worker threads, and hands answer and
facts to the pure ``filter_answer``. The mirror's kept answers are never changed: filtering builds
new values, so the same kept answer serves every role.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from gateway.answer import Answer
from gateway.config import Target
from gateway.errors import PolicyDenied
from gateway.guard.policy.read_filter import (
    VM_FACT_FIELDS,
    Filtered,
    ReadFilter,
    Shaping,
    VmFacts,
    filter_answer,
)
from gateway.vsphere.mirror import Mirrors
from gateway.vsphere.pool import VSphereSession
from gateway.vsphere.scheduler import Scheduler

ReadFn = Callable[[VSphereSession, Mapping[str, Any]], Any]


class ReadRules:
    """Filters read answers per target; ``read_vms`` is list_vms' sweep (for the VM facts)."""

    def __init__(self, mirrors: Mirrors, scheduler: Scheduler, targets: Mapping[str, Target],
                 read_vms: ReadFn) -> None:
        self.mirrors = mirrors
        self.scheduler = scheduler
        self.targets = targets
        self.read_vms = read_vms

    async def vm_facts(self, target: str) -> VmFacts:
        """Every VM of ``target`` as rules see it: from its mirror when it can answer, else swept."""
        args = {"target": target, "fields": list(VM_FACT_FIELDS)}
        mirrored = await self.mirrors.answer(target, "list_vms", args)
        if mirrored is not None:
            rows = mirrored.value["vms"]
        else:
            swept = await self.scheduler.run(target, lambda s: self.read_vms(s, args),
                                             deadline=self.targets[target].timeout_seconds)
            rows = swept["vms"]
        return await asyncio.to_thread(VmFacts.of_rows, rows)

    async def shown(self, tool: str, target: str, answer: Any, rules: ReadFilter | None,
                    shaping: Shaping) -> Filtered:
        """One target's answer as ``rules`` let it be shown (``answer``: a value or an ``Answer``)."""
        value = answer.value if isinstance(answer, Answer) else answer
        facts = await self.vm_facts(target) if rules is not None and rules.needs_vm_facts else None
        return await asyncio.to_thread(filter_answer, tool, value, rules, facts, shaping)

    async def fan_out(self, tool: str, results: Mapping[str, dict[str, Any]],
                      filters: Mapping[str, ReadFilter | None],
                      shaping: Shaping) -> dict[str, dict[str, Any]]:
        """A fan-out's per-target results, each target's answer filtered; a target whose one object is
        hidden answers ``policy_denied``, as a target the policy refuses does. A mirror's encoded answer
        the rules leave as it is stays encoded; a filtered one is a new plain value."""
        out = dict(results)

        async def settle(name: str) -> None:
            result = results[name]
            if "ok" not in result or (filters.get(name) is None and not shaping.changes):
                return
            shown = await self.shown(tool, name, result["ok"], filters.get(name), shaping)
            refusal = {k: v for k, v in denial(tool, name, shown).to_wire().items() if k != "decision"}
            kept = result["ok"]
            ok = kept if isinstance(kept, Answer) and shown.answer is kept.value else shown.answer
            out[name] = {"ok": ok} if shown.answer is not None else {"error": refusal}

        await asyncio.gather(*(settle(name) for name in results))
        return out


def denial(tool: str, target: str, shown: Filtered) -> PolicyDenied:
    """The refusal of a read about one object the rules hide."""
    subject = shown.subject
    what = f"{subject.kind} '{subject.name or subject.moid}'" if subject is not None else "this object"
    rule = shown.denied or "policy"
    reason = (f"{what} on target '{target}' is not shown to you ({rule} in rules.yaml hides it from "
              f"{tool}); ask the gateway's operator if you need it")
    return PolicyDenied(reason, decision={"allowed": False, "reason": reason, "rule": rule})
