"""Proposal lifecycle moves: the one way a proposal changes state (``Moves.move``).

Also the listeners told after each audited move, the claim, the expiry sweeper, settling claims of dead
processes, recovering rows lost with a process, and the cancellations a token revocation cascades into."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final, NoReturn

from gateway.audit.readers import AuditReader
from gateway.auth.tokens import CallerKey, Principal, caller_fields
from gateway.backends import InstanceLock, Leader
from gateway.errors import AuditUnavailable, ConfirmationInvalid
from gateway.guard.callers import same
from gateway.guard.decision import TokenState
from gateway.guard.policy.model import Decision
from gateway.proposals import FINAL_STATES, OPEN_STATES, Proposal
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.context import GATEWAY_ACTOR, CallContext, off_loop, redact_args
from gateway.server.base.facts import FactsNow
from gateway.store.base import StateStore
from gateway.tools.registry import Registry

log = logging.getLogger(__name__)

LifecycleListener = Callable[[str, Proposal], None]
#: a claim recorded before claims named their process: settled only this long after it was made
EXECUTION_GRACE_SECONDS = 2 * 86400.0
#: the sweeper looks for claims of dead processes this often (seconds)
SETTLE_EVERY: Final = 30


class Moves:
    """Moves proposals along the lifecycle table, each move one audit row, then tells the listeners."""

    def __init__(self, store: StateStore, trail: AuditTrail, registry: Registry, facts: FactsNow, *,
                 instance: InstanceLock, reader: AuditReader, sweep_leader: Leader | None,
                 clock: Callable[[], float], listeners: Sequence[LifecycleListener] = ()) -> None:
        self.store = store
        self.trail = trail
        self.registry = registry
        self.facts = facts
        self.instance = instance
        self.reader = reader
        self.sweep_leader = sweep_leader
        self.clock = clock
        self._listeners: list[LifecycleListener] = list(listeners)
        self._token_generation = -1
        self._sweeper: asyncio.Task[None] | None = None

    def start_sweeper(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever())

    async def stop_sweeper(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    def add_lifecycle_listener(self, fn: LifecycleListener) -> None:
        """Call ``fn(event, proposal)`` after every proposal move, once it is audited: ``proposed``, then the
        new state's name (approved, executing, executed, failed, outcome_unknown, denied, cancelled,
        expired, stale), with the proposal as it is after the move. Called in the thread that made the
        move; it must not block (hand work to a queue). A listener that raises is logged, never fatal."""
        self._listeners.append(fn)

    def settle_interrupted(self, older_than: float = EXECUTION_GRACE_SECONDS) -> list[str]:
        """Settle every proposal left ``executing`` by a process that is gone, as ``outcome_unknown``.

        A claim names the process that made it (``Instance``): a dead one is settled at once, a live
        one (a CLI approval running now) is left alone. A claim recorded without a process (older
        gateways) is settled only ``older_than`` seconds after it was made. Never retried: whether
        vSphere finished the change is unknown, and the audit row says how to find out.
        """
        settled = []
        cutoff = self.clock() - older_than
        for p in self.store.list_proposals(["executing"], limit=1000):
            if p.executor is not None:
                if self.instance.alive(p.executor):
                    continue
            elif (p.decided_at or p.created_at) > cutoff:
                continue
            error = {
                "code": "outcome_unknown",
                "message": "the gateway process running this change stopped before it finished; "
                "check the objects and get_tasks on the target before doing anything again",
            }
            actor = GATEWAY_ACTOR
            moved = self.move_sync(
                p,
                ["executing"],
                "outcome_unknown",
                actor=actor,
                outcome="outcome_unknown",
                error=error,
                reason=f"claimed by process {p.executor or 'unknown'}, which is gone",
            )
            if moved is not None:
                settled.append(p.id)
        return settled

    def recover_outcome_rows(self, limit: int = 1000) -> list[str]:
        """Append the final move's row of every proposal whose row died with a process (it waited in
        memory while the audit could not take it). A proposal counts when the audit (file or PostgreSQL)
        holds rows of it since it was made (its intent, say) but none of the phase it ended in; the row
        is the usual move row with ``recovered: true``, by the caller ``gateway``. Proposals with no row
        in the audit (rotated away) are left alone: nothing says a row is missing. Run at start."""
        candidates = self.store.list_proposals(sorted(FINAL_STATES), limit=limit)
        if not candidates:
            return []
        since = datetime.fromtimestamp(min(p.created_at for p in candidates), UTC)
        try:
            rows = self.reader.rows(since=since)
        except Exception:
            log.exception("cannot read the audit log to recover missing rows of proposal moves")
            return []
        phases: dict[str, set[str]] = {}
        for row in rows:
            pid = row.get("proposal_id")
            if isinstance(pid, str):
                phases.setdefault(pid, set()).add(str(row.get("phase")))
        recovered = []
        actor = GATEWAY_ACTOR
        for p in candidates:
            seen = phases.get(p.id)
            if seen is None or p.state in seen:
                continue
            if p.executor is not None and p.executor != self.instance.id and self.instance.alive(p.executor):
                continue  # a live process that ran it still holds the row and will append it
            row = self.transition_row(
                p,
                p.state,
                actor=actor,
                reason="recovered at start: the row of this move was not in the audit log (it waited "
                "for the log when the process that made the move stopped)",
                outcome=p.outcome,
                error=p.error,
            )
            self.trail.write_or_wait({**row, "recovered": True})
            recovered.append(p.id)
        if recovered:
            log.warning("appended %d audit row(s) of proposal moves missing from the log", len(recovered))
        return recovered

    def expire_due(self) -> None:
        """Move every due open proposal to ``expired`` (each once, whichever process gets there first)."""
        now = self.clock()
        actor = GATEWAY_ACTOR
        for p in self.store.list_proposals(list(OPEN_STATES), limit=1000, due_before=now):
            self.move_sync(
                p,
                OPEN_STATES,
                "expired",
                actor=actor,
                decided_at=now,
                outcome="expired",
                reason="its time ran out",
            )

    def cancel_orphaned(self) -> list[str]:
        """Cancel open proposals whose proposer's token is now revoked or expired (a revocation made by
        a process that could not do it, or an expiry): they could never run anyway."""
        generation = self.store.token_generation()
        if generation == self._token_generation:
            return []
        self._token_generation = generation
        actor = GATEWAY_ACTOR
        cancelled = []
        for p in self.store.list_proposals(list(OPEN_STATES), limit=10_000):
            state = self.facts.owner(p).token
            if state not in (TokenState.REVOKED, TokenState.EXPIRED):
                continue
            reason = f"token {state.value}"
            now = self.clock()
            if self.move_sync(p, OPEN_STATES, "cancelled", actor=actor, decided_at=now, reason=reason):
                cancelled.append(p.id)
        return cancelled

    def cancel_proposals_of(self, caller_key: str, *, by: Principal, reason: str) -> list[str]:
        """Cancel every open proposal of the caller with key text ``caller_key`` (``callers.same``)."""
        cancelled = []
        for p in self.store.list_proposals(list(OPEN_STATES), limit=10_000):
            if (
                same(p.caller_key, caller_key)
                and self.move_sync(
                    p, OPEN_STATES, "cancelled", actor=by, decided_at=self.clock(), reason=reason
                )
                is not None
            ):
                cancelled.append(p.id)
        return cancelled

    def revoke_token(self, name: str, *, by: Principal) -> list[str]:
        """Revoke token ``name`` (refused from its next request on), cancel every open proposal it made
        (each move audited), then audit the revocation. The one path for ``gateway token revoke``.

        Returns the cancelled proposal ids. The revocation stands even if its row cannot be written
        (``AuditUnavailable`` is raised after it): revoking only narrows access."""
        rec = self.store.update_token(name, revoked=True)
        mine = str(CallerKey.token(rec.token_id))
        cancelled = self.cancel_proposals_of(mine, by=by, reason="token revoked")
        self.trail.write_row(
            {
                "phase": "token_revoked",
                **caller_fields(by),
                "kind": by.kind.value,
                "surface": by.surface,
                "token_name": rec.name,
                "token_id": rec.token_id,
                "role": rec.role,
                "cancelled_proposals": cancelled,
            }
        )
        return cancelled

    async def _sweep_forever(self) -> None:
        """Every second: expire due proposals, cancel those of revoked tokens, append waiting audit rows;
        every ``SETTLE_EVERY`` seconds, settle claims of processes that died meanwhile (a CLI approval
        killed while this server runs)."""
        ticks = 0
        while True:
            try:
                leader = self.sweep_leader is None or await asyncio.to_thread(self.sweep_leader.is_leader)
                if leader:  # with replicas on PostgreSQL one of them sweeps for all
                    await asyncio.to_thread(self.expire_due)
                    await asyncio.to_thread(self.cancel_orphaned)
                if self.trail.waiting:
                    await asyncio.to_thread(self.trail.flush_waiting)
                ticks += 1
                if leader and ticks % SETTLE_EVERY == 0:
                    await asyncio.to_thread(self.settle_interrupted)
            except Exception:  # the sweeper must survive a transient store or audit error
                log.exception("the proposal sweeper failed; retrying")
            await asyncio.sleep(1.0)

    async def move(
        self,
        proposal: Proposal,
        from_states: Sequence[str],
        to_state: str,
        *,
        actor: Principal,
        correlation_id: str | None = None,
        reason: str | None = None,
        result_row: Any = None,
        audited: bool = False,
        **fields: Any,
    ) -> Proposal | None:
        """``move_sync`` for the event loop: the compare-and-set in a worker thread with a deadline; the
        row through ``record_outcome`` (never blocks the caller: a row the audit cannot take waits), or
        none when the caller ``audited`` the move itself."""
        shown = _row_only(fields, result_row)
        if not await off_loop(self.store.transition, proposal.id, from_states, to_state, **fields):
            return None
        after, row = self._moved(proposal, to_state, actor, correlation_id, reason, shown, fields)
        if not audited:
            await self.trail.record_outcome(row)
        self.notify(to_state, after)
        return after

    def move_sync(
        self,
        proposal: Proposal,
        from_states: Sequence[str],
        to_state: str,
        *,
        actor: Principal,
        correlation_id: str | None = None,
        reason: str | None = None,
        **fields: Any,
    ) -> Proposal | None:
        """THE way a proposal changes state: the lifecycle edge by the store's compare-and-set (the store
        refuses any move outside the table in gateway/proposals.py), its audit row, then the listeners. None
        if another caller moved it first. A row the audit cannot take now waits in memory (the server
        reports unready) and is appended once it can be. (``move`` is the same for the event loop; the
        ``executing`` claim writes its row first, as the intent: see ``claim``.)"""
        shown = _row_only(fields)
        if not self.store.transition(proposal.id, from_states, to_state, **fields):
            return None
        after, row = self._moved(proposal, to_state, actor, correlation_id, reason, shown, fields)
        self.trail.write_or_wait(row)
        self.notify(to_state, after)
        return after

    def _moved(
        self, proposal: Proposal, to_state: str, actor: Principal, correlation_id: str | None,
        reason: str | None, shown: dict[str, Any], fields: dict[str, Any],
    ) -> tuple[Proposal, dict[str, Any]]:
        """What a move that won its compare-and-set leaves: the proposal after it, and its audit row."""
        after = replace(proposal, state=to_state, **fields)
        row = self.transition_row(proposal, to_state, actor=actor, correlation_id=correlation_id,
                                  reason=reason, **shown, **fields)
        return after, row

    def transition_row(
        self,
        proposal: Proposal,
        to_state: str,
        *,
        actor: Principal,
        correlation_id: str | None = None,
        reason: str | None = None,
        shown: Any = None,
        args: Any = None,
        decision: Any = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """The audit row of one move (``shown``: the result the caller was given, if any)."""
        spec = self.registry.get(proposal.tool)
        row = {
            "phase": to_state,
            "tool": proposal.tool,
            "risk": spec.risk.value if spec else None,
            "target": proposal.target,
            **caller_fields(actor),
            "kind": actor.kind.value,
            "role": actor.role,
            "surface": actor.surface,
            "requested_by": proposal.caller,
            "requested_by_key": proposal.caller_key,
            "proposal_id": proposal.id,
            "correlation_id": correlation_id or proposal.correlation_id,
            "reason": reason,
            "executor": fields.get("executor"),
            "outcome": fields.get("outcome"),
            "error_code": (fields.get("error") or {}).get("code"),
            "args": args,
            "decision": decision,
            "result": shown,
        }
        return {k: v for k, v in row.items() if v is not None}

    async def claim(self, ctx: CallContext, proposal: Proposal, decision: Decision) -> Proposal:
        """Claim the proposal for this process (``executing``) by the store's compare-and-set, THEN write
        the claim's row, the intent, durably before anything reaches vSphere. Of racing confirms only
        the winner writes ``executing``; each loser writes one ``claim_lost`` row and is refused. If
        the intent cannot be written the change is refused and the claimed proposal ends ``failed``
        (nothing was sent to vSphere), its row waiting for the audit like any outcome."""
        instance = await asyncio.to_thread(self.instance.acquire)
        fields: dict[str, Any] = {"decided_at": self.clock(), "executor": instance}
        row = self.transition_row(
            proposal,
            "executing",
            actor=ctx.principal,
            correlation_id=ctx.correlation_id,
            executor=instance,
            args=redact_args(ctx.spec, proposal.args),
            decision=decision.to_dict(),
        )
        if not await off_loop(self.store.transition, proposal.id, ["pending", "approved"], "executing",
                              **fields):
            await self.lost(ctx, proposal, "another caller moved the proposal first; nothing was sent",
                            executor=instance, args=row.get("args"), decision=row.get("decision"))
        claimed = replace(proposal, state="executing", **fields)
        try:
            await self.trail.intent(row)
        except AuditUnavailable as exc:
            await self.move(
                claimed,
                ["executing"],
                "failed",
                actor=ctx.principal,
                correlation_id=ctx.correlation_id,
                outcome=exc.code,
                error=exc.to_wire(),
                reason="the intent row could not be written; nothing was sent to vSphere",
            )
            raise
        self.notify("executing", claimed)
        return claimed

    async def lost(self, ctx: CallContext, proposal: Proposal, reason: str, **fields: Any) -> NoReturn:
        """The one row of an attempt that lost a race for ``proposal`` (``claim_lost``), then its refusal."""
        error = ConfirmationInvalid(f"proposal {proposal.id} was already confirmed, cancelled or expired")
        row = self.transition_row(proposal, "claim_lost", actor=ctx.principal,
                                  correlation_id=ctx.correlation_id, reason=reason, **fields)
        await self.trail.record({**row, "error_code": error.code})
        raise error

    def notify(self, event: str, proposal: Proposal) -> None:
        for listener in list(self._listeners):
            try:
                listener(event, proposal)
            except Exception:
                log.exception("a lifecycle listener failed on %s of proposal %s", event, proposal.id)


def _row_only(fields: dict[str, Any], result_row: Any = None) -> dict[str, Any]:
    """Take out of ``fields`` what only the audit row shows (the decision, the arguments, the result the
    caller was given); the rest is what the store records."""
    shown: dict[str, Any] = {k: fields.pop(k) for k in ("decision", "args") if k in fields}
    if result_row is not None:
        shown["shown"] = result_row
    return shown
