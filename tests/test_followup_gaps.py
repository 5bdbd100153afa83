"""Gaps of issues 9 and 10 closed after the big merge: readiness off the event loop, the web page's
approve right from the one decision, state preconditions answered only after the policy."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import httpx2
import pytest
from simulator import MakeSimulator

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ---------------------------------------------------------------- /readyz never holds the event loop


async def test_healthz_answers_while_readiness_is_stuck(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    """A state store that stops answering (a fault injected by replacing ``store.ping`` with one that
    blocks: neither SQLite nor the simulator can be made to hang on demand) must not stall /healthz,
    and /readyz answers 503 at its deadline instead of hanging."""
    from httpserver import serve
    from test_server_http import real_gateway

    gw = real_gateway(make_simulator(vms=1), tmp_path)
    entered, release = threading.Event(), threading.Event()

    def stuck_store_ping_fault() -> bool:
        entered.set()
        release.wait(60)
        return True

    served = serve(tmp_path, gw)
    try:
        gw.store.ping = stuck_store_ping_fault  # type: ignore[method-assign]
        answers: dict[str, httpx2.Response] = {}
        async with served.http() as http:

            async def ready() -> None:
                answers["ready"] = await http.get("/readyz", timeout=30)

            async with anyio.create_task_group() as tg:
                tg.start_soon(ready)
                with anyio.fail_after(20):
                    while not entered.is_set():
                        await anyio.sleep(0.02)
                async with served.http() as probe:
                    try:
                        health = await probe.get("/healthz", timeout=5)
                    except httpx2.TimeoutException:
                        pytest.fail("/healthz did not answer while a readiness check was stuck")
                assert health.status_code == 200
        assert answers["ready"].status_code == 503
        assert "did not answer" in " ".join(answers["ready"].json()["reasons"])
    finally:
        release.set()
        served.stop()
        await gw.close()
