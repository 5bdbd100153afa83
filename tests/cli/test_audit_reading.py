"""gateway.cli.audit_reading: public keys in either printed form, and reading errors printed, not raised."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gateway.audit.note import verifier_key
from gateway.audit.signing import public_key_text
from gateway.cli.audit_reading import public_key_arg, reading
from gateway.errors import AuditUnavailable
from gateway.settings import Settings

KEY = Ed25519PrivateKey.generate().public_key()


def raw(key: object) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)  # type: ignore[attr-defined]


@pytest.mark.parametrize("text", [public_key_text(KEY), verifier_key("gw.example/audit", KEY)])
def test_either_printed_form_is_the_key(text: str) -> None:
    assert raw(public_key_arg(text)) == raw(KEY)


@pytest.mark.parametrize("text", ["", "ed25519:", "ed25519:zz", "rsa:abcd", "name+0000+AAAA",
                                  public_key_text(KEY)[:-2]])
def test_anything_else_is_a_usage_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        public_key_arg(text)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.from_env({}, home=str(tmp_path / "home"))


def test_reading_yields_the_reader_and_no_failure(settings: Settings) -> None:
    with reading(argparse.Namespace(), settings) as (reader, failed):
        assert reader is not None
    assert not failed


def test_an_os_error_while_reading_is_printed(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    with reading(argparse.Namespace(), settings) as (reader, failed):
        where = reader.where
        raise PermissionError(13, "Permission denied")
    assert failed
    assert capsys.readouterr().err == f"gateway: cannot read the audit log {where}: Permission denied\n"


def test_an_unavailable_audit_is_printed(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    with reading(argparse.Namespace(), settings) as (_reader, failed):
        raise AuditUnavailable("the audit table cannot be read")
    assert failed
    assert capsys.readouterr().err == "gateway: the audit table cannot be read\n"


def test_other_errors_propagate(settings: Settings) -> None:
    with pytest.raises(KeyError), reading(argparse.Namespace(), settings):
        raise KeyError("a bug")


def test_settings_come_from_the_flags_when_not_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY_AUDIT_LOG", raising=False)
    monkeypatch.delenv("GATEWAY_DATABASE_URL", raising=False)
    log = tmp_path / "elsewhere.jsonl"
    with reading(argparse.Namespace(home=str(tmp_path / "h"), audit_log=str(log))) as (reader, failed):
        assert str(log) in str(reader.where)
    assert not failed
