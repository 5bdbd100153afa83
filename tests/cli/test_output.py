"""The CLI for scripts: ``--json`` shapes, ISO-8601 UTC times, and ``... | head`` ending quietly."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.simulator import complete_rules_text

from gateway.cli import main
from gateway.proposals import Proposal
from gateway.store.sqlite import SqliteStore

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("GATEWAY_HOME", "GATEWAY_TARGETS_FILE", "GATEWAY_RULES_FILE", "GATEWAY_ROLES_FILE",
                "GATEWAY_AUDIT_LOG", "GATEWAY_NOTIFICATIONS_FILE", "VC1_USER", "VC1_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "targets.yaml").write_text(yaml.safe_dump(
        {"targets": [{"name": "vc1", "host": "127.0.0.1", "port": 1443, "credential_env_prefix": "VC1",
                      "insecure": True}]}))
    (tmp_path / "rules.yaml").write_text(complete_rules_text("defaults: {destructive: allow}\n"))
    return tmp_path


def test_token_create_json(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "ci", "--role", "reader", "--expires-in", "1h", "--json",
                 "--home", str(home)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"token", "name", "kind", "role", "token_id", "expires"}
    assert out["token"].startswith("gwt_") and out["name"] == "ci" and out["role"] == "reader"
    assert out["kind"] == "agent" and ISO.match(out["expires"])


def test_token_list_long_shows_the_ids(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "ci", "--role", "reader", "--home", str(home)]) == 0
    token_id = capsys.readouterr().out.split("_")[1]
    assert main(["token", "list", "--long", "--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert "token_id" in out.splitlines()[0] and token_id in out


def test_roles_check_json(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (home / "roles.yaml").write_text("roles:\n  ops: {tools: read, allow_write: [power_of_vm], "
                                     "allow_destructive: [], targets: '*', approve: none}\n")
    (home / "roles.yaml").chmod(0o600)
    assert main(["roles", "check", "--json", "--home", str(home)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"ok", "problems", "roles_file", "custom_roles"}
    assert out["ok"] is False and any("power_of_vm" in p for p in out["problems"])
    assert out["roles_file"] == str(home / "roles.yaml")


def test_pending_list_json_without_credentials_with_iso_times(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    with SqliteStore(home / "state.db") as store:
        store.add_proposal(Proposal(
            id="p-1", token_hash="h", caller="agent-a", role="admin", surface="test", target="vc1",
            target_host="127.0.0.1:1443", tool="delete_vm", args={"vm": "VM0"}, args_digest="d",
            plan_summary="delete VM VM0", affected=[], plan_params={}, created_at=now - 60,
            expires_at=now + 300, state="pending", require_web_approval=True))
    assert main(["pending", "list", "--json", "--home", str(home)]) == 0  # no VC1_USER/VC1_PASSWORD
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["proposal_id"] == "p-1"
    assert ISO.match(row["created_at"]) and ISO.match(row["expires_at"])


def test_a_closed_pipe_ends_the_command_without_a_traceback(home: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the command writes anything (`| head` after its lines)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    proc = subprocess.run([sys.executable, "-m", "gateway", "roles", "list", "--json", "--home", str(home)],
                          stdout=write, stderr=subprocess.PIPE, text=True, env=env, timeout=60, check=False)
    os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 141
