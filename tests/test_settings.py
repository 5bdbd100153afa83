"""Settings: the environment is read once, flags win, unparseable safety switches fail safe."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.errors import ConfigError
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


SECRET = "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29"


def _secret_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "request-state.secret"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_request_state_secret_is_read_from_the_variable_or_its_file(tmp_path: Path) -> None:
    home = {"GATEWAY_HOME": str(tmp_path)}
    assert Settings.from_env(home).request_state_secret is None  # unset: the store's secret alone
    from_env = Settings.from_env({**home, "GATEWAY_REQUEST_STATE_SECRET": SECRET})
    path = _secret_file(tmp_path, SECRET + "\n")  # a file's last newline is no part of it
    from_file = Settings.from_env({**home, "GATEWAY_REQUEST_STATE_SECRET_FILE": str(path)})
    assert from_env.request_state_secret == from_file.request_state_secret == SECRET.encode()
    assert SECRET not in repr(from_env) and SECRET not in repr(from_file)
    assert "GATEWAY_REQUEST_STATE_SECRET" not in from_env.notify_env  # no channel may sign with it
    assert "GATEWAY_REQUEST_STATE_SECRET" not in from_env.identity_env


@pytest.mark.parametrize(("value", "fix"), [
    ("too-short-a-secret", "at least 32"),
    ("", "at least 32"),  # set but empty is a mistake, never "no secret"
    ("   " + "x" * 20 + "   ", "at least 32"),
])
def test_a_short_request_state_secret_stops_the_start(tmp_path: Path, value: str, fix: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"GATEWAY_HOME": str(tmp_path), "GATEWAY_REQUEST_STATE_SECRET": value})
    assert fix in refused.value.message and "openssl rand -hex 32" in refused.value.message
    assert "GATEWAY_REQUEST_STATE_SECRET" in refused.value.message
    assert not value.strip() or value.strip() not in refused.value.message  # never the value


def test_a_request_state_secret_file_that_cannot_be_used_stops_the_start(tmp_path: Path) -> None:
    home = {"GATEWAY_HOME": str(tmp_path)}
    readable = _secret_file(tmp_path, SECRET, mode=0o644)
    cases = [
        ({"GATEWAY_REQUEST_STATE_SECRET_FILE": str(readable)}, "chmod 600"),
        ({"GATEWAY_REQUEST_STATE_SECRET_FILE": str(tmp_path / "absent")}, "does not exist"),
        ({"GATEWAY_REQUEST_STATE_SECRET_FILE": str(tmp_path)}, "not a regular file"),
        ({"GATEWAY_REQUEST_STATE_SECRET_FILE": str(readable), "GATEWAY_REQUEST_STATE_SECRET": SECRET},
         "set one of them"),
    ]
    for env, fix in cases:
        with pytest.raises(ConfigError) as refused:
            Settings.from_env({**home, **env})
        assert fix in refused.value.message, refused.value.message
        assert SECRET not in refused.value.message
    readable.chmod(0o600)
    readable.write_text("short\n")
    with pytest.raises(ConfigError) as short:
        Settings.from_env({**home, "GATEWAY_REQUEST_STATE_SECRET_FILE": str(readable)})
    assert "at least 32" in short.value.message and str(readable) in short.value.message
