"""Configuration-load audit rows (gateway.server.base.reloads): a CLI run writes one only on a real change,
and a roles.yaml whose load cannot be audited does not take effect (the roles before stay)."""

from __future__ import annotations

import anyio
import pytest
import yaml
from support.gateway_env import Env, role, write_roles
from support.simulator import complete_rules_text

from gateway.cli import main
from gateway.server.base.reloads import PHASE

pytestmark = pytest.mark.anyio


def config_rows(env: Env, file: str) -> list[dict[str, object]]:
    return [r for r in env.rows(phase=PHASE) if r.get("file") == file]


async def test_a_cli_run_writes_a_config_row_only_when_the_file_changed(
    env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = env.build()  # targets.yaml and rules.yaml as `serve` would have them; its start rows written
    await gw.close()
    env.gateways.remove(gw)
    write_roles(env.tmp, {"ops": role(write=("power_on_vm",))})
    for var in ("GATEWAY_TARGETS_FILE", "GATEWAY_RULES_FILE", "GATEWAY_ROLES_FILE", "GATEWAY_AUDIT_LOG",
                "GATEWAY_NOTIFICATIONS_FILE"):
        monkeypatch.delenv(var, raising=False)
    before = {f: len(config_rows(env, f)) for f in ("targets", "rules", "roles")}
    for _ in range(3):
        assert await anyio.to_thread.run_sync(main, ["pending", "list", "--home", str(env.tmp)]) == 0
    after = {f: len(config_rows(env, f)) for f in ("targets", "rules", "roles")}
    assert after == {"targets": before["targets"], "rules": before["rules"], "roles": before["roles"] + 1}
    write_roles(env.tmp, {"ops": role(write=("power_on_vm", "power_off_vm"))})
    assert await anyio.to_thread.run_sync(main, ["pending", "list", "--home", str(env.tmp)]) == 0
    assert len(config_rows(env, "roles")) == before["roles"] + 2
    (env.tmp / "rules.yaml").write_text(complete_rules_text("defaults: {write: allow}\n"))
    assert await anyio.to_thread.run_sync(main, ["pending", "list", "--home", str(env.tmp)]) == 0
    assert len(config_rows(env, "rules")) == before["rules"] + 1
    capsys.readouterr()


async def test_a_roles_load_the_audit_cannot_record_keeps_the_roles_before(env: Env) -> None:
    write_roles(env.tmp, {"ops": role(write=("power_on_vm",))})
    gw = env.build()
    ops = gw.roles.get("ops")
    assert ops is not None and ops.allow_write == frozenset({"power_on_vm"})
    audit = env.tmp / "audit.jsonl"
    audit.rename(env.tmp / "audit.saved")
    audit.mkdir()  # a directory where the log should be: every append fails, even as root
    write_roles(env.tmp, {"ops": role(write=("power_on_vm", "power_off_vm"))})
    kept = gw.roles.get("ops")  # the widening is not audited, so it does not apply
    assert kept is not None and kept.allow_write == frozenset({"power_on_vm"})
    audit.rmdir()
    (env.tmp / "audit.saved").rename(audit)
    widened = gw.roles.get("ops")
    assert widened is not None and "power_off_vm" in widened.allow_write
    assert yaml.safe_load((env.tmp / "roles.yaml").read_text())["roles"]["ops"]["allow_write"][-1] == \
        "power_off_vm"
