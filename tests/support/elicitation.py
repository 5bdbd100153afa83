"""What the tests of confirmation by the person at the MCP client share: the rules, the person, the server.

Both revisions' end-to-end tests (``tests/guard/test_elicitation.py`` on the handshake revision,
``tests/server/edge/test_mcp_elicitation_2026.py`` on 2026-07-28) drive a delete on the simulator through
the real HTTPS server and the SDK's client with these."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mcp_types as types

from support.httpserver import Served, audit_rows, build_gateway, mcp_client, serve
from support.simulator import Simulator


def confirm_rules(confirm_by: str, *, approval: bool = False) -> dict[str, Any]:
    """Rules allowing everything, confirmed as ``confirm_by`` says (``approval``: a person approves too)."""
    return {"defaults": {"read": "allow", "write": "allow", "destructive": "allow",
                         "confirm_by": confirm_by, "require_web_approval": approval}}


@contextmanager
def served_with(tmp: Path, sim: Simulator, rules: dict[str, Any]) -> Iterator[Served]:
    """A gateway over ``sim`` with ``rules``, served over HTTPS until the block ends."""
    running = serve(tmp, build_gateway(tmp, sim, rules))
    try:
        yield running
    finally:
        running.stop()


class Person:
    """The person at the client: answers every elicitation with ``action`` and remembers what was asked."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.asked: list[types.ElicitRequestParams] = []

    async def __call__(self, _ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params)
        content = {} if self.action == "accept" and params.mode == "form" else None
        return types.ElicitResult(action=self.action, content=content)  # type: ignore[arg-type]


def asking(served: Served, person: Person, who: str = "alice", mode: str = "auto") -> Any:
    """``who``'s SDK client in ``mode`` (its default: auto), declaring elicitation; its person answers as
    ``person``."""
    return mcp_client(served, served.tokens[who], mode, elicitation_callback=person)


def delete_args(sim: Simulator, index: int = 0) -> tuple[str, dict[str, Any]]:
    """A VM of ``sim`` and the arguments of its delete."""
    vm = sim.vm_names()[index]
    return vm, {"target": "vc1", "vm": vm, "force_power_off": True}


def rows_of(served: Served, phase: str) -> list[dict[str, Any]]:
    """The audit rows of ``phase``."""
    return [r for r in audit_rows(served.gateway) if r.get("phase") == phase]
