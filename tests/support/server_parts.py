"""The server's parts over plain values, for its unit tests (``tests/server/conftest.py``: ``parts``):
SQLite and the audit file in a temporary home, one configured target (never reached: nothing here talks
to vSphere), permissive rules and the built-in roles."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.answer import Answer
from gateway.audit.query import read_rows
from gateway.auth.roles import RoleBook
from gateway.auth.tokens import Principal
from gateway.backends import Backends, open_backends
from gateway.config import Target
from gateway.errors import GatewayError
from gateway.guard import confirm
from gateway.guard.callers import key_of
from gateway.guard.confirm import args_digest, new_confirmation_token, new_proposal_id, token_hash
from gateway.guard.decision import Entry
from gateway.guard.limits import RateLimiter
from gateway.guard.policy.model import Decision
from gateway.guard.policy.store import PolicyStore
from gateway.proposals import Proposal
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.context import CallContext, ProgressSink
from gateway.server.base.facts import FactsNow
from gateway.server.base.moves import Moves
from gateway.server.call.busy_audit import BusyAudit
from gateway.server.call.gate import Gate
from gateway.server.proposals.actions import ProposalActions
from gateway.server.proposals.approval_steps import ApprovalSteps
from gateway.server.proposals.elicitation import InBand
from gateway.server.proposals.flow import ProposalFlow
from gateway.settings import Settings
from gateway.tools.registry import Registry, build_registry
from gateway.vocabulary import AffectedObject, Kind, Plan
from support.simulator import complete_rules

PERMISSIVE = {"defaults": {"read": "allow", "write": "allow", "destructive": "allow"}}
AGENT = Principal(name="agent-1", role="admin", surface="test")
READER = Principal(name="watcher", role="reader", surface="test")
HUMAN = Principal(name="alice", role="admin", surface="web", kind=Kind.PERSON)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Parts:
    """What the call path's classes are built over, each a real one."""

    tmp: Path
    clock: Clock
    settings: Settings
    backends: Backends
    trail: AuditTrail
    registry: Registry
    targets: dict[str, Target]
    policy: PolicyStore
    roles: RoleBook
    facts: FactsNow

    def rows(self, **filters: Any) -> list[dict[str, Any]]:
        """The audit rows written so far (``gateway.audit.query.read_rows``)."""
        return read_rows(self.tmp / "audit.jsonl", **filters)

    def write_rules(self, rules: Mapping[str, Any]) -> None:
        (self.tmp / "rules.yaml").write_text(yaml.safe_dump(complete_rules(rules)))

    def ctx(self, principal: Principal, tool: str) -> CallContext:
        """The context of a call of ``tool`` by ``principal``, as ``Calls.answer`` makes it."""
        spec = self.registry.get(tool)
        assert spec is not None
        return CallContext(principal, self.facts.party(principal), spec, "corr-1")


@contextmanager
def opened_parts(tmp: Path) -> Iterator[Parts]:
    """The parts over a fresh home ``tmp``; the backends closed at the end."""
    settings = Settings.from_env({"GATEWAY_HOME": str(tmp)})
    backends = open_backends(settings)
    clock = Clock()
    (tmp / "rules.yaml").write_text(yaml.safe_dump(complete_rules(PERMISSIVE)))
    policy = PolicyStore(settings.rules_file)
    roles = RoleBook(settings.roles_file)
    registry = build_registry(destructive=True, read_only=False)
    targets = {"vc1": Target("vc1", "vc1.example.com", "VC1", tags=("lab",))}
    facts = FactsNow(registry, targets, policy, roles, backends.store, clock)
    trail = AuditTrail(backends.audit, settings.audit_log)
    try:
        yield Parts(tmp, clock, settings, backends, trail, registry, targets, policy, roles, facts)
    finally:
        backends.close()


def plan_of(*names: str) -> Plan:
    """A resolved plan over VMs named ``names`` (moids ``vm-1``, ``vm-2``, ...)."""
    affected = tuple(AffectedObject("VirtualMachine", n, f"vm-{i}") for i, n in enumerate(names, 1))
    return Plan(f"delete {', '.join(names)}", affected, {"moids": [a.moid for a in affected]})


def proposal_of(parts: Parts, *, caller: Principal = AGENT, tool: str = "delete_vm", ttl: float = 300.0,
                **fields: Any) -> Proposal:
    """A pending proposal of ``tool`` on vc1 by ``caller``, stored."""
    now = parts.clock()
    args = {"target": "vc1", "vm": "web-1"}
    proposal = Proposal(
        id=new_proposal_id(), token_hash=token_hash(new_confirmation_token()), caller=caller.name,
        role=caller.role, surface=caller.surface, target="vc1", target_host="vc1.example.com", tool=tool,
        args=args, args_digest=args_digest(tool, "vc1", args), plan_summary="delete web-1",
        affected=[{"type": "VirtualMachine", "name": "web-1", "moid": "vm-1"}],
        plan_params={"moids": ["vm-1"]}, created_at=now, expires_at=now + ttl, caller_key=key_of(caller),
        **fields)
    parts.backends.store.add_proposal(proposal)
    return proposal


class StandInExecution:
    """Plans with a canned plan (or fails as told) and records what it is asked to run: vSphere is not
    here."""

    def __init__(self, plan: Plan, plan_fails: GatewayError | None = None) -> None:
        self.plan_value, self.plan_fails = plan, plan_fails
        self.planned: list[Mapping[str, Any]] = []
        self.ran: list[tuple[str, Plan, Decision]] = []
        #: the claimed proposal each run was handed (None: a change that was not a proposal)
        self.claimed: list[Proposal | None] = []

    async def plan(self, target: Target, plan_fn: Any, args: Mapping[str, Any]) -> Plan:
        self.planned.append(args)
        if self.plan_fails is not None:
            raise self.plan_fails
        return self.plan_value

    async def execute(self, ctx: CallContext, target: Target, plan: Plan, decision: Decision,
                      args: Mapping[str, Any], progress: ProgressSink | None,
                      proposal: Proposal | None = None) -> Answer:
        self.ran.append((target.name, plan, decision))
        self.claimed.append(proposal)
        return Answer.of({"state": "done"})


@dataclass
class ProposalParts:
    """The proposal flow and its actions over ``Parts``, running through ``execution``."""

    flow: ProposalFlow
    actions: ProposalActions
    execution: StandInExecution
    gate: Gate
    moves: Moves


def proposal_parts(parts: Parts, execution: StandInExecution) -> ProposalParts:
    b = parts.backends
    gate = Gate(facts=parts.facts, trail=parts.trail, busy=BusyAudit(parts.trail), rate_limiter=RateLimiter(),
                dry_run=False)
    moves = Moves(b.store, parts.trail, parts.registry, parts.facts, instance=b.instance, reader=b.reader,
                  sweep_leader=None, clock=parts.clock)
    approvals = ApprovalSteps(moves=moves, store=b.store, trail=parts.trail, clock=parts.clock)
    actions = ProposalActions(parts.targets, gate=gate, facts=parts.facts, store=b.store, moves=moves,
                              execution=execution,  # type: ignore[arg-type]
                              approvals=approvals, clock=parts.clock)
    flow = ProposalFlow(gate=gate, store=b.store, trail=parts.trail, moves=moves, actions=actions,
                        in_band=InBand(parts.trail), confirm_ttl_seconds=120.0, clock=parts.clock)
    return ProposalParts(flow, actions, execution, gate, moves)


async def propose_delete(parts: Parts, f: ProposalParts, **args: Any) -> dict[str, Any]:
    """``delete_vm`` on web-1 by the agent, decided as ``Writes`` decides it, then proposed."""
    ctx = parts.ctx(AGENT, "delete_vm")
    wanted = {"target": "vc1", "vm": "web-1", **args}
    plan = plan_of(wanted["vm"])
    verdict = await f.gate.authorize_plan(ctx, Entry.WRITE, ctx.party, wanted, parts.targets["vc1"], plan)
    decision = f.gate.decision_of(verdict, parts.targets["vc1"])
    answer = await f.flow.propose(ctx, parts.targets["vc1"], wanted, plan, decision,
                                  confirm.args_digest("delete_vm", "vc1", wanted))
    assert isinstance(answer, dict)
    return answer
