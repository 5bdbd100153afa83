"""Idempotency keys: the pure decision (a table), the key table on SQLite, and retries over HTTPS with the
real SDK client against the simulator: a clone retried after a dropped connection runs once, on one
gateway and across two replicas on PostgreSQL; a reused key with other arguments is refused; a retried
destructive call returns the same proposal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from support.answers import answer_of
from support.httpserver import Served, audit_rows, build_gateway, mcp_client, serve
from support.simulator import MakeSimulator, Simulator, count_vms_named, pyvmomi_connect

from gateway.auth.principal import CallerKey
from gateway.errors import InvalidArgument
from gateway.guard import confirm
from gateway.guard.idempotency_rules import Seen, Step, checked_key, decide, keeps_error
from gateway.server.call.idempotency import key_from_meta, key_id
from gateway.store.idempotency_keys import KeyRecord, KeyTable
from gateway.store.instance import Instance
from gateway.store.sqlite import SqliteStore

WINDOW = 100.0
SOURCE = "DC0_C0_RP0_VM0"


@pytest.mark.parametrize(
    ("seen", "tool", "digest", "now", "step"),
    [
        (None, "clone_vm", "d1", 10.0, Step.RUN),
        (Seen("clone_vm", "d1", False, 0.0), "clone_vm", "d1", 10.0, Step.REPLAY),
        (Seen("clone_vm", "d1", True, 0.0), "clone_vm", "d1", 10.0, Step.WAIT),
        (Seen("clone_vm", "d1", True, 0.0, owner_alive=False), "clone_vm", "d1", 10.0, Step.ORPHANED),
        (Seen("clone_vm", "d1", False, 0.0, owner_alive=False), "clone_vm", "d1", 10.0, Step.REPLAY),
        (Seen("clone_vm", "d1", True, 0.0, owner_alive=False), "clone_vm", "d2", 10.0, Step.CONFLICT),
        (Seen("clone_vm", "d1", False, 0.0), "clone_vm", "d2", 10.0, Step.CONFLICT),
        (Seen("clone_vm", "d1", True, 0.0), "clone_vm", "d2", 10.0, Step.CONFLICT),
        (Seen("clone_vm", "d1", False, 0.0), "power_on_vm", "d1", 10.0, Step.CONFLICT),
        (Seen("clone_vm", "d1", False, 0.0), "clone_vm", "d2", WINDOW, Step.TAKE_OVER),
        (Seen("clone_vm", "d1", False, 0.0), "clone_vm", "d1", WINDOW + 1, Step.TAKE_OVER),
        (Seen("clone_vm", "d1", False, 0.0), "clone_vm", "d1", WINDOW - 0.001, Step.REPLAY),
    ],
)
def test_what_a_key_means(seen: Seen | None, tool: str, digest: str, now: float, step: Step) -> None:
    assert decide(seen, tool=tool, digest=digest, now=now, window=WINDOW) is step


@pytest.mark.parametrize(("code", "kept"), [("outcome_unknown", True), ("timeout", True),
                                            ("task_failed", True), ("rate_limited", False),
                                            ("policy_denied", False), ("unreachable", False),
                                            ("invalid_state", False)])
def test_only_errors_after_which_the_change_may_have_happened_keep_the_key(code: str, kept: bool) -> None:
    assert keeps_error(code) is kept


@pytest.mark.parametrize("key", ["", "has space", "x" * 129, "caf\u00e9"])
def test_a_malformed_key_is_an_invalid_argument(key: str) -> None:
    with pytest.raises(InvalidArgument):
        checked_key(key)


@pytest.mark.parametrize(("meta", "args", "key"), [
    ({"idempotency_key": "m"}, {}, "m"),
    ({"idempotency_key": "m"}, {"idempotency_key": "a"}, "a"),  # the argument wins
    (None, {"idempotency_key": "a"}, "a"),
    ({"progress_token": 1}, {}, None),
])
def test_the_argument_wins_over_the_meta_key(meta: Any, args: dict[str, Any], key: str | None) -> None:
    assert key_from_meta(meta, args).get("idempotency_key") == key


def test_the_key_table_claims_once_and_takes_over_an_expired_row(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    keys = KeyTable(store, placeholder="?")
    first = KeyRecord("alice", "k1", "clone_vm", "d1", True, 1.0, correlation_id="c1")
    assert keys.claim(first)
    assert not keys.claim(KeyRecord("alice", "k1", "clone_vm", "d1", True, 2.0))  # held
    assert keys.claim(KeyRecord("bob", "k1", "clone_vm", "d1", True, 2.0))  # keys are per caller
    keys.finish("alice", "k1", 1.0, '{"ok":1}', failed=False, now=3.0)
    held = keys.get("alice", "k1")
    assert held is not None and not held.running and held.outcome == '{"ok":1}'
    stale = KeyRecord("alice", "k1", "clone_vm", "d2", True, 9.0)
    assert not keys.claim(stale, replacing=0.5)  # not the row the store holds
    assert keys.claim(KeyRecord("alice", "k1", "clone_vm", "d2", True, 9.0), replacing=1.0)
    again = keys.get("alice", "k1")
    assert again is not None and again.running and again.digest == "d2" and again.outcome is None
    store.close()


# ---------------------------------------------------------------------------------------------------
# over HTTPS, with the simulator

def _clone_args(name: str) -> dict[str, Any]:
    return {"target": "vc1", "vm": SOURCE, "name": name}


async def _drop_mid_clone(served: Served, args: dict[str, Any], meta: dict[str, Any]) -> None:
    """Start a clone, wait for its first progress (the vSphere task runs), then drop the connection."""
    running = asyncio.Event()

    async def on_progress(_p: float, _t: float | None, _m: str | None) -> None:
        running.set()

    async with mcp_client(served, served.tokens["alice"], "legacy") as client:
        call = asyncio.ensure_future(
            client.call_tool("clone_vm", args, progress_callback=on_progress, meta=meta))
        await asyncio.wait_for(running.wait(), 30)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call


def _count(sim: Simulator, name: str) -> int:
    return count_vms_named(pyvmomi_connect(sim), name)


async def _retried_clone(first: Served, second: Served, sim: Simulator, name: str) -> Any:
    sim.control("/slow-task", {"method": "CloneVM_Task", "seconds": 4, "count": 2})
    meta = {"idempotency_key": f"clone-{name}"}
    await _drop_mid_clone(first, _clone_args(name), meta)
    async with mcp_client(second, second.tokens["alice"], "legacy") as client:
        return await client.call_tool("clone_vm", _clone_args(name), meta=meta)


@pytest.mark.anyio
async def test_a_clone_retried_with_its_key_after_a_dropped_connection_runs_once(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=1)
    gateway = build_gateway(tmp_path, sim)
    served = serve(tmp_path, gateway)
    try:
        result = await _retried_clone(served, served, sim, "web-clone")
    finally:
        served.stop()
        await gateway.close()
    assert not result.is_error, result.content
    assert _count(sim, "web-clone") == 1
    rows = [r for r in audit_rows(gateway) if r.get("tool") == "clone_vm"]
    assert [r["phase"] for r in rows if r["phase"] in ("executed", "retry")] == ["executed", "retry"]
    (retry,) = [r for r in rows if r["phase"] == "retry"]
    first_call = next(r for r in rows if r["phase"] == "executed")
    assert retry["idempotency_key"] == key_id("clone-web-clone")[:16] and retry["outcome"] == "ok"
    assert all("clone-web-clone\"" not in json.dumps(r) for r in rows)  # the key itself is never audited
    assert retry["replay_of"] == first_call["correlation_id"]


@pytest.mark.anyio
async def test_a_clone_retried_on_the_other_replica_runs_once(
    tmp_path: Path, make_simulator: MakeSimulator, pg_url: str
) -> None:
    sim = make_simulator(vms=1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    replica_a = build_gateway(tmp_path / "a", sim, database_url=pg_url)
    replica_b = build_gateway(tmp_path / "b", sim, database_url=pg_url)
    served_a = serve(tmp_path / "a", replica_a)
    served_b = serve(tmp_path / "b", replica_b, tokens=served_a.tokens)
    try:
        result = await _retried_clone(served_a, served_b, sim, "db-clone")
    finally:
        served_a.stop()
        served_b.stop()
        await replica_a.close()
        await replica_b.close()
    assert not result.is_error, result.content
    assert _count(sim, "db-clone") == 1


@pytest.mark.anyio
async def test_a_reused_key_with_other_arguments_is_refused(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=1)
    gateway = build_gateway(tmp_path, sim)
    served = serve(tmp_path, gateway)
    try:
        async with mcp_client(served, served.tokens["alice"], "legacy") as client:
            first = await client.call_tool("clone_vm", {**_clone_args("one"), "idempotency_key": "k-1"})
            again = await client.call_tool("clone_vm", {**_clone_args("two"), "idempotency_key": "k-1"})
            replayed = await client.call_tool("clone_vm", {**_clone_args("one"), "idempotency_key": "k-1"})
    finally:
        served.stop()
        await gateway.close()
    assert not first.is_error, first.content
    assert again.is_error
    error = answer_of(again)["error"]
    assert error["code"] == "idempotency_conflict" and "new key" in error["message"]
    assert replayed.content[0].text == first.content[0].text  # type: ignore[union-attr]
    assert (_count(sim, "one"), _count(sim, "two")) == (1, 0)
    refused = [r for r in audit_rows(gateway) if r.get("phase") == "retry" and r.get("error_code")]
    assert [r["error_code"] for r in refused] == ["idempotency_conflict"]


def alice_key(gateway: Any) -> str:
    """The key text alice's keys are kept under: her token's ``CallerKey`` (never her name)."""
    record = gateway.store.token_by_name("alice")
    assert record is not None
    return str(CallerKey.token(record.token_id))


@pytest.mark.anyio
async def test_a_retried_destructive_call_returns_the_same_proposal(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=2)
    gateway = build_gateway(tmp_path, sim)
    served = serve(tmp_path, gateway)
    args = {"target": "vc1", "vm": SOURCE, "force_power_off": True, "idempotency_key": "del-1"}
    try:
        async with mcp_client(served, served.tokens["alice"], "legacy") as client:
            first = answer_of(await client.call_tool("delete_vm", args))
        async with mcp_client(served, served.tokens["alice"], "2026-07-28") as client:
            second = answer_of(await client.call_tool("delete_vm", args))
        proposals = gateway.store.list_proposals()
        kept = gateway.backends.keys.get(alice_key(gateway), key_id("del-1"))
    finally:
        served.stop()
        await gateway.close()
    assert first["proposal_id"] == second["proposal_id"]
    assert [p.id for p in proposals] == [first["proposal_id"]]
    assert second["token"] == first["token"]  # the retry can confirm: it lost the first answer
    assert kept is not None and kept.outcome is not None
    assert first["token"] not in kept.outcome and first["proposal_id"] not in kept.outcome  # sealed
    assert [r["phase"] for r in audit_rows(gateway) if r.get("tool") == "delete_vm"][-1] == "retry"


@pytest.mark.anyio
async def test_a_retry_of_a_call_whose_process_died_reports_an_unknown_outcome_and_never_runs(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=1)
    gateway = build_gateway(tmp_path, sim)
    served = serve(tmp_path, gateway)
    gone = Instance(tmp_path / "other-home")  # a process that claimed the key, then stopped
    dead_id = gone.acquire()
    gone.close()
    args = _clone_args("orphan")
    spec = gateway.facts.registry.get("clone_vm")
    digest = confirm.args_digest("clone_vm", "vc1", spec.validate(args))
    gateway.backends.keys.claim(KeyRecord(alice_key(gateway), key_id("k-orphan"), "clone_vm", digest, True,
                                          time.time(), correlation_id="first", owner=dead_id))
    try:
        async with mcp_client(served, served.tokens["alice"], "legacy") as client:
            first = await client.call_tool("clone_vm", {**args, "idempotency_key": "k-orphan"})
            again = await client.call_tool("clone_vm", {**args, "idempotency_key": "k-orphan"})
    finally:
        served.stop()
        await gateway.close()
    assert answer_of(first)["error"]["code"] == "outcome_unknown"
    assert answer_of(again)["error"]["code"] == "outcome_unknown"
    assert _count(sim, "orphan") == 0
    retries = [r for r in audit_rows(gateway) if r.get("phase") == "retry"]
    assert [(r["replay_of"], r["outcome"]) for r in retries] == [("first", "outcome_unknown")] * 2
