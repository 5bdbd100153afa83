"""The principals of the gateway's own host, which carry no token.

``os_person()`` (``os:<user>``, built-in ``admin``) is whoever runs ``gateway`` in a shell: that user
already holds the credentials and state. The stdio caller (``stdio:<user>``) is that user's *agent*,
so what it proposes on a gated target waits for ``os:<user>`` or a person on the page.
"""

from __future__ import annotations

import getpass
import os

from gateway.auth.tokens import Principal
from gateway.vocabulary import Kind

__all__ = ["os_person", "os_user"]


def os_user() -> str:
    """The name of the OS user running this process (``uid<N>`` when it has none)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid{os.getuid()}"


def os_person(surface: str = "cli") -> Principal:
    """The person at this host's shell: ``os:<user>``, role admin, kind person."""
    return Principal(name=f"os:{os_user()}", role="admin", surface=surface, kind=Kind.PERSON)
