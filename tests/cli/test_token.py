"""``gateway token`` and ``gateway roles`` through gateway.cli.main, on real files."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import yaml
from support.gateway_env import PERMISSIVE, VM0, Env, token_principal

from gateway import cli
from gateway.audit.verify import verify
from gateway.auth.tokens import TokenAuthenticator, create_token
from gateway.cli import main
from gateway.store import SqliteStore

TOKEN_RE = re.compile(r"gwt_[a-z0-9]{12}_[A-Za-z0-9_-]{43}")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("GATEWAY_HOME", "GATEWAY_ROLES_FILE", "GATEWAY_AUDIT_LOG", "GATEWAY_TARGETS_FILE"):
        monkeypatch.delenv(var, raising=False)
    # only the command groups under test: the others' imports must not decide these tests
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("token", "roles"))
    return tmp_path / "home"


def run(home: Path, *argv: str) -> int:
    return main([*argv, "--home", str(home)])


def create(home: Path, capsys: pytest.CaptureFixture[str], name: str = "ci", role: str = "reader",
           *extra: str) -> str:
    capsys.readouterr()
    assert run(home, "token", "create", name, "--role", role, *extra) == 0
    return capsys.readouterr().out


def audit_rows(home: Path) -> list[dict[str, object]]:
    """The rows about tokens (a command that builds the gateway also audits the configuration it loads)."""
    path = home / "audit.jsonl"
    assert verify(path).ok
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row for row in rows if row.get("phase") != "config_reload"]


def write_roles(home: Path, roles: dict[str, object]) -> None:
    home.mkdir(mode=0o700, exist_ok=True)
    path = home / "roles.yaml"
    path.write_text(yaml.safe_dump({"roles": roles}))
    os.chmod(path, 0o600)


OPS = {"tools": "read", "allow_write": ["power_on_vm"], "allow_destructive": [], "targets": ["lab-*"],
       "approve": "none"}


def test_create_prints_only_the_token_and_it_verifies(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = create(home, capsys, "ci", "reader", "--expires-in", "30d")
    assert TOKEN_RE.fullmatch(out.rstrip("\n")) and out.count("\n") == 1
    with SqliteStore(home / "state.db") as store:
        principal = TokenAuthenticator(store).verify(out.strip())
        rec = store.token_by_name("ci")
    assert principal is not None and (principal.name, principal.role) == ("ci", "reader")
    assert rec is not None and rec.expires_at is not None
    assert rec.expires_at - rec.created_at == 30 * 86400
    (row,) = audit_rows(home)
    assert row["phase"] == "token_created" and row["surface"] == "cli"
    assert str(row["caller"]).startswith("os:") and row["kind"] == "person"
    assert (row["token_name"], row["role"], row["token_kind"]) == ("ci", "reader", "agent")
    secret = out.strip()[17:]  # after "gwt_<id>_"
    assert secret not in (home / "audit.jsonl").read_text()


def test_create_refuses_an_unknown_role(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(home, "token", "create", "ci", "--role", "superuser") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "invalid_argument" in captured.err and "'superuser' is not a defined role" in captured.err
    assert "reader" in captured.err and "admin" in captured.err
    with SqliteStore(home / "state.db") as store:
        assert store.list_tokens() == []


def test_create_accepts_a_custom_role_and_explains_a_broken_file(home: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    write_roles(home, {"vm-operator": OPS})
    assert TOKEN_RE.fullmatch(create(home, capsys, "lab", "vm-operator").strip())
    write_roles(home, {"vm-operator": {**OPS, "approve": "sometimes"}})
    assert run(home, "token", "create", "lab2", "--role", "vm-operator") == 1
    assert "roles.yaml is broken" in capsys.readouterr().err


def test_create_refuses_a_duplicate_name_and_a_bad_lifetime(home: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    create(home, capsys)
    assert run(home, "token", "create", "ci", "--role", "admin") == 1
    assert "already exists" in capsys.readouterr().err
    assert run(home, "token", "create", "other", "--role", "admin", "--expires-in", "forever") == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "30d" in captured.err


def test_list_never_shows_a_secret_or_hash(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = [create(home, capsys, "ci", "reader").strip(),
              create(home, capsys, "ops", "admin", "--expires-in", "1h").strip()]
    assert run(home, "token", "list") == 0
    table = capsys.readouterr().out
    assert run(home, "token", "list", "--json") == 0
    lines = capsys.readouterr().out
    for text in (table, lines):
        assert "ci" in text and "ops" in text and "admin" in text
        assert "$argon2" not in text
        for token in tokens:
            assert token[17:] not in text
    rows = [json.loads(line) for line in lines.splitlines()]
    assert [r["name"] for r in rows] == ["ci", "ops"]
    assert {r["state"] for r in rows} == {"active"}
    assert rows[0]["expires"] is None and rows[1]["expires"] is not None
    assert all("hash" not in r for r in rows)


def test_revoke_applies_to_a_running_verifier(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = create(home, capsys).strip()
    with SqliteStore(home / "state.db") as store:
        verifier = TokenAuthenticator(store)
        assert verifier.verify(token) is not None
        assert run(home, "token", "revoke", "ci") == 0
        assert verifier.verify(token) is None
    assert "revoked" in capsys.readouterr().out
    assert run(home, "token", "revoke", "ci") == 0  # idempotent, no second audit row
    assert "already revoked" in capsys.readouterr().out
    assert run(home, "token", "list", "--json") == 0
    assert json.loads(capsys.readouterr().out)["state"] == "revoked"
    assert [r["phase"] for r in audit_rows(home)] == ["token_created", "token_revoked"]
    assert run(home, "token", "revoke", "ghost") == 1
    assert "not_found" in capsys.readouterr().err


def test_set_role(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = create(home, capsys).strip()
    with SqliteStore(home / "state.db") as store:
        verifier = TokenAuthenticator(store)
        assert verifier.verify(token).role == "reader"  # type: ignore[union-attr]
        assert run(home, "token", "set-role", "ci", "admin") == 0
        assert verifier.verify(token).role == "admin"  # type: ignore[union-attr]
    assert run(home, "token", "set-role", "ci", "nobody") == 1
    assert "not a defined role" in capsys.readouterr().err
    rows = audit_rows(home)
    assert rows[-1]["phase"] == "token_role_changed"
    assert (rows[-1]["role"], rows[-1]["old_role"]) == ("admin", "reader")
    run(home, "token", "revoke", "ci")
    assert run(home, "token", "set-role", "ci", "reader") == 1


def test_tokens_are_agents_unless_made_a_persons(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    agent = create(home, capsys, "bot", "admin").strip()
    person = create(home, capsys, "alice", "admin", "--kind", "person").strip()
    assert run(home, "token", "list") == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["name", "kind", "role"]
    assert [line.split()[:3] for line in lines] == [["alice", "person", "admin"], ["bot", "agent", "admin"]]
    with SqliteStore(home / "state.db") as store:
        verifier = TokenAuthenticator(store)
        assert verifier.verify(agent).kind == "agent"  # type: ignore[union-attr]
        assert verifier.verify(person).kind == "person"  # type: ignore[union-attr]
        assert run(home, "token", "set-kind", "bot", "person") == 0
        assert verifier.verify(agent).kind == "person"  # type: ignore[union-attr]
        assert run(home, "token", "set-kind", "bot", "agent") == 0
        again = verifier.verify(agent)
        assert again is not None and again.kind == "agent", "a kind change applies from the next request"
    assert "now of kind agent (was person)" in capsys.readouterr().out
    changes = [r for r in audit_rows(home) if r["phase"] == "token_kind_changed"]
    assert [(r["token_name"], r["token_kind"], r["old_kind"], r["kind"]) for r in changes] == [
        ("bot", "person", "agent", "person"), ("bot", "agent", "person", "person")]
    with pytest.raises(SystemExit):
        run(home, "token", "create", "x", "--role", "admin", "--kind", "robot")
    assert "invalid choice: 'robot'" in capsys.readouterr().err
    assert run(home, "token", "set-kind", "ghost", "person") == 1


def test_roles_check(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(home, "roles", "check") == 0
    assert "built-in roles only" in capsys.readouterr().out
    write_roles(home, {"vm-operator": OPS})
    create(home, capsys, "lab", "vm-operator")
    assert run(home, "roles", "check") == 0
    assert "1 custom role" in capsys.readouterr().out
    with SqliteStore(home / "state.db") as store:
        create_token(store, "orphan", "ghost-role", expires_in=None, now=time.time())
    assert run(home, "roles", "check") == 1
    out = capsys.readouterr().out
    assert "'orphan'" in out and "'ghost-role'" in out and "'lab'" not in out
    write_roles(home, {"vm-operator": {**OPS, "colour": "red"}})
    assert run(home, "roles", "check") == 1
    assert "unknown key 'colour'" in capsys.readouterr().out


def test_roles_list(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_roles(home, {"vm-operator": OPS})
    assert run(home, "roles", "list", "--json") == 0
    rows = {r["name"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert set(rows) == {"reader", "admin", "vm-operator"}
    assert rows["reader"]["source"] == "built-in"
    assert rows["vm-operator"]["allow_write"] == ["power_on_vm"]
    assert rows["vm-operator"]["targets"] == ["lab-*"]
    assert run(home, "roles", "list") == 0
    text = capsys.readouterr().out
    assert "vm-operator" in text and "allow_write: power_on_vm" in text


# ---------------------------------------------------------------- token revoke cancels the token's proposals


@pytest.mark.anyio
async def test_gateway_token_revoke_cancels_the_tokens_proposals(
    env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import anyio
    from support.simulator import write_targets

    from gateway.cli import main

    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}})
    agent = token_principal(gw, "agent-r", "admin")
    proposal = await gw.calls.call(agent, "delete_vm", {"target": "vc1", "vm": VM0, "force_power_off": True})
    for key, value in write_targets(env.tmp / "targets.yaml", {"vc1": env.sim}).items():
        monkeypatch.setenv(key, value)
    assert await anyio.to_thread.run_sync(main, ["token", "revoke", "agent-r", "--home", str(env.tmp)]) == 0
    assert proposal["proposal_id"] in capsys.readouterr().out
    p = gw.store.get_proposal(proposal["proposal_id"])
    assert p is not None and p.state == "cancelled"
    (row,) = env.rows(phase="token_revoked")
    assert row["cancelled_proposals"] == [proposal["proposal_id"]] and row["caller"].startswith("os:")
