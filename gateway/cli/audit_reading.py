"""What every ``gateway audit`` subcommand shares: the one audit reader, and reading a public key."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.audit.note import parse_verifier_key
from gateway.audit.readers import AuditReader
from gateway.audit.signing import parse_public_key
from gateway.backends import open_audit_reader
from gateway.cli import settings_from
from gateway.errors import AuditUnavailable, ConfigError, StateUnavailable
from gateway.settings import Settings


def public_key_arg(text: str) -> Ed25519PublicKey:
    """``ed25519:HEX`` (``gateway audit key``) or a note verifier key (``gateway audit key --note``)."""
    try:
        return parse_verifier_key(text)[1] if "+" in text else parse_public_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Failed:
    """Whether reading failed (the error was printed); truthy once it did."""

    def __init__(self) -> None:
        self.value = False

    def __bool__(self) -> bool:
        return self.value


@contextlib.contextmanager
def reading(args: argparse.Namespace, settings: Settings | None = None
            ) -> Iterator[tuple[AuditReader, _Failed]]:
    """The audit reader ``args`` name (file or table, chosen by ``open_audit_reader``); a read that fails
    prints why on stderr and marks ``failed`` instead of raising."""
    failed = _Failed()
    settings = settings or settings_from(args)
    try:
        with open_audit_reader(settings) as reader:
            try:
                yield reader, failed
            except OSError as exc:
                print(f"gateway: cannot read the audit log {reader.where}: {exc.strerror or exc}",
                      file=sys.stderr)
                failed.value = True
            except AuditUnavailable as exc:
                print(f"gateway: {exc.message}", file=sys.stderr)
                failed.value = True
    except (StateUnavailable, ConfigError) as exc:
        print(f"gateway: {exc.message}", file=sys.stderr)
        failed.value = True
