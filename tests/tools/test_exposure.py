"""Exposure between all and read-only: ``serve --read-only --allow-write a,b`` (gateway.tools.exposure)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from gateway.auth.tokens import Principal
from gateway.errors import ConfigError
from gateway.server.runtime import Gateway
from gateway.settings import Settings
from gateway.tools.exposure import allow_write_names, write_tool_names
from gateway.tools.registry import build_registry
from gateway.vocabulary import Category


@pytest.mark.parametrize(("raw", "expected"), [
    ("create_snapshot", ("create_snapshot",)),
    (" create_snapshot , power_on_vm ,", ("create_snapshot", "power_on_vm")),
    ("power_on_vm,power_on_vm", ("power_on_vm",)),
])
def test_allow_write_names_parse(raw: str, expected: tuple[str, ...]) -> None:
    assert allow_write_names(raw) == expected


@pytest.mark.parametrize("raw", ["delete_vm", "list_vms", "create_snapshott", ""])
def test_allow_write_refuses_what_is_not_a_write_tool(raw: str) -> None:
    with pytest.raises(ValueError, match="create_snapshot") as caught:
        allow_write_names(raw)
    assert all(name in str(caught.value) for name in write_tool_names())


def test_read_only_with_allowed_writes_offers_reads_and_those_writes_only() -> None:
    registry = build_registry(destructive=True, read_only=True, allow_write=("create_snapshot",))
    changes = sorted(s.name for s in registry if s.kind is not Category.READ)
    assert changes == ["create_snapshot"]
    assert "power_on_vm" in registry.withheld and "delete_vm" in registry.withheld
    assert any(s.kind is Category.READ for s in registry)


def test_allowed_writes_without_read_only_are_refused() -> None:
    with pytest.raises(ConfigError, match="--read-only"):
        build_registry(destructive=False, read_only=False, allow_write=("create_snapshot",))


def test_a_server_offers_the_allowed_write(tmp_path: Path) -> None:
    (tmp_path / "targets.yaml").write_text("targets: []\n")
    settings = Settings.from_env({"GATEWAY_HOME": str(tmp_path)}, read_only=True,
                                 allow_write=("create_snapshot",))
    gateway = Gateway.build(settings)
    offered = gateway.facts.tools_for(Principal(name="root", role="admin"))
    anyio.run(gateway.close)
    assert sorted(s.name for s in offered if s.kind is not Category.READ) == ["create_snapshot"]


def test_serve_stops_with_exit_2_and_the_valid_names(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--read-only",
         "--allow-write", "create_snapshot,delete_vm", "--home", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert "'delete_vm' is not a write tool" in proc.stderr
    assert "power_on_vm" in proc.stderr and "Traceback" not in proc.stderr
