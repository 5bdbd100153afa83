"""Reads: the targets a read goes to, the mirror or a live sweep, read rules, one encoded answer.

Each target is authorized and rate limited by the gate; a fan-out's answer is composed of each
target's encoded answer, with its audit row."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.answer import Answer
from gateway.errors import Busy, Forbidden, GatewayError, PolicyDenied, RateLimited
from gateway.guard.decision import Entry, Facts, Verdict, read_rules, sees_target_addresses
from gateway.guard.policy.read_filter import Filtered, ReadFilter, read_args
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.context import ALL, CallContext, ProgressSink, off_loop, redact_args, target_label
from gateway.server.base.facts import FactsNow
from gateway.server.call.gate import Gate
from gateway.server.call.read_rules import ReadRules, denial
from gateway.tools.read import summarize_targets, target_about
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Category
from gateway.vsphere.mirror import Mirrors
from gateway.vsphere.pool import VSphereSession
from gateway.vsphere.scheduler import Scheduler


@dataclass(frozen=True)
class _TargetRead:
    """What a read learned of one target in its worker trip (``Reads._read_facts``)."""

    facts: Facts
    verdict: Verdict
    #: the rate limit's refusal (None: within it, and counted; or the verdict refused first)
    limited: RateLimited | None


class Reads:
    """Answers read tools on one target or many, through the gate (``server.call.gate``)."""

    def __init__(self, *, gate: Gate, facts: FactsNow, trail: AuditTrail, scheduler: Scheduler,
                 mirrors: Mirrors, read_rules: ReadRules, fanout_timeout: float) -> None:
        self.gate = gate
        self.facts = facts
        self.trail = trail
        self.scheduler = scheduler
        self.mirrors = mirrors
        self.read_rules = read_rules
        self.fanout_timeout = fanout_timeout

    async def _read_targets(
        self, ctx: CallContext, args: dict[str, Any]
    ) -> tuple[list[str], dict[str, dict[str, Any]], dict[str, ReadFilter | None]]:
        """The targets a read goes to, each authorized (role, policy) and rate limited, every refusal
        audited, with what the read may show on each (read rules). A single target's refusal is
        raised; in a fan-out a target the policy or a rate limit refuses answers its own error, and the
        others still answer (a target outside the role is refused for the whole call, like an unknown
        one)."""
        ref = args["target"]
        single = isinstance(ref, str) and ref != ALL
        if ref == ALL:
            names = [t.name for t in self.facts.visible_targets(ctx.role)]
            if not names:
                await self.gate.refused(ctx, args, Forbidden("your role covers no configured target"))
        else:
            names = [ref] if isinstance(ref, str) else list(ref)
        refused: dict[str, dict[str, Any]] = {}
        filters: dict[str, ReadFilter | None] = {}
        for name in names:
            read = await off_loop(self._read_facts, ctx, args, name)
            filters[name] = read_rules(read.facts)
            try:
                await self.gate.enforce(ctx, read.verdict, read.facts, args, target=name)
                if read.limited is not None:
                    await self.gate.refused(ctx, args, read.limited, target=name)
            except (PolicyDenied, RateLimited) as exc:
                if single:
                    raise
                refused[name] = {"error": {k: v for k, v in exc.to_wire().items() if k != "decision"}}
        if not single and len(refused) == len(names):
            raise PolicyDenied(f"the policy refuses this read on every target named: {', '.join(refused)}")
        return names, refused, filters

    def _read_facts(self, ctx: CallContext, args: Mapping[str, Any], target: str) -> _TargetRead:
        """A read's facts on ``target``, the gate's decision on them and, when it allows the read, the
        target's rate limit counted: one trip off the event loop for the three (the refusals are
        audited on the loop, by the gate)."""
        facts = self.facts.facts(Entry.READ, ctx.party, ctx.spec, args, target=target)
        verdict = self.gate.decide(facts, ctx.spec.name)
        limited = None
        if verdict.allowed:
            limited = self.gate.over_rate(ctx, target, Category.READ, self.facts.policy.target_limits(target))
        return _TargetRead(facts, verdict, limited)

    async def read(
        self, ctx: CallContext, args: dict[str, Any], _p: ProgressSink | None
    ) -> Answer:
        ref = args["target"]
        names, refused, filters = await self._read_targets(ctx, args)
        # read rules: list_vms is read so that what is hidden can be told and left out (read_args)
        wanted, shaping = read_args(ctx.spec.name, args, any(f is not None for f in filters.values()))
        fn = self._read_fn(ctx.spec, wanted)
        row = {"target": target_label(args), "args": redact_args(ctx.spec, args)}
        hidden: Filtered | None = None
        try:
            if isinstance(ref, str) and ref != ALL:
                target = self.facts.targets[names[0]]
                mirrored = await self.mirrors.answer(target.name, ctx.spec.name, wanted)
                result = mirrored if mirrored is not None else await self.scheduler.run(
                    target.name, fn, deadline=target.timeout_seconds
                )
                if filters[target.name] is not None or shaping.changes:
                    filtered = await self.read_rules.shown(
                        ctx.spec.name, target.name, result, filters[target.name], shaping)
                    hidden, result = (filtered, None) if filtered.answer is None else (None, filtered.answer)
                outcomes = None
            else:
                answered = await self.mirrors.fan_out(
                    [n for n in names if n not in refused],
                    ctx.spec.name,
                    wanted,
                    lambda rest: self.scheduler.fan_out(
                        rest, fn, deadline=self.fanout_timeout
                    ),
                )
                answered = await self.read_rules.fan_out(ctx.spec.name, answered, filters, shaping)
                per_target = {n: refused[n] if n in refused else answered[n] for n in dict.fromkeys(names)}
                outcomes = {
                    n: "ok" if "ok" in r else r.get("error", {}).get("code", "error")
                    for n, r in per_target.items()
                }
                result = await asyncio.to_thread(fan_out_answer, per_target)
        except Busy as exc:  # refused before it reached the target: one row per burst
            await self.gate.refused(ctx, args, exc, target=names[0])
        except GatewayError as exc:
            await self.trail.record(ctx.row("call", outcome="error", error_code=exc.code, **row))
            raise
        if hidden is not None:  # read rules hide the one object this read is about
            await self.gate.refused(ctx, args, denial(ctx.spec.name, names[0], hidden), target=names[0])
        outcome = "ok" if not outcomes or all(v == "ok" for v in outcomes.values()) else "partial"
        done = ctx.row("call", outcome=outcome, outcomes=outcomes, **row)
        return await self.trail.record_answer(done, result)

    def _read_fn(self, spec: ToolSpec, args: Mapping[str, Any]) -> Callable[[VSphereSession], Any]:
        """What a read runs on a target's worker thread: the tool's read, given the target's mirror as a
        name index when the tool takes one (the answer is still read live)."""
        with_lookup, read = spec.read_with_lookup, spec.read
        if with_lookup is not None:
            return lambda s: with_lookup(s, args, self.mirrors.lookup(s.target.name))
        assert read is not None
        return lambda s: read(s, args)

    async def list_targets(
        self, ctx: CallContext, _a: dict[str, Any], _p: ProgressSink | None
    ) -> Answer:
        targets = self.facts.visible_targets(ctx.role)
        lanes = self.scheduler.stats()  # before this call's own reads join the queues
        results = await self.scheduler.fan_out(
            [t.name for t in targets], target_about, deadline=self.fanout_timeout
        )
        rows = summarize_targets(targets, results)
        for row in rows:  # calls waiting for the target's slots in this replica, and calls running
            lane = lanes.get(row["name"], {})
            row["queue_depth"], row["running"] = lane.get("queued", 0), lane.get("running", 0)
        if not sees_target_addresses(ctx.role):
            for row in rows:
                for key in ("host", "address", "port"):
                    row.pop(key, None)
        out = await asyncio.to_thread(Answer.cleaned, {"targets": rows, "count": len(rows)})
        await self.trail.record(ctx.row("call", outcome="ok", result=out))
        return out


def fan_out_answer(results: Mapping[str, Mapping[str, Any]]) -> Answer:
    """A fan-out's answer composed of each target's encoded text: a mirror's answer (an ``Answer``) as it
    is, never decoded; a swept or filtered value, or an error, encoded (and sanitized) here, once.
    Blocking for big values: call it from a worker thread."""
    parts: dict[str, Answer] = {}
    for name, result in results.items():
        ok = result.get("ok")
        parts[name] = Answer.composed({"ok": ok}) if isinstance(ok, Answer) else Answer.cleaned(dict(result))
    return Answer.composed(parts)
