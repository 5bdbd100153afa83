"""Every entry point reaches the verdict of the one decision function.

The table below enumerates role x tool x target x policy x entry point; for each case the expected
verdict is ``authorize`` on facts written out by hand here (plain values), and the actual one is what
the real gateway does over a real simulator, real store and real rules file: a call (read, write,
destructive proposal, bulk proposal), ``confirm_action``, ``cancel_action``, a human's approve and
deny. The gateway runs with ``dry_run`` so an allowed confirm or approval changes nothing.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from argon2 import PasswordHasher
from simulator import Simulator, complete_rules_text, write_targets

from gateway.auth.tokens import Principal, create_token
from gateway.errors import GatewayError
from gateway.guard.decision import Entry, Facts, Party, TokenState, Verdict, authorize
from gateway.guard.policy.parse import parse_policy_text
from gateway.role import BUILTIN_ROLES, Role
from gateway.server.pipeline import Gateway
from gateway.settings import Settings
from gateway.vocabulary import Category, Risk

pytestmark = pytest.mark.anyio
FAST = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
VM0 = "DC0_C0_RP0_VM0"
UNLIMITED = "max_calls_per_minute: {read: null, write: null, destructive: null}"
POLICIES = {
    "permissive": f"defaults: {{read: allow, write: allow, destructive: allow, {UNLIMITED}}}\n",
    "strict": f"defaults: {{read: allow, write: deny, destructive: deny, {UNLIMITED}}}\n",
    "gated": f"defaults: {{destructive: allow, require_web_approval: true, {UNLIMITED}}}\n",
    "no-reads": f"defaults: {{read: deny, destructive: allow, {UNLIMITED}}}\n",
    "broken": "defaults: [not, a, mapping\n",
}
ROLES: dict[str, dict[str, Any]] = {
    "deleter": {
        "tools": "read",
        "allow_write": ["power_off_vm"],
        "allow_destructive": ["delete_vm"],
        "targets": "*",
        "approve": "none",
    },
    "bulker": {
        "tools": "read",
        "allow_write": [],
        "allow_destructive": ["bulk_vm_action"],
        "targets": "*",
        "approve": "none",
    },
    "lab": {
        "tools": "*",
        "allow_write": [],
        "allow_destructive": [],
        "targets": ["lab-*"],
        "approve": "none",
    },
}
# tool -> (category, risk, arguments without target, tools it reaches)
TOOLS: dict[str, tuple[Category, Risk, dict[str, Any], tuple[tuple[str, Category], ...]]] = {
    "list_vms": (Category.READ, Risk.LOW, {}, ()),
    "power_off_vm": (Category.WRITE, Risk.HIGH, {"vm": VM0, "guest_timeout_seconds": 0}, ()),
    "delete_vm": (Category.DESTRUCTIVE, Risk.CRITICAL, {"vm": VM0, "force_power_off": True}, ()),
    "bulk_vm_action": (
        Category.DESTRUCTIVE,
        Risk.CRITICAL,
        {"action": "delete_vm", "name_regex": VM0, "force_power_off": True},
        (("delete_vm", Category.DESTRUCTIVE),),
    ),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Rig:
    gw: Gateway
    home: Path
    serial: int = 0
    #: the rules in force: a broken file keeps the last good ones (gateway.guard.policy.store)
    in_force: str = "builtin"

    def rules(self, name: str) -> None:
        (self.home / "rules.yaml").write_text(complete_rules_text(POLICIES[name]))
        if name != "broken":
            self.in_force = name

    def token(self, role: str) -> Principal:
        self.serial += 1
        _, rec = create_token(
            self.gw.store, f"t{self.serial}", role, expires_in=None, now=self.gw.clock(), hasher=FAST
        )
        return Principal(name=rec.name, role=rec.role, token_id=rec.token_id, surface="https")


@pytest.fixture
async def rig(tmp_path: Path, sim_vc1: Simulator) -> AsyncIterator[Rig]:
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim_vc1}, {"vc1": {}})
    (tmp_path / "roles.yaml").write_text(yaml.safe_dump({"roles": ROLES}))
    os.chmod(tmp_path / "roles.yaml", 0o600)
    base = Settings.from_env({"GATEWAY_HOME": str(tmp_path), **env})
    gw = Gateway.build(Settings(**{**base.__dict__, "enable_destructive": True, "dry_run": True}))
    yield Rig(gw, tmp_path)
    await gw.close()


def role_of(name: str) -> Role:
    role = BUILTIN_ROLES.get(name)
    if role is not None:
        return role
    spec = ROLES[name]
    tools = spec["tools"] if isinstance(spec["tools"], str) else frozenset(spec["tools"])
    targets = spec["targets"] if spec["targets"] == "*" else tuple(spec["targets"])
    return Role(
        name,
        tools,
        frozenset(spec["allow_write"]),
        frozenset(spec["allow_destructive"]),
        targets,
        spec["approve"],
    )


def expected(
    entry: Entry,
    role: str,
    tool: str,
    target: str,
    policy: str,
    *,
    actor: str = "agent",
    approver: Role | None = None,
    changes: tuple[tuple[str, Category], ...] = (),
) -> Verdict:
    category, risk, _, reaches = TOOLS[tool]
    assert policy != "broken", "pass the rules in force (Rig.in_force)"
    rules = parse_policy_text(POLICIES.get(policy, ""), "rules.yaml")
    owner = Party("agent", TokenState.USABLE, role_of(role))
    acting = owner if approver is None else Party(actor, TokenState.USABLE, approver)
    return authorize(
        Facts(
            entry=entry,
            actor=acting,
            tool=tool,
            category=category,
            risk=risk,
            now=datetime.now(UTC),
            target=target,
            target_known=target == "vc1",
            reaches=reaches,
            rules=rules,
            owner=owner if entry in (Entry.CONFIRM, Entry.CANCEL, Entry.APPROVE, Entry.DENY) else None,
            change_tools=changes,
        )
    )


async def outcome(coro: Any) -> str | None:
    try:
        await coro
    except GatewayError as exc:
        return exc.code
    return None


CALLS = list(
    itertools.product(["admin", "reader", "deleter", "bulker", "lab"], TOOLS, ["vc1", "lab-x"], POLICIES)
)


async def test_every_call_reaches_the_decisions_verdict(rig: Rig) -> None:
    mismatches = []
    for role, tool, target, policy in CALLS:
        rig.rules(policy)
        who = rig.token(role)
        args = {"target": target, **TOOLS[tool][2]}
        got = await outcome(rig.gw.call(who, tool, args))
        want = expected(
            Entry.READ if TOOLS[tool][0] is Category.READ else Entry.WRITE,
            role,
            tool,
            target,
            rig.in_force,
            changes=rig.gw.change_tools,
        )
        if got != want.code:
            mismatches.append((role, tool, target, policy, got, want.code, want.reason))
    assert mismatches == []


PROPOSALS = list(
    itertools.product(
        ["admin", "reader", "deleter", "bulker"],
        ["delete_vm", "bulk_vm_action"],
        ["permissive", "strict", "gated", "broken"],
    )
)


async def test_every_proposal_entry_point_reaches_the_decisions_verdict(rig: Rig) -> None:
    """A proposal made under permissive rules by an admin token; then the token's role and the rules
    change, and each entry point acts on it: the proposer's confirm and cancel, a human's approve, deny."""
    human = BUILTIN_ROLES["admin"]
    mismatches = []
    for (role, tool, policy), entry in itertools.product(
        PROPOSALS, [Entry.CONFIRM, Entry.CANCEL, Entry.APPROVE, Entry.DENY]
    ):
        rig.rules("permissive")
        who = rig.token("admin")
        made = await rig.gw.call(who, tool, {"target": "vc1", **TOOLS[tool][2]})
        rig.gw.store.update_token(who.name, role=role)  # `gateway token set-role`
        rig.rules(policy)
        now = Principal(name=who.name, role=role, token_id=who.token_id, surface="https")
        alice = Principal(name="alice", role="admin", surface="web")
        if entry is Entry.CONFIRM:
            act = rig.gw.call(now, "confirm_action", {"token": made["token"]})
        elif entry is Entry.CANCEL:
            act = rig.gw.call(now, "cancel_action", {"token": made["token"]})
        elif entry is Entry.APPROVE:
            act = rig.gw.approve(made["proposal_id"], alice)
        else:
            act = _deny(rig.gw, made["proposal_id"], alice)
        got = await outcome(act)
        human_acts = entry in (Entry.APPROVE, Entry.DENY)
        want = expected(
            entry,
            role,
            tool,
            "vc1",
            rig.in_force,
            actor="alice" if human_acts else "agent",
            approver=human if human_acts else None,
            changes=rig.gw.change_tools,
        )
        if entry in (Entry.CONFIRM, Entry.CANCEL):
            # first the gate of the tool itself: the caller must hold confirm_action / cancel_action
            verb = rig.gw.registry.get("confirm_action" if entry is Entry.CONFIRM else "cancel_action")
            assert verb is not None
            gate = authorize(
                Facts(
                    entry=Entry.LOCAL,
                    actor=Party("agent", TokenState.USABLE, role_of(role)),
                    tool=verb.name,
                    category=verb.kind,
                    risk=verb.risk,
                    now=datetime.now(UTC),
                    change_tools=rig.gw.change_tools,
                    resolved=False,
                )
            )
            want = gate if not gate.allowed else want
        if got != want.code:
            mismatches.append((role, tool, policy, entry.value, got, want.code, want.reason))
    assert mismatches == []


async def _deny(gw: Gateway, proposal_id: str, human: Principal) -> None:
    gw.deny(proposal_id, human)
