"""Settings: the environment is read once, flags win, unparseable safety switches fail safe."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.settings import Settings, parse_switch


def test_defaults_live_inside_home(tmp_path: Path) -> None:
    s = Settings.from_env({"GATEWAY_HOME": str(tmp_path)})
    assert s.targets_file == tmp_path / "targets.yaml"
    assert s.audit_log == tmp_path / "audit.jsonl"
    assert s.state_db == tmp_path / "state.db"
    assert not s.read_only and not s.enable_destructive


def test_flags_override_environment(tmp_path: Path) -> None:
    env = {
        "GATEWAY_HOME": str(tmp_path),
        "GATEWAY_RULES_FILE": "/env/rules.yaml",
        "GATEWAY_READ_ONLY": "false",
    }
    s = Settings.from_env(env, rules="/flag/rules.yaml", read_only=True)
    assert s.rules_file == Path("/flag/rules.yaml") and s.read_only


def test_credentials_are_collected_but_not_shown(tmp_path: Path) -> None:
    s = Settings.from_env({"GATEWAY_HOME": str(tmp_path), "VC1_USER": "u", "VC1_PASSWORD": "sekrit"})
    assert s.credentials["VC1_PASSWORD"] == "sekrit"
    assert "sekrit" not in repr(s)


@pytest.mark.parametrize(("raw", "expected"), [("true", True), ("On", True), ("0", False), ("no", False)])
def test_switch_values(raw: str, expected: bool) -> None:
    assert parse_switch("X", raw, default=not expected) is expected


def test_unparseable_read_only_counts_as_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        s = Settings.from_env({"GATEWAY_HOME": str(tmp_path), "GATEWAY_READ_ONLY": "ture"})
    assert s.read_only is True
    assert "GATEWAY_READ_ONLY" in caplog.text
