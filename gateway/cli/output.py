"""What every command's output shares: JSON for scripts, ISO-8601 UTC times, a closed pipe ending quietly."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

#: the exit status of a command whose reader closed the pipe (128 + SIGPIPE, as shell tools end)
BROKEN_PIPE_STATUS: Final = 141


def iso_utc(stamp: float | None) -> str | None:
    """``2026-12-01T12:00:00Z`` for a unix time (None stays None), as the webhooks write times. Pure."""
    return None if stamp is None else datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def print_json(value: Any, *, one_line: bool = False) -> None:
    """One JSON document on stdout (``one_line``: compact, for one-object-per-line listings)."""
    print(json.dumps(value, sort_keys=True, default=str) if one_line
          else json.dumps(value, indent=2, sort_keys=True, default=str))


def quiet_on_broken_pipe(run: Callable[[], int]) -> int:
    """``run()`` and flush stdout; when the reader has gone, point stdout at /dev/null (so the
    interpreter's own flush at exit cannot fail again) and return ``BROKEN_PIPE_STATUS``."""
    try:
        status = run()
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return BROKEN_PIPE_STATUS
