"""A gateway built the way ``gateway serve`` builds it, over one fresh simulator (target ``vc1``), with a
clock the test moves; the callers, VM names and roles.yaml/token helpers the pipeline tests share. The
``env`` fixture (tests/conftest.py) hands one out and closes its gateways."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gateway.audit.query import read_rows
from gateway.auth.tokens import Principal, create_token
from gateway.server.runtime import Gateway
from gateway.settings import Settings
from gateway.vocabulary import Kind
from support.simulator import (
    Simulator,
    complete_rules,
    find_vm,
    pyvmomi_connect,
    read_properties,
    write_targets,
)

ADMIN = Principal(name="agent-a", role="admin", surface="test")
OTHER = Principal(name="agent-b", role="admin", surface="test")
READER = Principal(name="watcher", role="reader", surface="test")
HUMAN = Principal(name="alice", role="admin", surface="web", kind=Kind.PERSON)
VM0 = "DC0_C0_RP0_VM0"
VM1 = "DC0_C0_RP0_VM1"
PERMISSIVE = {"defaults": {"read": "allow", "write": "allow", "destructive": "allow"}}


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Env:
    """A gateway over one fresh simulator, built the way ``gateway serve`` builds it."""

    def __init__(self, tmp: Path, sim: Simulator) -> None:
        self.tmp, self.sim = tmp, sim
        self.clock = Clock()
        self.gateways: list[Gateway] = []

    def build(
        self,
        rules: Mapping[str, Any] | None = None,
        targets_extra: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> Gateway:
        env = write_targets(self.tmp / "targets.yaml", {"vc1": self.sim}, {"vc1": dict(targets_extra or {})})
        self.write_rules(PERMISSIVE if rules is None else rules)
        base = Settings.from_env({"GATEWAY_HOME": str(self.tmp), **env})
        values = {"enable_destructive": True, **settings}
        gw = Gateway.build(Settings(**{**base.__dict__, **values}))
        gw.clock = self.clock
        self.gateways.append(gw)
        return gw

    def write_rules(self, rules: Mapping[str, Any]) -> None:
        (self.tmp / "rules.yaml").write_text(yaml.safe_dump(complete_rules(rules)))

    def rows(self, **filters: Any) -> list[dict[str, Any]]:
        return read_rows(self.tmp / "audit.jsonl", **filters)

    def vm_exists(self, name: str) -> bool:
        si = pyvmomi_connect(self.sim)
        try:
            find_vm(si, name)
            return True
        except LookupError:
            return False

    def power_state(self, name: str) -> str:
        si = pyvmomi_connect(self.sim)
        return str(read_properties(si, find_vm(si, name), "runtime.powerState")["runtime.powerState"])


async def propose_delete(gw: Gateway, vm: str = VM0, who: Principal = ADMIN) -> dict[str, Any]:
    return await gw.calls.call(who, "delete_vm", {"target": "vc1", "vm": vm, "force_power_off": True})


def write_roles(home: Path, roles: dict[str, Any]) -> None:
    (home / "roles.yaml").write_text(yaml.safe_dump({"roles": roles}))
    os.chmod(home / "roles.yaml", 0o600)


def role(
    *, write: tuple[str, ...] = (), destructive: tuple[str, ...] = (), targets: Any = "*"
) -> dict[str, Any]:
    return {
        "tools": "read",
        "allow_write": list(write),
        "allow_destructive": list(destructive),
        "targets": targets,
        "approve": "none",
    }


def token_principal(gw: Gateway, name: str, role_name: str) -> Principal:
    """A principal backed by a real token record, as the HTTPS server would hand the pipeline."""
    _, rec = create_token(gw.store, name, role_name, expires_in=None, now=gw.clock())
    return Principal(name=rec.name, role=rec.role, token_id=rec.token_id, surface="https")
