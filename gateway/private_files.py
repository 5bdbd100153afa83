"""Files and directories the gateway creates are its user's alone: files 0600, directories 0700,
whatever the umask and wherever they live (an audit log kept outside ``GATEWAY_HOME`` included).

The mode is given when the file is made and tightened on a descriptor the gateway opened itself, so a
file is never readable by others, not even for a moment. Existing directories are left as they are:
the gateway only decides the mode of what it makes (``gateway.store.sqlite.secure_directory`` tightens
the state directory it owns).

Never call these on SQLite's own files (the database, ``-wal``, ``-shm``): closing any descriptor of a
file drops every POSIX lock the process holds on it, and SQLite coordinates processes with such locks.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

__all__ = ["DIR_MODE", "FILE_MODE", "make_private_dirs", "open_private", "write_private"]

FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700
#: what may be asked of ``write_private`` (a script the user runs is 0700)
_OWNER_ONLY: Final = frozenset({FILE_MODE, DIR_MODE})


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and each missing parent at 0700; directories already there stay as they are."""
    missing: list[Path] = []
    current = Path(directory)
    while not os.path.lexists(current):
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            continue  # another process made it meanwhile; it decided its mode
        os.chmod(path, DIR_MODE)  # a umask such as 0o277 would have left it unusable


def open_private(path: Path, flags: int) -> int:
    """``os.open`` with ``O_CREAT``: a new file is 0600, an existing regular file of this user's that is
    wider than that is tightened (a device such as /dev/null, or another user's file, is left alone).
    Returns the descriptor (close-on-exec)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: bytes, *, replace: bool = True, mode: int = FILE_MODE) -> None:
    """Write ``data`` to ``path`` at ``mode`` (0600, or 0700 for a script); ``replace`` False refuses an
    existing file with ``FileExistsError``."""
    if mode not in _OWNER_ONLY:
        raise ValueError(f"{mode:o} is not an owner-only mode")
    flags = os.O_WRONLY | (os.O_TRUNC if replace else os.O_EXCL)
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), mode)  # the mode given to open() only applies to a new file
        handle.write(data)
