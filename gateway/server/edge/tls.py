"""TLS for the HTTPS transport: a self-signed certificate for first steps, and the server context.

``server_context`` is the only way the server builds its ``SSLContext``: TLS 1.2 is the floor (older
handshakes are refused by the server itself, whatever the client's library allows), and the
certificate and key are loaded once at startup so a bad file stops ``gateway serve`` before it binds.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.errors import ConfigError, InvalidArgument
from gateway.private_files import make_private_dirs, write_private

CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"


@dataclass(frozen=True)
class CertificatePaths:
    cert: Path
    key: Path


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server-side context with TLS >= 1.2 and the given PEM certificate chain and key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    try:
        context.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS certificate {cert} with key {key} ({exc}); check both paths "
                          "and that the key matches the certificate (`gateway cert create` makes a pair)"
                          ) from exc
    return context


def _subject_names(names: Sequence[str], ips: Sequence[str]) -> list[x509.GeneralName]:
    entries: list[x509.GeneralName] = []
    for name in names:
        if not name or any(c.isspace() for c in name) or "/" in name:
            raise InvalidArgument("name", f"{name!r} is not a DNS name")
        entries.append(x509.DNSName(name.lower()))
    for raw in ips:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(raw)))
        except ValueError as exc:
            raise InvalidArgument("ip", f"{raw!r} is not an IP address") from exc
    if not entries:
        raise InvalidArgument("name", "give at least one --name or --ip the clients will connect to")
    return entries


def build_certificate(
    names: Sequence[str], ips: Sequence[str] = (), *, days: int = 365, now: dt.datetime | None = None,
) -> tuple[bytes, bytes]:
    """A self-signed P-256 certificate for ``names`` and ``ips``; returns (cert PEM, key PEM)."""
    if not 1 <= days <= 3650:
        raise InvalidArgument("days", "must be between 1 and 3650")
    alt_names = _subject_names(names, ips)
    key = ec.generate_private_key(ec.SECP256R1())
    common = names[0] if names else ips[0]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common[:64])])
    start = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _write(path: Path, data: bytes, *, force: bool) -> None:
    try:
        write_private(path, data, replace=force)
    except FileExistsError as exc:
        raise InvalidArgument("out", f"{path} already exists; pass --force to replace it") from exc


def create_certificate(
    out_dir: Path, names: Sequence[str], ips: Sequence[str] = (), *, days: int = 365, force: bool = False,
) -> CertificatePaths:
    """Write ``cert.pem`` and ``key.pem`` (both 0600, like every file the gateway makes: hand the
    certificate to clients as a copy) into ``out_dir`` (created 0700 if missing)."""
    cert_pem, key_pem = build_certificate(names, ips, days=days)
    make_private_dirs(out_dir)
    paths = CertificatePaths(cert=out_dir / CERT_FILE, key=out_dir / KEY_FILE)
    if not force:
        for path in (paths.cert, paths.key):
            if path.exists():
                raise InvalidArgument("out", f"{path} already exists; pass --force to replace it")
    _write(paths.key, key_pem, force=force)
    _write(paths.cert, cert_pem, force=force)
    return paths
