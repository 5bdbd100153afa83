"""Identity is who, not a name: against the real HTTPS server, the simulator and the OpenID provider on
loopback (oidc-provider under Node), each caller is its key, whatever name it shows.

- an identity provider's client named ``idadmin`` (mapped to admin) and the local ``gwt_`` token named
  ``idadmin`` send the same ``delete_vm`` with the same ``idempotency_key``: each gets its own proposal;
  the client cannot confirm the token's proposal, sees none of its tasks, and a refused ``tasks/get`` of
  it is an audit row;
- audit rows carry the key (issuer and subject where there is one) beside the name.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from support import oidc_provider
from support.answers import answer_of
from support.httpserver import FAST_HASH, audit_rows
from support.oidc_provider import IdentityServed, identity_gateway
from support.simulator import MakeSimulator

from gateway.auth.tokens import create_token

pytestmark = [pytest.mark.anyio, pytest.mark.oidc]
VM = "DC0_C0_RP0_VM0"
ADMINS = {"vsphere-ops": "lab-operator", "vsphere-admins": "admin", "vsphere-approvers": "approver"}


@asynccontextmanager
async def mcp(served: IdentityServed, bearer: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(verify=ssl.create_default_context(cafile=str(served.cert.cert)), timeout=60,
                              headers={"Authorization": f"Bearer {bearer}"})
    transport = streamable_http_client(f"{served.base}/mcp", http_client=http)
    async with http, Client(transport, mode="legacy") as client:
        yield client


async def raw(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return await client.session._dispatcher.send_raw_request(method, params, {})


def idp_admin_token(served: IdentityServed, client_id: str) -> str:
    """A JWT the provider's own key signs for the client ``client_id`` (sub = client id), mapped to admin."""
    p = served.provider
    return p.sign(p.claims(sub=client_id, client_id=client_id, groups=["vsphere-admins"],
                           scope="vsphere:read vsphere:write vsphere:destructive"))


def admins_mapped(monkeypatch: pytest.MonkeyPatch, **issuer: Any) -> None:
    """identity.yaml maps the group vsphere-admins to admin (and ``issuer`` overrides more keys)."""
    plain = oidc_provider.identity_yaml

    def mapped(provider: Any, resource: str, **kw: Any) -> str:
        return plain(provider, resource, **{**kw, "roles": ADMINS, **issuer})

    monkeypatch.setattr(oidc_provider, "identity_yaml", mapped)


async def test_an_idp_client_named_like_a_local_token_is_another_caller(
    tmp_path: Path, make_simulator: MakeSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = make_simulator(vms=2)
    admins_mapped(monkeypatch)
    with identity_gateway(tmp_path, sim) as served:
        local = create_token(served.gateway.store, "idadmin", "admin", expires_in=None, now=time.time(),
                             hasher=FAST_HASH)[0]
        jwt = idp_admin_token(served, "idadmin")
        args = {"target": "vc1", "vm": VM, "force_power_off": True, "idempotency_key": "same-key"}
        async with mcp(served, local) as client:
            theirs = answer_of(await client.call_tool("delete_vm", dict(args)))
            started = await raw(client, "tools/call", {
                "name": "clone_vm", "task": {"ttl": 60_000},
                "arguments": {"target": "vc1", "vm": VM, "name": "local-clone"}})
            task_id = str(started["task"]["taskId"])
        async with mcp(served, jwt) as client:
            mine = answer_of(await client.call_tool("delete_vm", dict(args)))
            assert mine.get("proposal_id") != theirs["proposal_id"], "the client got the token's proposal"
            stolen = await client.call_tool("confirm_action", {"token": theirs["token"]})
            listed = await raw(client, "tasks/list", {})
            with pytest.raises(MCPError) as peeked:
                await raw(client, "tasks/get", {"taskId": task_id})
            with pytest.raises(MCPError):
                await raw(client, "tasks/result", {"taskId": task_id})
        rows = audit_rows(served.gateway)
        issuer = served.provider.issuer
    assert theirs["state"] == "pending" and mine["state"] == "pending", (theirs, mine)
    assert mine["proposal_id"] != theirs["proposal_id"] and mine["token"] != theirs["token"]
    assert stolen.is_error and answer_of(stolen)["error"]["code"] == "confirmation_invalid"
    assert listed["tasks"] == []
    assert "of yours" in str(peeked.value)
    from gateway.auth.principal import CallerKey  # the rows' keys (the hole's tree had none)

    client_key = str(CallerKey.client(issuer, "idadmin"))
    proposed = {r["proposal_id"]: r for r in rows if r.get("phase") == "proposed"}
    assert proposed[mine["proposal_id"]]["caller_key"] == client_key
    assert proposed[mine["proposal_id"]]["issuer"] == issuer
    assert proposed[theirs["proposal_id"]]["caller_key"] != client_key
    refused = [r for r in rows
               if r.get("phase") == "refused" and r.get("tool") in ("tasks/get", "tasks/result")]
    assert {r["tool"] for r in refused} == {"tasks/get", "tasks/result"}, refused
    assert all(r["caller_key"] == client_key and r["task_id"] == task_id for r in refused)


async def test_a_client_named_like_the_gateway_writes_no_row_as_the_gateway(
    tmp_path: Path, make_simulator: MakeSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``gateway``, ``os:root`` and ``-`` are names the gateway writes itself: a client showing one is
    still that issuer's client, and its rows say so."""
    sim = make_simulator(vms=1)
    admins_mapped(monkeypatch)
    with identity_gateway(tmp_path, sim) as served:
        for name in ("gateway", "os:root", "-"):
            async with mcp(served, idp_admin_token(served, name)) as client:
                await client.call_tool("list_vms", {"target": "vc1"})
        rows = [r for r in audit_rows(served.gateway) if r.get("tool") == "list_vms"]
        issuer = served.provider.issuer
    from gateway.auth.principal import CallerKey

    names = ("gateway", "os:root", "-")
    assert {r["caller_key"] for r in rows} == {str(CallerKey.client(issuer, n)) for n in names}
    assert all(r["issuer"] == issuer for r in rows)
