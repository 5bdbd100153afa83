"""``Execution``: a decided change runs after its durable intent row and ends in one outcome row (a claimed
proposal's outcome is its move); a dry run reaches nothing. The target's credentials are not set, so the
scheduler refuses every vSphere call at once: nothing here reaches vSphere."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.server_parts import AGENT, Parts, plan_of, proposal_of

from gateway.errors import ConfigError
from gateway.guard.policy.model import Decision
from gateway.server.base.moves import Moves
from gateway.server.call.execution import Execution
from gateway.vsphere.scheduler import Scheduler

pytestmark = pytest.mark.anyio
ARGS = {"target": "vc1", "vm": "web-1"}
ALLOWED = Decision(True, "allowed by rule-1", "rule-1")
DRY = Decision(True, "allowed by rule-1", "rule-1", dry_run=True)


@pytest.fixture
def moves(parts: Parts) -> Moves:
    b = parts.backends
    return Moves(b.store, parts.trail, parts.registry, parts.facts, instance=b.instance, reader=b.reader,
                 sweep_leader=None, clock=parts.clock)


@pytest.fixture
def execution(parts: Parts, moves: Moves) -> Iterator[Execution]:
    scheduler = Scheduler(list(parts.targets.values()), {}, queue_timeout=5.0)  # no credentials: refused
    try:
        yield Execution(trail=parts.trail, scheduler=scheduler, moves=moves)
    finally:
        scheduler.close()


async def test_a_dry_run_says_what_it_would_do_and_reaches_nothing(parts: Parts,
                                                                     execution: Execution) -> None:
    answer = await execution.execute(parts.ctx(AGENT, "power_off_vm"), parts.targets["vc1"], plan_of("web-1"),
                                     DRY, ARGS, None)
    assert answer.value == {"dry_run": True, "target": "vc1", "would": "delete web-1",
                            "affected": [{"type": "VirtualMachine", "name": "web-1", "moid": "vm-1"}]}
    (row,) = parts.rows()
    assert (row["phase"], row["outcome"], row["decision"]["dry_run"]) == ("dry_run", "ok", True)


async def test_a_dry_run_of_a_claimed_proposal_ends_it_executed(parts: Parts, moves: Moves,
                                                                execution: Execution) -> None:
    ctx = parts.ctx(AGENT, "delete_vm")
    claimed = await moves.claim(ctx, proposal_of(parts), DRY)
    answer = await execution.execute(ctx, parts.targets["vc1"], plan_of("web-1"), DRY, ARGS, None,
                                     proposal=claimed)
    assert (answer.value["state"], answer.value["proposal_id"]) == ("executed", claimed.id)
    stored = parts.backends.store.get_proposal(claimed.id)
    assert stored is not None and stored.state == "executed"


async def test_a_change_writes_its_intent_first_and_its_outcome_after(parts: Parts,
                                                                       execution: Execution) -> None:
    with pytest.raises(ConfigError, match="credentials missing"):
        await execution.execute(parts.ctx(AGENT, "power_off_vm"), parts.targets["vc1"], plan_of("web-1"),
                                ALLOWED, ARGS, None)
    assert [(r["phase"], r.get("error_code")) for r in parts.rows()] == \
        [("executing", None), ("failed", "config_error")]
    assert parts.rows()[0]["args"] == ARGS


async def test_a_claimed_proposal_that_fails_ends_failed_by_its_move(parts: Parts, moves: Moves,
                                                                      execution: Execution) -> None:
    ctx = parts.ctx(AGENT, "delete_vm")
    claimed = await moves.claim(ctx, proposal_of(parts), ALLOWED)
    with pytest.raises(ConfigError):
        await execution.execute(ctx, parts.targets["vc1"], plan_of("web-1"), ALLOWED, ARGS, None,
                                proposal=claimed)
    assert [r["phase"] for r in parts.rows()] == ["executing", "failed"], "the claim's row is the intent"
    stored = parts.backends.store.get_proposal(claimed.id)
    assert stored is not None and (stored.state, stored.outcome) == ("failed", "config_error")


async def test_planning_goes_through_the_scheduler(parts: Parts, execution: Execution) -> None:
    with pytest.raises(ConfigError, match="credentials missing"):
        await execution.plan(parts.targets["vc1"], lambda _session, _args: plan_of("web-1"), ARGS)
