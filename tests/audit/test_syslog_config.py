"""syslog.yaml (``gateway.audit.syslog_config``): strict, every problem located ``file:line:column``
with its fix, and checked by ``gateway check``."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.audit.syslog_config import DEFAULT_BACKLOG, load
from gateway.cli import main
from gateway.config import ConfigProblems


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "ca.pem").write_text("not read by the parser\n")
    path = tmp_path / "syslog.yaml"
    path.write_text(text)
    return path


def test_a_missing_file_forwards_nothing(tmp_path: Path) -> None:
    assert load(tmp_path / "syslog.yaml") is None


def test_a_good_file_with_defaults(tmp_path: Path) -> None:
    config = load(_write(tmp_path, "syslog:\n  host: siem.example.com\n  ca_file: ca.pem\n"))
    assert config is not None
    assert (config.host, config.port, config.transport) == ("siem.example.com", 6514, "tls")
    assert config.ca_file == tmp_path / "ca.pem"  # relative to the file
    assert (config.facility, config.sd_id, config.backlog) == (13, "audit@32473", DEFAULT_BACKLOG)


@pytest.mark.parametrize(("text", "expected"), [
    ("syslog:\n  host: siem\n  ca_file: ca.pem\n  colour: blue\n",
     "syslog.yaml:4:3: syslog: unknown key 'colour'"),
    ("syslog:\n  host: siem\n", "syslog.yaml:1:1: syslog.ca_file is required with transport tls"),
    ("syslog:\n  ca_file: ca.pem\n", "syslog.host is required"),
    ("syslog:\n  host: siem\n  ca_file: ca.pem\n  port: 70000\n",
     "syslog.yaml:4:3: syslog.port must be a port number (1-65535)"),
    ("syslog:\n  host: siem.example.com\n  transport: tcp\n",
     "syslog.yaml:3:3: syslog.transport: plain tcp sends audit rows unencrypted"),
    ("syslog:\n  host: siem\n  ca_file: missing.pem\n", "syslog.yaml:3:3: syslog.ca_file: "),
    ("syslog:\n  host: siem\n  ca_file: ca.pem\n  client_cert_file: ca.pem\n",
     "client_cert_file and client_key_file go together"),
    ("syslog:\n  host: siem\n  ca_file: ca.pem\n  sd_id: audit\n",
     "syslog.yaml:4:3: syslog.sd_id must be NAME@ENTERPRISE-NUMBER"),
    ("syslog:\n  host: siem\n  ca_file: ca.pem\n  backlog: 0\n", "syslog.yaml:4:3: syslog.backlog must be"),
    ("syslog:\n  host: siem\n  ca_file: ca.pem\n  facility: 24\n", "syslog.facility must be"),
    ("syslog:\n  host: siem\n  ca_file: ca.pem\n  hostname: two words\n", "syslog.hostname must be"),
    ("receivers: []\n", "the file must hold one top-level key, 'syslog:'"),
    ("syslog:\n  host: a\n  host: b\n", "syslog.yaml:3:3"),
])
def test_every_problem_is_located_with_its_fix(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigProblems) as caught:
        load(_write(tmp_path, text))
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


def test_plain_tcp_is_allowed_to_loopback(tmp_path: Path) -> None:
    config = load(_write(tmp_path, "syslog:\n  host: 127.0.0.1\n  transport: tcp\n  port: 5514\n"))
    assert config is not None and config.transport == "tcp" and config.ca_file is None


def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("VC1_USER", "u")
    monkeypatch.setenv("VC1_PASSWORD", "p")
    monkeypatch.delenv("GATEWAY_SYSLOG_FILE", raising=False)
    (tmp_path / "targets.yaml").write_text("targets:\n  - {name: vc1, host: h, credential_env_prefix: VC1}\n")
    return ["--home", str(tmp_path)]


def test_gateway_check_reports_a_bad_syslog_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = _home(tmp_path, monkeypatch)
    _write(tmp_path, "syslog:\n  host: siem\n  ca_file: ca.pem\n  port: zero\n")
    assert main(["check", *flags]) == 1
    assert f"{tmp_path / 'syslog.yaml'}:4:3: syslog.port must be a port number" in capsys.readouterr().err


def test_gateway_check_summarises_a_good_syslog_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = _home(tmp_path, monkeypatch)
    _write(tmp_path, "syslog:\n  host: siem.example.com\n  ca_file: ca.pem\n")
    assert main(["check", *flags]) == 0
    assert "syslog: audit rows forwarded to the syslog receiver siem.example.com:6514 (tls)" in \
        capsys.readouterr().out


def test_the_example_file_parses(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "syslog.example.yaml").read_text()
    (tmp_path / "siem-ca.pem").write_text("-\n")
    config = load(_write(tmp_path, text.replace("/etc/gateway/siem-ca.pem", str(tmp_path / "siem-ca.pem"))))
    assert config is not None and (config.host, config.transport) == ("siem.example.com", "tls")
