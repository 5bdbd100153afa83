"""gateway.cli.roles: ``gateway roles check`` and ``gateway roles list`` on real files."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import cli
from gateway.auth.roles import RoleBook
from gateway.auth.tokens import create_token
from gateway.cli import main, settings_from
from gateway.cli.roles import token_problems
from gateway.store import SqliteStore

OPS = {"tools": "read", "allow_write": ["power_on_vm"], "allow_destructive": [], "targets": ["lab-*"],
       "approve": "none"}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("GATEWAY_HOME", "GATEWAY_ROLES_FILE", "GATEWAY_AUDIT_LOG", "GATEWAY_TARGETS_FILE",
                "GATEWAY_RULES_FILE", "GATEWAY_DATABASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("roles",))
    return tmp_path / "home"


def write_roles(home: Path, roles: dict[str, Any]) -> Path:
    home.mkdir(mode=0o700, exist_ok=True)
    path = home / "roles.yaml"
    path.write_text(yaml.safe_dump({"roles": roles}))
    os.chmod(path, 0o600)
    return path


def run(home: Path, *argv: str) -> int:
    return main([*argv, "--home", str(home)])


def test_check_without_a_roles_file(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(home, "roles", "check") == 0
    assert capsys.readouterr().out == (f"{home / 'roles.yaml'} absent: built-in roles only; every usable "
                                       "token names a defined role\n")


def test_check_with_a_good_file(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_roles(home, {"ops": OPS})
    assert run(home, "roles", "check") == 0
    assert capsys.readouterr().out == (f"{home / 'roles.yaml'}: 1 custom role(s); every usable token names a "
                                       "defined role\n")


def test_check_json(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_roles(home, {"ops": OPS})
    assert run(home, "roles", "check", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "problems": [], "custom_roles": ["ops"],
                                                   "roles_file": str(home / "roles.yaml")}


def test_check_names_a_tool_that_does_not_exist(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_roles(home, {"ops": {**OPS, "allow_write": ["power_on_vmm"]}})
    assert run(home, "roles", "check", "--json") == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    (problem,) = out["problems"]
    assert "power_on_vmm" in problem


def test_a_broken_file_is_reported_not_each_token(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_roles(home, {"ops": {**OPS, "colour": "blue"}})
    assert run(home, "roles", "check") == 1
    out = capsys.readouterr().out
    assert "colour" in out
    assert "token " not in out


def test_a_token_with_an_undefined_role_is_named(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_roles(home, {"ops": OPS})
    with SqliteStore(home / "state.db") as store:
        create_token(store, "orphan", "ghost-role", expires_in=None, now=time.time())
        create_token(store, "fine", "ops", expires_in=None, now=time.time())
    assert run(home, "roles", "check") == 1
    assert capsys.readouterr().out == (
        "token 'orphan' has role 'ghost-role', which is not defined, so every call with it is refused; "
        f"define the role in {home / 'roles.yaml'} or run `gateway token set-role orphan ROLE`\n")


def test_token_problems_without_a_database_reads_nothing(home: Path) -> None:
    settings = settings_from(argparse.Namespace(home=str(home)))
    assert token_problems(settings, RoleBook(settings.roles_file)) == []
    assert not (home / "state.db").exists()


def test_token_problems_skip_tokens_that_cannot_be_used(home: Path) -> None:
    home.mkdir()
    with SqliteStore(home / "state.db") as store:
        create_token(store, "gone", "ghost-role", expires_in=1.0, now=time.time() - 10)
    settings = settings_from(argparse.Namespace(home=str(home)))
    assert token_problems(settings, RoleBook(settings.roles_file)) == []


def test_list_shows_builtin_and_custom_roles(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_roles(home, {"ops": OPS})
    assert run(home, "roles", "list", "--json") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_name = {row["name"]: row for row in rows}
    assert {"reader", "admin", "ops"} <= set(by_name)
    assert by_name["reader"]["source"] == "built-in"
    assert by_name["ops"]["source"] == str(home / "roles.yaml")
    assert by_name["ops"]["allow_write"] == ["power_on_vm"] and by_name["ops"]["targets"] == ["lab-*"]


def test_list_as_text(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_roles(home, {"ops": OPS})
    run(home, "roles", "list")
    out = capsys.readouterr().out
    assert f"ops  ({home / 'roles.yaml'})\n" in out
    assert "    allow_write: power_on_vm\n" in out
    assert "    allow_destructive: -\n" in out
    assert "reader  (built-in)\n" in out


def test_list_with_a_broken_file_says_custom_roles_are_off(home: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    write_roles(home, {"ops": {**OPS, "colour": "blue"}})
    assert run(home, "roles", "list") == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("see `gateway roles check`")
    assert "custom roles are off until roles.yaml is fixed (1 problem(s))" in out
