"""The seed's variable names (issue 34): set without their ``GATEWAY_*`` equivalent, each is named with the
variable to use, by ``gateway check`` (a warning; a problem with ``--strict``) and at ``gateway serve``'s
start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.simulator import complete_rules_text

from gateway.cli import main
from gateway.settings import seed_variables

TARGETS = "targets:\n  - {name: vc1, host: h, credential_env_prefix: VC1}\n"


@pytest.mark.parametrize(("environ", "named"), [
    ({"ENABLE_DESTRUCTIVE": "true"}, [("ENABLE_DESTRUCTIVE", "GATEWAY_ENABLE_DESTRUCTIVE")]),
    ({"POLICY_FILE": "/p.yaml"}, [("POLICY_FILE", "GATEWAY_RULES_FILE")]),
    ({"TARGETS_FILE": "/t.yaml"}, [("TARGETS_FILE", "GATEWAY_TARGETS_FILE")]),
    ({"AUDIT_LOG_PATH": "/a.jsonl"}, [("AUDIT_LOG_PATH", "GATEWAY_AUDIT_LOG")]),
    ({"DRY_RUN": "true"}, [("DRY_RUN", "GATEWAY_DRY_RUN")]),
    ({"WEB_UI_ENABLED": "true"}, [("WEB_UI_ENABLED", "GATEWAY_WEB_UI")]),
    ({"VMWARE_READ_ONLY": "true"}, [("VMWARE_READ_ONLY", "GATEWAY_READ_ONLY")]),
    ({"VMWARE_AIOPS_READ_ONLY": "1"}, [("VMWARE_AIOPS_READ_ONLY", "GATEWAY_READ_ONLY")]),
    ({"VMWARE_STORAGE_MCP_ALLOW_WRITE": "a"}, [("VMWARE_STORAGE_MCP_ALLOW_WRITE", "GATEWAY_ALLOW_WRITE")]),
    ({"VMWARE_STORAGE_MCP_EXPOSE": "read"}, [("VMWARE_STORAGE_MCP_EXPOSE", "GATEWAY_READ_ONLY")]),
    ({"ENABLE_DESTRUCTIVE": "true", "GATEWAY_ENABLE_DESTRUCTIVE": "false"}, []),  # ours is set: no word
    ({"DRY_RUN": "1", "POLICY_FILE": "/p"}, [("POLICY_FILE", "GATEWAY_RULES_FILE"),
                                             ("DRY_RUN", "GATEWAY_DRY_RUN")]),
    ({"GATEWAY_DRY_RUN": "true", "VC1_USER": "u"}, []),
])
def test_seed_variables_name_the_variable_to_use(environ: dict[str, str],
                                                 named: list[tuple[str, str]]) -> None:
    lines = seed_variables(environ)
    assert len(lines) == len(named), lines
    for line, (seed, ours) in zip(lines, named, strict=True):
        assert line.startswith(f"{seed} is set") and f"set {ours} instead" in line


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("GATEWAY_") or name in ("ENABLE_DESTRUCTIVE", "DRY_RUN", "POLICY_FILE"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("VC1_USER", "u")
    monkeypatch.setenv("VC1_PASSWORD", "p")
    (tmp_path / "targets.yaml").write_text(TARGETS)
    (tmp_path / "rules.yaml").write_text(complete_rules_text(""))
    return tmp_path


def test_check_names_gateway_enable_destructive_when_enable_destructive_is_set(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ENABLE_DESTRUCTIVE", "true")
    assert main(["check", "--home", str(home)]) == 0
    err = capsys.readouterr().err
    assert "warning: ENABLE_DESTRUCTIVE is set" in err and "set GATEWAY_ENABLE_DESTRUCTIVE instead" in err
    assert main(["check", "--strict", "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert "ENABLE_DESTRUCTIVE is set" in err and "GATEWAY_ENABLE_DESTRUCTIVE" in err and "1 problem" in err
    monkeypatch.setenv("GATEWAY_ENABLE_DESTRUCTIVE", "true")
    assert main(["check", "--strict", "--home", str(home)]) == 0
    assert "ENABLE_DESTRUCTIVE" not in capsys.readouterr().err


def test_check_json_lists_the_seed_variable(home: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import json

    monkeypatch.setenv("POLICY_FILE", "/etc/policy.yaml")
    assert main(["check", "--json", "--home", str(home)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any("POLICY_FILE" in w and "GATEWAY_RULES_FILE" in w for w in report["warnings"]), report


def test_check_refuses_a_bad_gateway_allow_write(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GATEWAY_READ_ONLY", "true")
    monkeypatch.setenv("GATEWAY_ALLOW_WRITE", "create_snapshott")
    assert main(["check", "--home", str(home)]) == 1
    assert "GATEWAY_ALLOW_WRITE='create_snapshott': 'create_snapshott' is not a write tool" in (
        capsys.readouterr().err)
    monkeypatch.setenv("GATEWAY_ALLOW_WRITE", "create_snapshot")
    assert main(["check", "--home", str(home)]) == 0
    monkeypatch.delenv("GATEWAY_READ_ONLY")
    assert main(["check", "--home", str(home)]) == 1
    assert "without GATEWAY_READ_ONLY=true" in capsys.readouterr().err


def test_serve_names_the_seed_variable_at_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--home", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
        env={**env, "DRY_RUN": "true"})  # no targets file: it stops after the warning
    assert "DRY_RUN is set, but this gateway does not read it: set GATEWAY_DRY_RUN instead" in proc.stderr


def test_check_help_names_every_file_it_checks(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["check", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        listed = " ".join(capsys.readouterr().out.split())
        assert all(f"{name}.yaml" in listed for name in ("targets", "rules", "roles", "notifications",
                                                         "identity", "syslog")), listed
