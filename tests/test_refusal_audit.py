"""Refused tokens in the audit (``server.edge.RefusalAudit``): a revoked or expired token's refusal row
names the token's id and why, aggregated per (address, reason) with a count (issue 24). Real HTTPS
server, real tokens, real gateway."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from httpserver import FAST_HASH, Served, audit_rows, build_gateway, serve
from simulator import Simulator, wait_until

from gateway.auth.tokens import create_token, parse_token_id


@pytest.fixture
def served(sim_vc1: Simulator, tmp_path: Path) -> Iterator[Served]:
    running = serve(tmp_path, build_gateway(tmp_path, sim_vc1), edge={"refusal_audit_seconds": 0.2})
    yield running
    running.stop()
    anyio.run(running.gateway.close)


def test_revoked_and_expired_tokens_are_audited_by_id_and_reason(served: Served) -> None:
    store = served.gateway.store
    revoked = served.tokens["bob"]
    store.update_token("bob", revoked=True)
    expired, expired_rec = create_token(store, "old-ci", "reader", expires_in=60, now=time.time() - 120,
                                        hasher=FAST_HASH)
    revoked_id = parse_token_id(revoked)

    async def knock() -> list[int]:
        statuses = []
        for token in (revoked, revoked, revoked, expired, expired):
            async with served.http(token) as http:
                statuses.append((await http.get("/metrics")).status_code)
        return statuses

    assert anyio.run(knock) == [401] * 5

    def refusals() -> list[dict[str, Any]]:
        return [r for r in audit_rows(served.gateway) if r["phase"] == "token_refused"]

    wait_until(lambda: sum(r["count"] for r in refusals()) >= 5, timeout=30, what="refusal rows")
    by_reason = {r["reason"]: r for r in refusals()}
    assert set(by_reason) == {"revoked", "expired"}, refusals()
    assert by_reason["revoked"]["count"] == 3 and by_reason["revoked"]["token_ids"] == [revoked_id]
    assert by_reason["expired"]["count"] == 2 and by_reason["expired"]["token_ids"] == [expired_rec.token_id]
    text = json.dumps(refusals())
    assert all(t.split("_", 2)[2] not in text for t in (revoked, expired)), "never the secret"
