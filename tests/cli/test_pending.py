"""``gateway pending`` and ``gateway --version`` through gateway.cli.main, on a real state store."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from support.simulator import complete_rules_text

from gateway.cli import main
from gateway.proposals import Proposal
from gateway.store.sqlite import SqliteStore

REPO = Path(__file__).resolve().parents[2]


def proposal(pid: str, state: str, **extra: object) -> Proposal:
    now = time.time()
    fields: dict[str, object] = dict(
        id=pid, token_hash=f"hash-{pid}", caller="agent-a", role="admin", surface="test", target="vc1",
        target_host="127.0.0.1:1443", tool="delete_vm", args={"vm": "VM0"}, args_digest=f"d-{pid}",
        plan_summary="delete VM VM0", affected=[], plan_params={}, created_at=now - 60,
        expires_at=now + 300, state=state, require_web_approval=True,
    )
    fields.update(extra)
    return Proposal(**fields)  # type: ignore[arg-type]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("GATEWAY_TARGETS_FILE", "GATEWAY_RULES_FILE", "GATEWAY_ROLES_FILE", "GATEWAY_AUDIT_LOG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("VC1_USER", "u")
    monkeypatch.setenv("VC1_PASSWORD", "p")
    (tmp_path / "targets.yaml").write_text(yaml.safe_dump(
        {"targets": [{"name": "vc1", "host": "127.0.0.1", "port": 1443, "credential_env_prefix": "VC1",
                      "insecure": True}]}))
    (tmp_path / "rules.yaml").write_text(
        complete_rules_text("defaults: {read: allow, write: allow, destructive: allow}\n"))
    with SqliteStore(tmp_path / "state.db") as store:
        store.add_proposal(proposal("p-waiting", "pending"))
        store.add_proposal(proposal("p-done", "pending"))
        assert store.transition("p-done", ["pending"], "executing")  # the lifecycle's only way to executed
        assert store.transition("p-done", ["executing"], "executed", decided_at=time.time(), outcome="ok",
                                approved_by="alice")
        store.add_proposal(proposal("p-denied", "pending"))
        assert store.transition("p-denied", ["pending"], "denied", decided_at=time.time(), approved_by="bob")
    return tmp_path


def test_pending_list_all_shows_decided_proposals_as_decided(
    home: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["pending", "list", "--all", "--home", str(home)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("p-")}
    assert "BLOCKED until approved" in lines["p-waiting"] and "expires in" in lines["p-waiting"]
    for pid, who in (("p-done", "alice"), ("p-denied", "bob")):
        assert "BLOCKED" not in lines[pid] and "expires in" not in lines[pid], lines[pid]
        assert f"decided by {who}" in lines[pid], lines[pid]
    assert "outcome ok" in lines["p-done"]


def test_the_os_user_cannot_approve_or_deny_its_own_proposal(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gateway pending`` acts as the person ``os:<user>``: a proposal made as that same principal is
    refused (audited with its reason code) and stays pending; the listing still shows it (it is theirs)."""
    monkeypatch.setenv("GATEWAY_ENABLE_DESTRUCTIVE", "1")  # delete_vm is served, so only the decision refuses
    me = f"os:{getpass.getuser()}"
    with SqliteStore(home / "state.db") as store:
        mine = f"system::{quote(me, safe='')}"  # the os user's key (``CallerKey.system``)
        store.add_proposal(proposal("p-mine", "pending", caller=me, caller_key=mine))
    capsys.readouterr()
    assert main(["pending", "approve", "p-mine", "--home", str(home)]) == 1
    approving = capsys.readouterr().err
    assert main(["pending", "deny", "p-mine", "--home", str(home)]) == 1
    denying = capsys.readouterr().err
    for err in (approving, denying):
        assert "forbidden" in err and "their own proposal" in err, err
    with SqliteStore(home / "state.db") as store:
        mine = store.get_proposal("p-mine")
    assert mine is not None and mine.state == "pending"
    rows = [json.loads(line) for line in (home / "audit.jsonl").read_text().splitlines()]
    refused = [(r["caller"], r["kind"], r["via"], r["reason_code"]) for r in rows
               if r.get("proposal_id") == "p-mine" and r.get("phase") == "denied"]
    assert refused == [(me, "person", "approve", "own_proposal"), (me, "person", "deny", "own_proposal")]
    assert main(["pending", "list", "--home", str(home)]) == 0
    assert "p-mine" in capsys.readouterr().out


def help_of(*argv: str) -> str:
    return subprocess.run([sys.executable, "-m", "gateway", *argv, "--help"], capture_output=True, text=True,
                          check=True, cwd=REPO).stdout


def test_pending_help_says_what_each_action_does() -> None:
    listing = help_of("pending")
    deny_line = next(line for line in listing.splitlines() if line.strip().startswith("deny"))
    assert "approve" not in deny_line and "never runs" in deny_line
    assert "executes" in next(line for line in listing.splitlines() if line.strip().startswith("approve"))
    deny = help_of("pending", "deny")
    assert "executes" not in deny and "never runs" in deny


def test_gateway_version_prints_the_package_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    result = subprocess.run([sys.executable, "-m", "gateway", "--version"], capture_output=True, text=True,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"gateway {version}"
