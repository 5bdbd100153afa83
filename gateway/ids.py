"""Short random ids naming tokens, proposals and web sessions: safe on a command line and inside a token."""

from __future__ import annotations

import secrets
from typing import Final

_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
ID_LENGTH: Final = 12


def new_id() -> str:
    """A short random id (12 lowercase letters/digits, ~62 bits): never starts with ``-`` on a command
    line and contains no ``_``, so it can sit between the separators of a token."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(ID_LENGTH))
