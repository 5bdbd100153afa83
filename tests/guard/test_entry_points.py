"""Every entry point reaches the verdict of the one decision function.

The table below enumerates role x tool x target x policy x entry point; for each case the expected
verdict is ``authorize`` on facts written out by hand here (plain values), and the actual one is what
the real gateway does over a real simulator, real store and real rules file: a call (read, write,
destructive proposal, bulk proposal), ``confirm_action``, ``cancel_action``, a human's approve and
deny. The gateway runs with ``dry_run`` so an allowed confirm or approval changes nothing. The web page's
approve, deny and Audit tab are driven over HTTPS (tests/support/webserver.py); ``gateway pending list``,
``approve`` and ``deny`` through the CLI's ``main``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from argon2 import PasswordHasher
from support.simulator import Simulator, complete_rules_text, write_targets
from support.webserver import PEOPLE, PERSONS, RULES_YAML, decide, propose_delete, sign_in, web_server
from support.webserver import ROLES_YAML as WEB_ROLES_YAML

from gateway.auth.local import os_person
from gateway.auth.tokens import Principal, create_token
from gateway.cli import main
from gateway.errors import GatewayError
from gateway.guard.decision import (
    Entry,
    Facts,
    Party,
    Proposed,
    TokenState,
    Verdict,
    audit_view,
    authorize,
    may_read_audit_row,
    proposal_rights,
    sees_target_addresses,
)
from gateway.guard.policy.parse import parse_policy_text
from gateway.role import BUILTIN_ROLES, Role
from gateway.server.runtime import Gateway
from gateway.settings import Settings
from gateway.vocabulary import Category, Kind, Risk

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


@dataclass
class Rig:
    gw: Gateway
    home: Path
    serial: int = 0
    #: the rules in force ("broken": none, so every call the policy decides is refused)
    in_force: str = "builtin"
    #: the environment the gateway's settings were read from (credentials), for the CLI
    env: dict[str, str] = field(default_factory=dict)

    def rules(self, name: str) -> None:
        (self.home / "rules.yaml").write_text(complete_rules_text(POLICIES[name]))
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
    yield Rig(gw, tmp_path, env=env)
    await gw.close()


def role_of(name: str, roles: dict[str, dict[str, Any]] = ROLES) -> Role:
    """The role ``name`` from plain values: a built-in one, else its entry in ``roles`` (roles.yaml)."""
    role = BUILTIN_ROLES.get(name)
    if role is not None:
        return role
    spec = roles[name]
    tools = spec["tools"] if isinstance(spec["tools"], str) else frozenset(spec["tools"])
    targets = spec["targets"] if spec["targets"] == "*" else tuple(spec["targets"])
    return Role(
        name,
        tools,
        frozenset(spec["allow_write"]),
        frozenset(spec["allow_destructive"]),
        targets,
        spec["approve"],
        spec.get("audit", "none"),
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
    broken = policy == "broken"  # a broken file, at start or by an edit: no rules in force
    rules = None if broken else parse_policy_text(POLICIES.get(policy, ""), "rules.yaml")
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
            rules_error="rules.yaml is unusable" if broken else None,
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
        got = await outcome(rig.gw.calls.call(who, tool, args))
        want = expected(
            Entry.READ if TOOLS[tool][0] is Category.READ else Entry.WRITE,
            role,
            tool,
            target,
            rig.in_force,
            changes=rig.gw.facts.change_tools,
        )
        if got != want.code:
            mismatches.append((role, tool, target, policy, got, want.code, want.reason))
    assert mismatches == []


@pytest.mark.parametrize("tool", ["power_off_vm", "delete_vm", "bulk_vm_action"])
async def test_a_change_is_decided_once_at_the_gate_and_once_with_its_objects(
    rig: Rig, tool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order call -> each object as the tool it reaches -> preconditions lives in the decision
    module: the I/O classes ask ``authorize`` once before anything is read from vSphere and
    ``authorize_resolved`` once with the resolved objects (a bulk call's many objects included), never
    a third, partial time of their own."""
    import gateway.server.call.gate as gate

    asked: list[str] = []

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            asked.append(name)
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(gate, "authorize", counted("gate", gate.authorize))
    monkeypatch.setattr(gate, "authorize_resolved", counted("resolved", gate.authorize_resolved))
    rig.rules("permissive")
    assert await outcome(rig.gw.calls.call(rig.token("admin"), tool,
                                           {"target": "vc1", **TOOLS[tool][2]})) is None
    assert asked == ["gate", "resolved"], asked


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
        made = await rig.gw.calls.call(who, tool, {"target": "vc1", **TOOLS[tool][2]})
        rig.gw.store.update_token(who.name, role=role)  # `gateway token set-role`
        rig.rules(policy)
        now = Principal(name=who.name, role=role, token_id=who.token_id, surface="https")
        alice = Principal(name="alice", role="admin", surface="web")
        if entry is Entry.CONFIRM:
            act = rig.gw.calls.call(now, "confirm_action", {"token": made["token"]})
        elif entry is Entry.CANCEL:
            act = rig.gw.calls.call(now, "cancel_action", {"token": made["token"]})
        elif entry is Entry.APPROVE:
            act = rig.gw.actions.approve(made["proposal_id"], alice)
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
            changes=rig.gw.facts.change_tools,
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
                    change_tools=rig.gw.facts.change_tools,
                    resolved=False,
                )
            )
            want = gate if not gate.allowed else want
        if got != want.code:
            mismatches.append((role, tool, policy, entry.value, got, want.code, want.reason))
    assert mismatches == []


async def _deny(gw: Gateway, proposal_id: str, human: Principal) -> None:
    await gw.actions.deny(proposal_id, human)


async def test_every_deny_attempt_is_one_audit_row_even_when_it_loses_the_move(rig: Rig) -> None:
    """Humans deny one proposal at the same moment: one wins the move; every other attempt is refused,
    and each attempt (won, refused by the decision, or lost to another's move) writes exactly one row."""
    rig.rules("permissive")
    who = rig.token("admin")
    made = await rig.gw.calls.call(who, "delete_vm", {"target": "vc1", **TOOLS["delete_vm"][2]})
    humans = [Principal(name=f"human{i}", role="admin", surface="web", kind=Kind.PERSON) for i in range(6)]
    got = await asyncio.gather(*(outcome(_deny(rig.gw, made["proposal_id"], h)) for h in humans))
    assert sorted(got, key=str) == [None] + ["confirmation_invalid"] * (len(humans) - 1)
    rows = [r for r in rig.gw.backends.reader.rows() if r.get("proposal_id") == made["proposal_id"]]
    per_human = {h.name: [r["phase"] for r in rows if r.get("caller") == h.name] for h in humans}
    assert all(len(phases) == 1 for phases in per_human.values()), per_human


def _gate(role: str, tool: str, changes: tuple[tuple[str, Category], ...]) -> Verdict:
    """The decision's gate on a tool the gateway answers itself (``Entry.LOCAL``), from plain values."""
    viewer = Party("viewer", TokenState.USABLE, role_of(role))
    return authorize(Facts(entry=Entry.LOCAL, actor=viewer, tool=tool, category=Category.READ, risk=Risk.LOW,
                           now=datetime.now(UTC), change_tools=changes, resolved=False))


async def test_every_listing_and_the_cli_reach_the_decisions_verdict(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Who sees which proposal (MCP ``list_pending_actions``, ``gateway pending list``), who sees the
    targets' addresses (``list_targets``) and a denial from the shell (``gateway pending deny``): each
    what the decision module says on plain values."""
    rig.rules("permissive")
    proposers = {role: rig.token(role) for role in ("admin", "deleter")}
    made = {role: await rig.gw.calls.call(who, "delete_vm", {"target": "vc1", **TOOLS["delete_vm"][2]})
            for role, who in proposers.items()}

    def seen_by(party: Party) -> list[str]:
        return sorted(m["proposal_id"] for role, m in made.items()
                      if proposal_rights(party, Proposed(proposers[role].name, "vc1", m["proposal_id"])).see)

    mismatches: list[tuple[str, str, Any, Any]] = []
    viewers = [(role, rig.token(role)) for role in ("admin", "reader", "deleter", "bulker", "lab")]
    for role, viewer in [*viewers, *proposers.items()]:
        party = Party(viewer.name, TokenState.USABLE, role_of(role))
        gate = _gate(role, "list_pending_actions", rig.gw.facts.change_tools)
        want: Any = seen_by(party) if gate.allowed else gate.code
        try:
            got: Any = sorted(p["proposal_id"] for p in
                              (await rig.gw.calls.call(viewer, "list_pending_actions", {}))["pending"])
        except GatewayError as exc:
            got = exc.code
        if got != want:
            mismatches.append((role, "list_pending_actions", got, want))
        rows = (await rig.gw.calls.call(viewer, "list_targets", {}))["targets"]
        shows = [any(k in row for k in ("host", "address", "port")) for row in rows]
        if shows != [sees_target_addresses(role_of(role))] * len(rows):
            mismatches.append((role, "list_targets", shows, sees_target_addresses(role_of(role))))
    for name, value in rig.env.items():
        monkeypatch.setenv(name, value)
    person = os_person()
    shell = Party(person.name, TokenState.USABLE, role_of(person.role), person.kind)
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["pending", "list", "--json", "--home", str(rig.home)]) == 0
    listed = sorted(json.loads(line)["proposal_id"] for line in capsys.readouterr().out.splitlines())
    if listed != seen_by(shell):
        mismatches.append(("os", "pending list", listed, seen_by(shell)))
    category, risk, _args, _reaches = TOOLS["delete_vm"]
    owner = Party(proposers["deleter"].name, TokenState.USABLE, role_of("deleter"))
    want_deny = authorize(Facts(entry=Entry.DENY, actor=shell, tool="delete_vm", category=category, risk=risk,
                                now=datetime.now(UTC), target="vc1", target_known=True, owner=owner,
                                change_tools=rig.gw.facts.change_tools))
    denied = await asyncio.to_thread(main, ["pending", "deny", made["deleter"]["proposal_id"], "--home",
                                            str(rig.home)])
    if (denied == 0) != want_deny.allowed:
        mismatches.append(("os", "pending deny", denied, want_deny.to_dict()))
    # `gateway pending approve`: the admin's new proposal, and the deleter's after its token lost delete_vm
    fresh = {role: await rig.gw.calls.call(who, "delete_vm", {"target": "vc1", **TOOLS["delete_vm"][2]})
             for role, who in proposers.items()}
    rig.gw.store.update_token(proposers["deleter"].name, role="reader")  # `gateway token set-role`
    monkeypatch.setenv("GATEWAY_ENABLE_DESTRUCTIVE", "true")  # the shell serves delete_vm as the rig does,
    monkeypatch.setenv("GATEWAY_DRY_RUN", "true")  # and changes nothing
    permissive = parse_policy_text(POLICIES["permissive"], "rules.yaml")
    for role, role_now in (("admin", "admin"), ("deleter", "reader")):
        owner = Party(proposers[role].name, TokenState.USABLE, role_of(role_now))
        want_approve = authorize(Facts(entry=Entry.APPROVE, actor=shell, tool="delete_vm", category=category,
                                       risk=risk, now=datetime.now(UTC), target="vc1", target_known=True,
                                       owner=owner, rules=permissive,
                                       change_tools=rig.gw.facts.change_tools))
        approved = await asyncio.to_thread(main, ["pending", "approve", fresh[role]["proposal_id"], "--home",
                                                  str(rig.home)])
        if (approved == 0) != want_approve.allowed:
            mismatches.append(("os", f"pending approve ({role} -> {role_now})", approved,
                               want_approve.to_dict()))
    assert mismatches == []


WEB_ROLES: dict[str, dict[str, Any]] = yaml.safe_load(WEB_ROLES_YAML)["roles"]
#: the page's viewers (people, tests/support/webserver.py): admin, reader, lead (approve: others,
#: audit: none), lab-approver (lab-* only, audit: all)
VIEWERS = sorted(PERSONS)
WEB_VM = "DC0_C0_RP0_VM0"


def _web_party(name: str) -> Party:
    return Party(name, TokenState.USABLE, role_of(PEOPLE[name], WEB_ROLES),
                 Kind.PERSON if name in PERSONS else Kind.AGENT)


async def _page_code(response: Any) -> str | None:
    if response.status_code == 200:
        return None
    code: str = response.json()["error"]["code"]
    return code


async def test_the_pages_approve_deny_and_audit_tab_reach_the_decisions_verdict(
    vcsim_bin: Path, tmp_path: Path
) -> None:
    """The page over HTTPS (tests/support/webserver.py, dry run): each person approves or denies a fresh
    proposal (an agent's or olga's, on a gated prod target or a lab one), then opens the Audit tab. Each
    answer is what ``authorize`` (Entry.APPROVE / Entry.DENY), ``audit_view`` and ``may_read_audit_row``
    say on plain values."""
    rules = parse_policy_text(RULES_YAML, "rules.yaml")
    category, risk, _args, _reaches = TOOLS["delete_vm"]
    mismatches: list[tuple[Any, ...]] = []
    with web_server(tmp_path, vcsim_bin, dry_run=True) as served:
        clients = {name: served.http() for name in VIEWERS}
        try:
            csrf = {name: await sign_in(client, served, name) for name, client in clients.items()}
            for viewer, proposer, target, action in itertools.product(
                VIEWERS, ("agent", "olga"), ("prod-vc", "lab-vc"), ("approve", "deny")
            ):
                made = await propose_delete(served, proposer, target, WEB_VM)
                entry = Entry.APPROVE if action == "approve" else Entry.DENY
                want = authorize(Facts(entry=entry, actor=_web_party(viewer), tool="delete_vm",
                                       category=category, risk=risk, now=datetime.now(UTC), target=target,
                                       target_known=True, owner=_web_party(proposer), rules=rules,
                                       change_tools=served.gateway.facts.change_tools))
                got = await _page_code(await decide(clients[viewer], served, csrf[viewer],
                                                    made["proposal_id"], action))
                if got != want.code:
                    mismatches.append((viewer, proposer, target, action, got, want.code, want.reason))
            for viewer in VIEWERS:
                role = role_of(PEOPLE[viewer], WEB_ROLES)
                rows = served.audit_rows()
                assert len(rows) < 500, "the tab's 500-row tail must cover the whole log for this table"
                gate = audit_view(role)
                want_rows: Any = ([r for r in rows if may_read_audit_row(role, viewer, r)] if gate.allowed
                                  else gate.code)
                response = await clients[viewer].get("/ui/api/audit", params={"last": 500})
                got_rows: Any = response.json()["rows"] if response.status_code == 200 else \
                    await _page_code(response)
                if got_rows != want_rows:
                    mismatches.append((viewer, "audit tab", _keys(got_rows), _keys(want_rows)))
        finally:
            for client in clients.values():
                await client.aclose()
    assert mismatches == []


def _keys(rows: Any) -> Any:
    """Rows as (phase, caller, target), short enough to read in a failure."""
    if not isinstance(rows, list):
        return rows
    return [(r.get("phase"), r.get("caller"), r.get("target")) for r in rows]
