"""``gateway check`` refuses what ``serve`` refuses, in one round, without needing the targets' secrets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.simulator import complete_rules_text

from gateway.cli import main

TARGETS = "targets:\n  - {name: vc1, host: h, credential_env_prefix: VC1}\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("VC1_USER", "VC1_PASSWORD", "GATEWAY_RULES_FILE", "GATEWAY_ROLES_FILE",
                 "GATEWAY_TARGETS_FILE", "GATEWAY_NOTIFICATIONS_FILE", "GATEWAY_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VC1_USER", "u")
    monkeypatch.setenv("VC1_PASSWORD", "p")
    (tmp_path / "targets.yaml").write_text(TARGETS)
    (tmp_path / "rules.yaml").write_text(complete_rules_text(""))
    return tmp_path


def test_check_refuses_the_notifications_file_serve_refuses(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "notifications.yaml").write_text(
        "notifications:\n  channels:\n"
        "    - {name: a, kind: pager, url: https://h.example/x}\n"
        "    - {name: b, kind: chat, url: https://h.example/y, colour: red}\n"
        "    - {name: c, kind: chat, url: http://hooks.example.com/z}\n")
    assert main(["check", "--home", str(home)]) == 1
    err = capsys.readouterr().err
    path = home / "notifications.yaml"
    assert f"{path}:3:17: notifications.channels[0] (a): 'kind' must be one of webhook, chat" in err
    assert f"{path}:4:55: notifications.channels[1] (b): unknown key 'colour'" in err
    assert f"{path}:5:29: notifications.channels[2] (c): 'url' must use https://" in err


def test_check_refuses_a_ca_file_that_does_not_exist(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (home / "targets.yaml").write_text(TARGETS.replace("}", ", ca_file: /nonexistent/ca.pem}"))
    assert main(["check", "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert "ca_file '/nonexistent/ca.pem' does not exist" in err and "targets.yaml:2:" in err


@pytest.mark.parametrize("argv", [["check"], ["policy", "show"]])
def test_a_mistyped_rules_path_is_an_error_not_the_defaults(
    home: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert main([*argv, "--home", str(home), "--rules", str(home / "rulez.yaml")]) == 1
    captured = capsys.readouterr()
    assert f"{home / 'rulez.yaml'}: does not exist" in captured.err + captured.out


def test_check_lints_without_the_targets_credentials_unless_asked(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VC1_PASSWORD")
    assert main(["check", "--home", str(home)]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "VC1_PASSWORD" in err
    assert main(["check", "--home", str(home), "--require-credentials"]) == 1
    assert "VC1_PASSWORD" in capsys.readouterr().err


def test_a_duplicate_key_does_not_hide_the_files_other_problems(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "targets.yaml").write_text(
        "targets:\n  - name: vc1\n    host: h\n    host: h2\n    credential_env_prefix: VC1\n"
        "    colour: red\n  - {name: vc2, host: h, credential_env_prefix: VC1, pool_size: '4'}\n")
    assert main(["check", "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert "the key 'host' appears twice" in err
    assert "unknown key 'colour'" in err
    assert "'pool_size' must be int, got str; write a whole number without quotes, e.g. pool_size: 4" in err


def test_check_json_has_a_stable_shape(home: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VC1_USER")
    (home / "roles.yaml").write_text("roles: {ops: {colour: red}}\n")
    (home / "roles.yaml").chmod(0o600)
    assert main(["check", "--home", str(home), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"ok", "problems", "warnings", "files"}
    assert report["ok"] is False
    assert any("colour" in p for p in report["problems"])
    assert any("VC1_USER" in w for w in report["warnings"])
    files = {f["file"]: f for f in report["files"]}
    assert set(files) == {"targets", "rules", "roles", "notifications"}
    assert files["targets"]["status"] == "ok" and files["roles"]["status"] == "error"
    assert files["notifications"]["status"] == "absent"
    assert files["rules"]["path"] == str(home / "rules.yaml")



def test_serve_warns_of_a_mistyped_rules_path(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    """serve still starts (the built-in defaults are the strict ones; an image may name optional files
    in its environment), but says which named file is missing."""
    import anyio

    from gateway.server.runtime import Gateway
    from gateway.settings import Settings

    settings = Settings.from_env({"GATEWAY_HOME": str(home), "VC1_USER": "u", "VC1_PASSWORD": "p"},
                                 rules=str(home / "rulez.yaml"))
    gateway = Gateway.build(settings)
    anyio.run(gateway.close)
    assert any("rulez.yaml: does not exist" in r.getMessage() and r.levelname == "WARNING"
               for r in caplog.records)
