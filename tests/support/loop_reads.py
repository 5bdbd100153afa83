"""A guard over the whole suite: no configuration file is read on an event loop while it serves a request.

``rules.yaml`` (``PolicyStore._read``, on every look) and ``roles.yaml`` (``RoleBook.refresh``, behind
every ``get``: the file when it changed) are read by blocking calls. A request handled on the loop must
reach them only from a worker thread (``off_loop``), or the first call after an edit (every call, for the
rules) holds every other request behind a disk read, a YAML parse and the reload's audited fsync.
``install`` wraps both readers once; a read on a thread running an event loop, with a request's frames
(starlette, uvicorn, the MCP SDK's server) on its stack, is recorded, and ``found()`` hands the records to
the test that made them, which then fails. A read on a loop outside a request (a test's own set-up,
start-up, the CLI's ``asyncio.run``) is not a request's path and is not recorded. A server in a child
process is not watched: the in-process servers of the suite walk the same paths.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import gateway
from gateway.auth.roles import RoleBook
from gateway.guard.policy.store import PolicyStore

F = TypeVar("F", bound=Callable[..., Any])
#: the folders of the parts that serve a request on the loop
_SERVING: Final = ("/starlette/", "/uvicorn/", "/mcp/server/")
_PACKAGE: Final = str(Path(gateway.__file__).parent)
_seen: list[str] = []


def _serving_a_request() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False  # a worker thread: where these reads belong
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if any(part in name for part in _SERVING):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _guarded(what: str, read: F) -> F:
    @functools.wraps(read)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _serving_a_request():
            stack = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(_PACKAGE)]
            where = "\n".join(f"  {f.filename[len(_PACKAGE) - len('gateway'):]}:{f.lineno} {f.name}"
                              for f in stack[-8:])
            _seen.append(f"{what} read on the event loop while it served a request:\n{where}")
        return read(*args, **kwargs)

    return guarded  # type: ignore[return-value]


def install() -> None:
    """Wrap both readers (once)."""
    if getattr(RoleBook.refresh, "__wrapped__", None) is None:
        RoleBook.refresh = _guarded("roles.yaml", RoleBook.refresh)  # type: ignore[method-assign]
    if getattr(PolicyStore._read, "__wrapped__", None) is None:
        PolicyStore._read = _guarded("rules.yaml", PolicyStore._read)  # type: ignore[method-assign]


def found() -> list[str]:
    """The reads recorded since the last call (distinct), and forget them."""
    seen = list(dict.fromkeys(_seen))
    _seen.clear()
    return seen
