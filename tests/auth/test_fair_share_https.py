"""Fair-queue shares over the real HTTPS server: ten agents acting for one person (JWTs the loopback
OpenID provider's key signs: one ``sub``, ten client ids) against a local token's caller, on a slowed
one-slot target, with roles.yaml's top-level ``fair_share`` for the built-in admin role.

Nothing here asserts on elapsed time: the test counts the agents' calls finished before the token
caller's last one.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support import httpserver, oidc_provider
from support.answers import answer_of
from support.oidc_provider import IdentityServed, identity_gateway
from support.simulator import MakeSimulator

pytestmark = [pytest.mark.anyio, pytest.mark.oidc]
READ = {"target": "vc1", "vm": "DC0_C0_RP0_VM0"}


@asynccontextmanager
async def mcp(served: IdentityServed, bearer: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(verify=ssl.create_default_context(cafile=str(served.cert.cert)), timeout=120,
                              headers={"Authorization": f"Bearer {bearer}"})
    transport = streamable_http_client(f"{served.base}/mcp", http_client=http)
    async with http, Client(transport, mode="legacy") as client:
        yield client


def agent_for_alice(served: IdentityServed, n: int) -> str:
    """A JWT for the client ``agent-<n>`` carrying Alice's ``sub`` (an agent acting for her), admin."""
    p = served.provider
    return p.sign(p.claims(sub="alice-sub", client_id=f"agent-{n}", groups=["vsphere-admins"],
                           scope="vsphere:read vsphere:write"))


def one_slot_gateway(monkeypatch: pytest.MonkeyPatch, fair_share: str) -> None:
    """identity_gateway builds vc1 with one slot and no mirror, roles.yaml with ``fair_share`` at the
    top, and identity.yaml mapping vsphere-admins to admin."""
    build, plain_identity = httpserver.build_gateway, oidc_provider.identity_yaml
    target = {"mirror": "off", "pool_size": 1, "max_queued_per_caller": 64}
    monkeypatch.setattr(httpserver, "build_gateway",
                        lambda tmp, sim, rules=None, **kw: build(tmp, sim, rules, target=target, **kw))
    monkeypatch.setattr(oidc_provider, "ROLES", f"fair_share: {fair_share}\n{oidc_provider.ROLES}")

    def mapped(provider: Any, resource: str, **kw: Any) -> str:
        return plain_identity(provider, resource, **{**kw, "roles": {"vsphere-admins": "admin"}})

    monkeypatch.setattr(oidc_provider, "identity_yaml", mapped)


async def until_queued(served: IdentityServed, count: int, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while served.gateway.scheduler.stats()["vc1"]["queued"] < count:
        assert loop.time() < deadline, "the agents' calls never queued"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("mode", ["person", "caller"])
async def test_ten_agents_acting_for_one_person_get_one_share_over_https(
        tmp_path: Path, make_simulator: MakeSimulator, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    sim = make_simulator(vms=2)
    one_slot_gateway(monkeypatch, mode)
    with identity_gateway(tmp_path, sim) as served:
        async with AsyncExitStack() as stack:
            agents = [await stack.enter_async_context(mcp(served, agent_for_alice(served, n)))
                      for n in range(10)]
            bob = await stack.enter_async_context(mcp(served, served.token))
            warm = answer_of(await bob.call_tool("get_vm_details", dict(READ)))
            assert "error" not in warm, warm
            # the burst's first call holds the one slot while the rest arrive (on a slow machine twenty
            # calls take longer to arrive than a few short ones to run), then each call takes 40 ms
            sim.control("/delay", {"delay": 3000})
            done: list[str] = []

            async def finishing(label: str, call: Awaitable[Any]) -> None:
                result = await call
                assert not result.is_error, answer_of(result)
                done.append(label)

            burst = [asyncio.create_task(finishing("alice", a.call_tool("get_vm_details", dict(READ))))
                     for a in agents for _ in range(2)]
            await until_queued(served, 19)  # one runs, the other 19 wait
            sim.control("/delay", {"delay": 40})
            await asyncio.gather(*(finishing("bob", bob.call_tool("get_vm_details", dict(READ)))
                                   for _ in range(2)))
            before = done.count("alice")
            await asyncio.gather(*burst)
    if mode == "person":  # one share for the ten: bob's turns alternate with it
        assert before <= 5, done
    else:  # ten shares: each of bob's vSphere calls waits for ten of the agents'
        assert before >= 9, done
