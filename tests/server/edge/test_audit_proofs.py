"""The audit log's checkpoint and Merkle proofs over HTTPS (gateway.server.edge.audit_proofs), on the real
uvicorn server with bearer tokens: roles that may read the audit get the signed note and proofs that
verify offline; a role with ``audit: none`` is refused (403) and the refusal is audited."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from support.httpserver import audit_rows, real_gateway, serve

from gateway.audit.proofs import check_consistency, check_inclusion, open_signed
from gateway.audit.signing import load_or_create_signing_key

pytestmark = pytest.mark.anyio


@pytest.fixture
def served(sim_vc1: Any, tmp_path: Path) -> Any:
    running = serve(tmp_path, real_gateway(sim_vc1, tmp_path))
    try:
        yield running
    finally:
        running.stop()


async def test_checkpoint_and_proofs_over_https_verify_offline(served: Any) -> None:
    gw = served.gateway
    for i in range(12):
        await anyio.to_thread.run_sync(lambda i=i: gw.audit.write({"phase": "call", "args": {"i": i}}))
    old = await anyio.to_thread.run_sync(gw.audit.checkpoint)
    for i in range(9):
        await anyio.to_thread.run_sync(lambda i=i: gw.audit.write({"phase": "call", "args": {"i": 100 + i}}))
    await anyio.to_thread.run_sync(gw.audit.checkpoint)
    key = load_or_create_signing_key(gw.settings.signing_key_file).public_key()
    lines = gw.settings.audit_log.read_bytes().splitlines()
    async with served.http(served.tokens["bob"]) as client:  # reader: audit own
        note = await client.get("/audit/checkpoint")
        assert note.status_code == 200 and note.headers["content-type"].startswith("text/plain")
        checkpoint = open_signed(note.text, key)
        assert checkpoint.size == len(lines)
        inclusion = await client.get("/audit/proof/inclusion", params={"seq": 7})
        assert inclusion.status_code == 200 and set(inclusion.json()) == {"index", "tree_size", "hashes"}
        check_inclusion(inclusion.json(), checkpoint, lines[6])
        consistency = await client.get("/audit/proof/consistency", params={"old_size": old["seq"]})
        assert set(consistency.json()) == {"old_size", "new_size", "hashes"}
        check_consistency(consistency.json(), open_signed(old["note"], key), checkpoint)
        beyond = await client.get("/audit/proof/inclusion", params={"seq": len(lines) + 5})
        assert beyond.status_code == 404 and beyond.json()["error"]["code"] == "not_found"
        bad = await client.get("/audit/proof/inclusion", params={"seq": "x"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_argument"


async def test_a_role_without_the_audit_right_is_refused_and_the_refusal_audited(served: Any) -> None:
    async with served.http(served.tokens["carol"]) as client:  # vc1-reader: audit none
        refused = await client.get("/audit/checkpoint")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert "audit" in refused.json()["error"]["message"]
    rows = [r for r in audit_rows(served.gateway) if r.get("tool") == "audit_proof"]
    assert rows and rows[-1]["phase"] == "refused" and rows[-1]["caller"] == "carol"
    async with served.http() as anonymous:
        assert (await anonymous.get("/audit/checkpoint")).status_code == 401
