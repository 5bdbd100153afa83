"""The runaway breaker counts every identical change a caller sends, the ones its role refuses too."""

from __future__ import annotations

import pytest
from support.gateway_env import VM0, Env, token_principal

from gateway.errors import NotFound, RateLimited

pytestmark = pytest.mark.anyio


async def test_a_role_refused_change_repeated_trips_the_runaway_breaker(env: Env) -> None:
    gw = env.build()
    reader = token_principal(gw, "looping-agent", "reader")
    call = {"target": "vc1", "vm": VM0}
    for _ in range(5):  # the breaker's default: five identical changes a minute
        with pytest.raises(NotFound):  # a reader is not offered the tool: refused at the gate
            await gw.calls.call(reader, "power_off_vm", call)
    with pytest.raises(RateLimited, match="runaway protection"):
        await gw.calls.call(reader, "power_off_vm", call)
    assert env.power_state(VM0) == "poweredOn"
    limited = [r for r in env.rows(caller="looping-agent") if r.get("error_code") == "rate_limited"]
    assert len(limited) == 1 and limited[0]["phase"] == "denied"
