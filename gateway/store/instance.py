"""Which gateway process holds an ``executing`` claim, and whether that process is still alive.

Each claiming process holds ``flock`` on ``<home>/instances/<id>.lock`` for life; the kernel drops it
however the process dies, so a dead claim is told from a live one at once, with no lease or clock.
A dead claim is settled as ``outcome_unknown`` when a gateway starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
from pathlib import Path
from typing import Final

from gateway.private_files import make_private_dirs, open_private

_DIR: Final = "instances"


class Instance:
    """This process's identity for claims, and the lock that proves it is alive (taken on first use)."""

    def __init__(self, home: Path) -> None:
        self.directory = Path(home) / _DIR
        self.id = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._fd: int | None = None
        # Two confirms may take the lock for the first time at once, from two worker threads: a
        # second flock on a second descriptor of the same file would conflict with the first.
        self._holding = threading.Lock()

    def acquire(self) -> str:
        """Hold the lock (idempotent, thread-safe); return the id to record on a claim."""
        with self._holding:
            if self._fd is None:
                make_private_dirs(self.directory)
                fd = open_private(self.directory / f"{self.id}.lock", os.O_RDWR | os.O_NOFOLLOW)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
        return self.id

    def close(self) -> None:
        with self._holding:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self.directory / f"{self.id}.lock")
                os.close(self._fd)
                self._fd = None

    def alive(self, instance_id: str) -> bool:
        """Whether the process that recorded ``instance_id`` still holds its lock."""
        if instance_id == self.id:
            return True
        path = self.directory / f"{os.path.basename(instance_id)}.lock"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()  # its owner is gone: tidy up
        return False
