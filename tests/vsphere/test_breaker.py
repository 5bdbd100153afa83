"""The per-target circuit breaker in the scheduler, against a closed port and a simulator that is
stopped (SIGSTOP: it accepts connections and never answers) and then continued.

After ``breaker_threshold`` consecutive connection failures a target fails fast with ``unreachable``
and a retry-after; a background probe (one login / one call) closes it again once the target answers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from support.simulator import MakeSimulator, closed_port, credential_prefix, sim_target

from gateway import errors
from gateway.config import Target
from gateway.tools.read import summarize_targets
from gateway.vsphere.pool import VSphereSession
from gateway.vsphere.scheduler import Scheduler, is_connection_failure


def creds(name: str, user: str, password: str) -> dict[str, str]:
    return {f"{credential_prefix(name)}_USER": user, f"{credential_prefix(name)}_PASSWORD": password}


def now(session: VSphereSession) -> Any:
    return session.si.CurrentTime()


def process_state(pid: int) -> str:
    """The one-letter state of ``pid`` from /proc (``T`` once a SIGSTOP has taken effect)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


async def until(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def test_a_closed_port_opens_the_breaker_and_then_fails_fast() -> None:
    target = Target(name="dead", host="127.0.0.1", port=closed_port(),
                    credential_env_prefix=credential_prefix("dead"), insecure=True)
    scheduler = Scheduler([target], creds("dead", "u", "p"), breaker_threshold=3,
                          probe_seconds=60.0)

    async def main() -> list[errors.GatewayError]:
        seen: list[errors.GatewayError] = []
        for _ in range(4):
            try:
                await scheduler.run("dead", now, deadline=10)
            except errors.GatewayError as exc:
                seen.append(exc)
        return seen

    try:
        seen = asyncio.run(main())
        stats = scheduler.stats()["dead"]
        fan = asyncio.run(scheduler.fan_out(["dead"], now, deadline=10))
    finally:
        scheduler.close()
    assert [e.code for e in seen] == ["unreachable"] * 4
    assert "circuit" not in seen[2].details, "the first failures are real attempts"
    fast = seen[3].details
    assert fast["circuit"] == "open" and 0 < fast["retry_after_seconds"] <= 60
    assert "retry" in seen[3].message and "dead" in seen[3].message
    assert scheduler.pool("dead").stats.logins == 0
    assert stats["circuit_open"] == 1 and stats["consecutive_failures"] >= 3
    assert fan["dead"]["error"]["circuit"] == "open"
    rows = summarize_targets([target], fan)
    assert rows[0]["circuit"] == "open" and rows[0]["connectivity"] == "error"


def test_a_stopped_simulator_opens_the_breaker_and_the_probe_closes_it(make_simulator: MakeSimulator) -> None:
    sim = make_simulator()
    target = sim_target("vc1", sim, timeout_seconds=1.0)
    scheduler = Scheduler([target], creds("vc1", sim.user, sim.password), breaker_threshold=2,
                          probe_seconds=0.2)

    async def main() -> tuple[list[str], dict[str, Any], Any]:
        await scheduler.run("vc1", now, deadline=10)
        os.kill(sim.pid, signal.SIGSTOP)
        await until(lambda: process_state(sim.pid) == "T")  # kill() only queues the stop
        codes = []
        try:
            for _ in range(3):
                try:
                    await scheduler.run("vc1", now, deadline=10)
                except errors.GatewayError as exc:
                    codes.append(exc.code if "circuit" not in exc.details else "fast")
            open_state = dict(scheduler.breakers()["vc1"])
        finally:
            os.kill(sim.pid, signal.SIGCONT)
        await until(lambda: scheduler.breakers()["vc1"]["state"] == "closed")
        return codes, open_state, await scheduler.run("vc1", now, deadline=10)

    try:
        codes, open_state, answer = asyncio.run(main())
        closed = scheduler.stats()["vc1"]
    finally:
        scheduler.close()
        os.kill(sim.pid, signal.SIGCONT)
    assert codes[:2] == ["timeout", "timeout"] and codes[2] == "fast"
    assert open_state["state"] in ("open", "probing")
    assert answer is not None
    assert closed["circuit_open"] == 0 and closed["consecutive_failures"] == 0


def test_a_target_that_answers_resets_the_count(make_simulator: MakeSimulator) -> None:
    sim = make_simulator()
    dead = Target(name="dead", host="127.0.0.1", port=closed_port(), credential_env_prefix=credential_prefix(
        "dead"), insecure=True)
    scheduler = Scheduler([sim_target("vc1", sim), dead],
                          {**creds("vc1", sim.user, sim.password), **creds("dead", "u", "p")},
                          breaker_threshold=2, probe_seconds=60.0)

    async def main() -> None:
        for _ in range(5):
            await scheduler.run("vc1", now, deadline=10)
        with pytest.raises(errors.Unreachable):
            await scheduler.run("dead", now, deadline=10)

    try:
        asyncio.run(main())
        states = scheduler.breakers()
    finally:
        scheduler.close()
    assert states["vc1"] == {"state": "closed", "consecutive_failures": 0, "retry_after_seconds": 0.0}
    assert states["dead"]["state"] == "closed" and states["dead"]["consecutive_failures"] == 1


def _caused(error: errors.GatewayError, cause: BaseException) -> errors.GatewayError:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(("error", "counts"), [
    (errors.Unreachable("refused"), True),
    (_caused(errors.Timeout("socket"), TimeoutError("timed out")), True),
    (errors.Timeout("task t-1 past its deadline", task="t-1"), False),
    (errors.OutcomeUnknown("lost track"), False),
    (errors.PermissionDenied("no"), False),
    (errors.NotFound("vm"), False),
    (ValueError("a bug"), False),
    (None, False),
])
def test_which_errors_count_as_connection_failures(error: BaseException | None, counts: bool) -> None:
    assert is_connection_failure(error) is counts
