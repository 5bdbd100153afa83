"""gateway.cli.cert: ``gateway cert create`` writes a certificate and key and says how to serve with them."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509

from gateway import cli
from gateway.cli import main


@pytest.fixture(autouse=True)
def only_cert(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("cert",))


def test_create_writes_both_files_private(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "tls"
    assert main(["cert", "create", "--name", "gw.example", "--name", "localhost", "--out", str(out_dir)]) == 0
    out, err = capsys.readouterr()
    assert out == (f"certificate: {out_dir / 'cert.pem'}\n"
                   f"key:         {out_dir / 'key.pem'} (both mode 0600)\n")
    assert err == (f"serve with: gateway serve --transport https --cert {out_dir / 'cert.pem'} --key "
                   f"{out_dir / 'key.pem'} --public-name gw.example --public-name localhost\n")
    for name in ("cert.pem", "key.pem"):
        assert stat.S_IMODE((out_dir / name).stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((out_dir / "cert.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["gw.example", "localhost"]


def test_the_hint_names_the_ips_when_no_name_is_given(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cert", "create", "--ip", "127.0.0.1", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().err.rstrip().endswith("--public-name 127.0.0.1")


def test_existing_files_are_kept_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["cert", "create", "--name", "a", "--out", str(tmp_path)])
    before = (tmp_path / "cert.pem").read_bytes()
    capsys.readouterr()
    assert main(["cert", "create", "--name", "b", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"gateway: invalid_argument: out: {tmp_path / 'cert.pem'} already "
                                       "exists; pass --force to replace it\n")
    assert (tmp_path / "cert.pem").read_bytes() == before


def test_force_replaces_them(tmp_path: Path) -> None:
    main(["cert", "create", "--name", "a", "--out", str(tmp_path)])
    before = (tmp_path / "cert.pem").read_bytes()
    assert main(["cert", "create", "--name", "b", "--out", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "cert.pem").read_bytes() != before


def test_out_is_required(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["cert", "create", "--name", "a"])
    assert raised.value.code == 2


def test_days_set_the_validity(tmp_path: Path) -> None:
    main(["cert", "create", "--name", "a", "--out", str(tmp_path), "--days", "10"])
    cert = x509.load_pem_x509_certificate((tmp_path / "cert.pem").read_bytes())
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days in (10, 11)
