"""The principals of the gateway's own host, which carry no token.

``os_person()`` is whoever runs the ``gateway`` command in a shell on the host (``gateway pending``,
``gateway token``): a person named ``os:<user>`` with the built-in ``admin`` role, since that user
already holds the gateway's credentials and state directory. Like any person they approve and deny
proposals, never their own.

The stdio caller (``gateway.server.edge.mcp.stdio_principal``, ``stdio:<user>``) is the desktop user's
*agent* session, not the person: what it proposes on a gated target waits for ``os:<user>`` (or a
person on the page) to approve it.
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
