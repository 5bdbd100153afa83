"""Fair-queue shares keyed on who calls, not on a name: ``share_of`` (a table of plain principals),
roles.yaml's ``fair_share`` (per role and the file's default), and ten agents acting for one person
against one other caller, on the scheduler over a simulator and through the gateway's pipeline.

Nothing here asserts on elapsed time: the queue tests compare the order in which calls were served.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.gateway_env import Env
from support.simulator import MakeSimulator, credentials_env, sim_target

from gateway.auth.fair_share import queue_for, share_of
from gateway.auth.principal import CallerKey, Principal
from gateway.auth.roles import RoleBook, load_role_file, load_roles
from gateway.config import ConfigProblems
from gateway.role import BUILTIN_ROLES, FairShare, Role
from gateway.vocabulary import Kind
from gateway.vsphere.pool import VSphereSession
from gateway.vsphere.scheduler import Scheduler

ISSUER = "https://idp.example"
ALICE = CallerKey.person(ISSUER, "alice-sub")
BY_CALLER = Role("ops", tools="read", fair_share="caller")
BY_PERSON = Role("ops", tools="read", fair_share="person")


def token_caller(name: str, token_id: str, kind: Kind = Kind.AGENT) -> Principal:
    return Principal(name=name, role="ops", token_id=token_id, surface="test", kind=kind)


def alices_agent(client_id: str, name: str | None = None) -> Principal:
    """An IdP client acting for Alice (shown as ``name``, ``alice/<client>`` unless given)."""
    return Principal(name=name or f"alice/{client_id}", role="ops", surface="test", kind=Kind.AGENT,
                     key=CallerKey.client(ISSUER, client_id, for_subject="alice-sub"), acting_for="alice",
                     acting_for_key=ALICE)


ALICE_HERSELF = Principal(name="alice@example.com", role="ops", surface="web", kind=Kind.PERSON, key=ALICE)
IDP_CLIENT = Principal(name="idadmin", role="ops", surface="test", key=CallerKey.client(ISSUER, "idadmin"))

SHARES: list[tuple[str, Principal, Role | None, str]] = [
    ("token caller", token_caller("idadmin", "tok1"), BY_CALLER, "token::tok1"),
    ("token caller, person mode, acting for nobody", token_caller("idadmin", "tok1"), BY_PERSON,
     "token::tok1"),
    ("IdP client named like the token", IDP_CLIENT, BY_CALLER, "client:https%3A%2F%2Fidp.example:idadmin"),
    ("IdP client, person mode, acting for nobody", IDP_CLIENT, BY_PERSON,
     "client:https%3A%2F%2Fidp.example:idadmin"),
    ("agent 1 for alice, caller mode", alices_agent("agent-1"), BY_CALLER,
     "client:https%3A%2F%2Fidp.example:agent-1:alice-sub"),
    ("agent 2 for alice, caller mode", alices_agent("agent-2"), BY_CALLER,
     "client:https%3A%2F%2Fidp.example:agent-2:alice-sub"),
    ("agent 1 for alice, person mode", alices_agent("agent-1"), BY_PERSON,
     "person:https%3A%2F%2Fidp.example:alice-sub"),
    ("agent 2 for alice, person mode", alices_agent("agent-2"), BY_PERSON,
     "person:https%3A%2F%2Fidp.example:alice-sub"),
    ("agent named like another, person mode", alices_agent("agent-3", name="bob"), BY_PERSON,
     "person:https%3A%2F%2Fidp.example:alice-sub"),
    ("alice herself", ALICE_HERSELF, BY_CALLER, "person:https%3A%2F%2Fidp.example:alice-sub"),
    ("alice herself, person mode", ALICE_HERSELF, BY_PERSON, "person:https%3A%2F%2Fidp.example:alice-sub"),
    ("local person token", token_caller("idperson", "tok2", Kind.PERSON), BY_PERSON, "token::tok2"),
    ("the gateway's own caller", Principal(name="os:root", role="admin", surface="cli"), None,
     "system::os%3Aroot"),
    ("no role in force, acting for alice", alices_agent("agent-1"), None,
     "client:https%3A%2F%2Fidp.example:agent-1:alice-sub"),
]


@pytest.mark.parametrize(("principal", "role", "share"), [case[1:] for case in SHARES],
                         ids=[case[0] for case in SHARES])
def test_share_of(principal: Principal, role: Role | None, share: str) -> None:
    assert share_of(principal, role) == share


def test_a_share_is_never_the_display_name() -> None:
    same_name = [token_caller("idadmin", "tok1"), IDP_CLIENT, Principal(name="idadmin", role="ops")]
    assert len({share_of(p, BY_PERSON) for p in same_name}) == 3
    assert all(share_of(p, BY_PERSON) != "idadmin" for p in same_name)


# -- roles.yaml: fair_share -----------------------------------------------------------------------

ROLE = ("    tools: read\n    allow_write: []\n    allow_destructive: []\n    targets: \"*\"\n"
        "    approve: none\n")


def roles_file(head: str = "", ops: str = "", other: str = "") -> bytes:
    return (f"{head}roles:\n  ops:\n{ROLE}{ops}  other:\n{ROLE}{other}").encode()


@pytest.mark.parametrize(("text", "ops", "other"), [
    (roles_file(), "caller", "caller"),
    (roles_file(ops="    fair_share: person\n"), "person", "caller"),
    (roles_file("fair_share: person\n"), "person", "person"),
    (roles_file("fair_share: person\n", other="    fair_share: caller\n"), "person", "caller"),
    (roles_file("fair_share: caller\n", ops="    fair_share: person\n"), "person", "caller"),
])
def test_fair_share_per_role_and_the_files_default(text: bytes, ops: FairShare, other: FairShare) -> None:
    roles = load_roles(text, "roles.yaml")
    assert (roles["ops"].fair_share, roles["other"].fair_share) == (ops, other)


def test_the_files_default_applies_to_the_built_in_roles(tmp_path: Path) -> None:
    path = tmp_path / "roles.yaml"
    path.write_bytes(b"fair_share: person\n")
    os.chmod(path, 0o600)
    book = RoleBook(path)
    admin, reader = book.get("admin"), book.get("reader")
    assert admin is not None and reader is not None
    assert (admin.fair_share, reader.fair_share) == ("person", "person")
    assert admin.approve == "any" and reader.tools == "read"  # nothing else changes
    assert load_role_file(b"fair_share: person\n", "roles.yaml").roles == {}
    path.write_bytes(b"roles:\n")  # the default gone: the built-ins as built
    assert book.get("admin") is BUILTIN_ROLES["admin"]


@pytest.mark.parametrize(("text", "problem"), [
    (roles_file(ops="    fair_share: persons\n"),
     "roles.yaml:8:5: role 'ops': 'fair_share' must be one of caller, person; did you mean 'person'?"),
    (roles_file(ops="    fair_share: true\n"), "roles.yaml:8:5: role 'ops': 'fair_share' must be one of"),
    (roles_file(ops="    fairshare: person\n"),
     "roles.yaml:8:5: role 'ops': unknown key 'fairshare'; did you mean 'fair_share'?"),
    (roles_file("fair_share: callers\n"),
     "roles.yaml:1:1: 'fair_share' (the default of every role) must be one of caller, person; did you mean "
     "'caller'?"),
    (roles_file("fair_share: [person]\n"), "roles.yaml:1:1: 'fair_share' (the default of every role)"),
    (roles_file("fairshare: person\n"),
     "roles.yaml:1:1: unknown top-level key 'fairshare'; did you mean 'fair_share'?"),
])
def test_a_wrong_fair_share_is_refused_with_its_place_and_the_right_word(text: bytes, problem: str) -> None:
    with pytest.raises(ConfigProblems) as info:
        load_roles(text, "roles.yaml")
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


# -- ten agents acting for one person against one other caller --------------------------------------

AGENTS = [alices_agent(f"agent-{n}") for n in range(10)]
VICTIM = token_caller("bob", "tok-bob")
BLOCKER = token_caller("blocker", "tok-blocker")


@pytest.mark.parametrize(("mode", "victim_served_at"), [
    ("person", [1, 3]),  # one share for the ten: bob and alice's agents take turns
    ("caller", [10, 21]),  # ten shares: bob waits for every agent each turn
])
def test_ten_agents_acting_for_one_person_share_one_turn_on_the_scheduler(
        make_simulator: MakeSimulator, mode: FairShare, victim_served_at: list[int]) -> None:
    """One slot, held by a blocker until every call below waits; then ten agents acting for Alice queue
    two calls each, and Bob two: the order the calls are served in."""
    sim = make_simulator()
    scheduler = Scheduler([sim_target("vc", sim, pool_size=1, max_queued_per_caller=64)],
                          credentials_env({"vc": sim}))
    role = Role("ops", tools="read", fair_share=mode)
    held, release, served = threading.Event(), threading.Event(), []

    def call(label: str) -> Callable[[VSphereSession], Any]:
        def fn(session: VSphereSession) -> Any:
            if label == "blocker":
                held.set()
                assert release.wait(30)
            served.append(label)
            return session.si.CurrentTime()
        return fn

    def queued(principal: Principal, label: str) -> asyncio.Task[Any]:
        with queue_for(principal, role):  # the task takes the context it is created in
            return asyncio.create_task(scheduler.run("vc", call(label)))

    async def main() -> None:
        await scheduler.run("vc", lambda session: session.si.CurrentTime())  # logged in: the slot is warm
        blocker = queued(BLOCKER, "blocker")
        await until(held.is_set)
        calls = [queued(agent, "alice") for agent in AGENTS for _ in range(2)]
        calls += [queued(VICTIM, "bob") for _ in range(2)]
        await until(lambda: scheduler.stats()["vc"]["queued"] == 22)
        release.set()
        await asyncio.gather(blocker, *calls)

    run_closing(scheduler, main)
    assert served[0] == "blocker"
    order = served[1:]
    assert len(order) == 22
    assert [n for n, who in enumerate(order) if who == "bob"] == victim_served_at, order


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["person", "caller"])
async def test_ten_agents_acting_for_one_person_share_one_turn_through_the_gateway(
        env: Env, mode: FairShare) -> None:
    """The same through the gateway's pipeline (``Gateway.call``: the gate, the read, the scheduler) with
    roles.yaml's top-level ``fair_share`` for the built-in admin role: Alice's ten agents queue two
    get_vm_details each on a slowed one-slot target, then Bob two; how many of the agents' calls
    finished before Bob's last."""
    (env.tmp / "roles.yaml").write_text(f"fair_share: {mode}\nroles:\n")
    os.chmod(env.tmp / "roles.yaml", 0o600)
    gw = env.build(targets_extra={"mirror": "off", "pool_size": 1, "max_queued_per_caller": 64})
    read = {"target": "vc1", "vm": "DC0_C0_RP0_VM0"}
    admin = [Principal(name=p.name, role="admin", surface="test", kind=p.kind, key=p.key,
                       acting_for=p.acting_for, acting_for_key=p.acting_for_key) for p in AGENTS]
    bob = Principal(name="bob", role="admin", surface="test", key=CallerKey.client(ISSUER, "bob"))
    await gw.calls.call(bob, "get_vm_details", read)
    env.sim.control("/delay", {"delay": 40})
    done: list[str] = []

    async def finishing(label: str, call: Awaitable[Any]) -> None:
        await call
        done.append(label)

    agents = [asyncio.create_task(finishing("alice", gw.calls.call(a, "get_vm_details", read)))
              for a in admin for _ in range(2)]
    await until(lambda: gw.scheduler.stats()["vc1"]["queued"] >= 19)
    await asyncio.gather(*(finishing("bob", gw.calls.call(bob, "get_vm_details", read)) for _ in range(2)))
    before = done.count("alice")
    await asyncio.gather(*agents)
    if mode == "person":  # bob's turns alternate with the agents' one share
        assert before <= 5, done
    else:  # ten shares: each of bob's vSphere calls waits for ten of the agents'
        assert before >= 9, done


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``condition`` on the event loop until it holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def run_closing(scheduler: Scheduler, main: Callable[[], Awaitable[None]]) -> None:
    async def wrapped() -> None:
        try:
            await main()
        finally:
            scheduler.close()
    asyncio.run(wrapped())
