"""Text no engine can store (``gateway.guard.inputs``): refused first as an invalid argument, and the
refusal audited, escaped, on the file audit and on PostgreSQL alike (issue 24)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.answers import answer_of
from support.httpserver import Served, audit_rows, build_gateway, mcp_client, serve
from support.simulator import Simulator

from gateway.audit.bounds import bounded
from gateway.auth.tokens import Principal
from gateway.errors import InvalidArgument
from gateway.guard.inputs import storable_text, unstorable_field

ADMIN = Principal(name="agent-a", role="admin", surface="test")


@pytest.mark.parametrize(
    ("name", "args", "field"),
    [
        ("list_vms", {"target": "vc1"}, None),
        ("list_vms", {"target": "vc1", "name": "wéb-1 😀"}, None),
        ("list_vms\x00", {"target": "vc1"}, "tool"),
        ("list_vms\ud800", {}, "tool"),
        ("list_vms", {"target": "vc1\x00"}, "target"),
        ("list_vms", {"target": ["vc1", "vc2\udfff"]}, "target[1]"),
        ("list_vms", {"tar\x00get": "vc1"}, "tar\\u0000get"),
        ("power_on_vm", {"target": "vc1", "vm": {"deep": ["ok", "x\x00"]}}, "vm.deep[1]"),
        ("list_vms", None, None),
    ],
)
def test_unstorable_field_names_the_first_place_holding_nul_or_a_lone_surrogate(
    name: str, args: dict[str, Any] | None, field: str | None
) -> None:
    assert unstorable_field(name, args) == field


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("plain", "plain"),
        ("a\x00b", "a\\u0000b"),
        ("\ud800x\udc80", "\\ud800x\\udc80"),
        ("wéb 😀\tok", "wéb 😀\tok"),
    ],
)
def test_storable_text_escapes_visibly_and_leaves_the_rest(text: str, stored: str) -> None:
    assert storable_text(text) == stored
    assert storable_text(text).encode("utf-8")  # encodable: no lone surrogate left


def test_the_audits_bounding_step_escapes_keys_and_values() -> None:
    row = bounded({"tool": "list_vms\x00", "args": {"t\x00": ["\udc80"]}})
    assert row == {"tool": "list_vms\\u0000", "args": {"t\\u0000": ["\\udc80"]}}
    json.dumps(row, ensure_ascii=False).encode("utf-8")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, sim_vc1: Simulator, tmp_path: Path) -> Iterator[Served]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    running = serve(tmp_path, build_gateway(tmp_path, sim_vc1, database_url=url))
    yield running
    running.stop()
    anyio.run(running.gateway.close)


@pytest.mark.parametrize(
    ("tool", "args", "field"),
    [
        ("list_vms\x00", {"target": "vc1"}, "tool"),
        ("list_vms", {"target": "vc1\x00"}, "target"),
        ("power_on_vm", {"target": "vc1", "vm": "DC0_H0_VM0\x00"}, "vm"),
    ],
)
def test_a_nul_in_a_call_is_refused_and_audited_on_both_engines(
    served: Served, tool: str, args: dict[str, Any], field: str
) -> None:
    async def call() -> tuple[bool, Any]:
        async with mcp_client(served, served.tokens["alice"], "2026-07-28") as client:
            result = await client.call_tool(tool, args)
        return bool(result.is_error), answer_of(result)

    failed, answer = anyio.run(call)
    assert failed, answer
    assert answer["error"]["code"] == "invalid_argument", answer
    assert answer["error"]["field"] == field
    rows = [r for r in audit_rows(served.gateway) if r.get("caller") == "alice"]
    assert len(rows) == 1, rows
    (row,) = rows
    assert row["phase"] == "invalid" and row["error_code"] == "invalid_argument"
    assert row["tool"] == storable_text(tool)
    assert "\x00" not in json.dumps(row, ensure_ascii=False)


def test_a_lone_surrogate_from_a_local_surface_is_refused_and_audited(
    sim_vc1: Simulator, tmp_path: Path, pg_url: str
) -> None:
    """stdio and the CLI hand Python strings over as they are, lone surrogates included."""
    gateway = build_gateway(tmp_path, sim_vc1, database_url=pg_url)

    async def call() -> list[dict[str, Any]]:
        try:
            with pytest.raises(InvalidArgument, match="surrogate"):
                await gateway.calls.call(ADMIN, "list_vms", {"target": "vc1", "name": "web\udc80"})
            return audit_rows(gateway)
        finally:
            await gateway.close()

    (row,) = anyio.run(call)
    assert row["args"]["name"] == "web\\udc80" and row["error_code"] == "invalid_argument"
