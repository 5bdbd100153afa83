"""``gateway cert create`` and the server's TLS context, on real files."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509

from gateway.cli import main
from gateway.errors import ConfigError, InvalidArgument
from gateway.server.edge.tls import build_certificate, create_certificate, server_context


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_creates_a_pair_with_private_key_and_requested_names(tmp_path: Path) -> None:
    paths = create_certificate(tmp_path / "tls", ["gw.example.com", "Localhost"], ["127.0.0.1", "::1"],
                               days=30)
    assert mode(paths.key) == 0o600 and mode(paths.cert) == 0o600 and mode(tmp_path / "tls") == 0o700
    cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert alt.get_values_for_type(x509.DNSName) == ["gw.example.com", "localhost"]
    ips = alt.get_values_for_type(x509.IPAddress)
    assert ips == [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == dt.timedelta(days=30)
    assert cert.not_valid_before_utc <= dt.datetime.now(dt.UTC) < cert.not_valid_after_utc
    assert b"PRIVATE KEY" in paths.key.read_bytes()


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> bool:
    """Whether ``client`` accepts ``server`` when connecting to ``name`` (over a socket pair)."""
    near, far = socket.socketpair()

    def serve() -> None:
        with contextlib.suppress(ssl.SSLError, OSError), server.wrap_socket(far, server_side=True):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with client.wrap_socket(near, server_hostname=name):
            return True
    except ssl.SSLCertVerificationError:
        return False
    finally:
        near.close()
        thread.join(10)
        far.close()


def test_a_client_trusting_the_certificate_verifies_the_names(tmp_path: Path) -> None:
    paths = create_certificate(tmp_path, ["gw.example.com"], ["127.0.0.1"])
    server = server_context(paths.cert, paths.key)
    client = ssl.create_default_context(cafile=str(paths.cert))
    assert _handshake(server, client, "gw.example.com")
    assert not _handshake(server, client, "other.example.com")


def test_existing_files_are_kept_unless_forced(tmp_path: Path) -> None:
    first = create_certificate(tmp_path, ["a.example.com"])
    before = first.cert.read_bytes()
    with pytest.raises(InvalidArgument, match="--force"):
        create_certificate(tmp_path, ["b.example.com"])
    assert first.cert.read_bytes() == before
    first.key.chmod(0o644)
    second = create_certificate(tmp_path, ["b.example.com"], force=True)
    assert second.cert.read_bytes() != before and mode(second.key) == 0o600


@pytest.mark.parametrize(("names", "ips", "days", "field"), [
    ([], [], 365, "name"),
    (["has space"], [], 365, "name"),
    (["ok.example.com"], ["300.1.1.1"], 365, "ip"),
    (["ok.example.com"], [], 0, "days"),
])
def test_bad_requests_name_the_field(names: list[str], ips: list[str], days: int, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        build_certificate(names, ips, days=days)
    assert info.value.details["field"] == field


def test_server_context_floor_is_tls_1_2(tmp_path: Path) -> None:
    paths = create_certificate(tmp_path, ["gw.example.com"])
    context = server_context(paths.cert, paths.key)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_mismatched_key_stops_startup_with_a_remedy(tmp_path: Path) -> None:
    one = create_certificate(tmp_path / "one", ["a.example.com"])
    two = create_certificate(tmp_path / "two", ["b.example.com"])
    with pytest.raises(ConfigError, match="gateway cert create"):
        server_context(one.cert, two.key)
    with pytest.raises(ConfigError):
        server_context(tmp_path / "missing.pem", one.key)


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tls"
    assert main(["cert", "create", "--name", "gw.example.com", "--ip", "127.0.0.1", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert str(out / "cert.pem") in printed.out and str(out / "key.pem") in printed.out
    assert "--public-name gw.example.com" in printed.err
    assert mode(out / "key.pem") == 0o600
    assert main(["cert", "create", "--name", "gw.example.com", "--out", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err
