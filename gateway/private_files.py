"""Files and directories the gateway makes are its user's alone (0600, 0700), whatever the umask.

The mode is set at creation and tightened on the gateway's own descriptor, so a file is never readable
by others even for a moment; ``read_private`` refuses a secret file others could read. Never use these
on SQLite's files: closing any descriptor of a file drops the process's POSIX locks on it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Final

__all__ = ["DIR_MODE", "FILE_MODE", "UnsafeFile", "make_private_dirs", "open_private", "read_private",
           "write_private"]

FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700
#: what may be asked of ``write_private`` (a script the user runs is 0700)
_OWNER_ONLY: Final = frozenset({FILE_MODE, DIR_MODE})
#: the most ``read_private`` reads (a secret is small; a huge file is a mistake)
MAX_SECRET_BYTES: Final = 64 << 10


class UnsafeFile(Exception):
    """A secret file ``read_private`` refuses; the message names the file and the fix."""


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


def _refused_link(path: Path, what: str, error: OSError) -> UnsafeFile:
    try:
        target = f" (it points to {os.readlink(path)})"
    except OSError:
        target = ""
    if error.errno == errno.ELOOP:
        return UnsafeFile(f"{what} {path} is a loop of symbolic links{target}; fix: point it at a regular "
                          "file, or remove it")
    return UnsafeFile(f"{what} {path} is a symbolic link to nothing{target}; fix: point it at a regular "
                      "file, or remove the link")


def read_private(path: Path, what: str, *, max_bytes: int = MAX_SECRET_BYTES) -> bytes | None:
    """The content of the secret file ``path`` (``what`` names it in messages), or None when there is
    nothing at ``path``; ``UnsafeFile`` for a file that is not safe to trust (see the module docstring),
    ``OSError`` when it cannot be read."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):  # lstat found something: a dangling link or a loop
            raise _refused_link(path, what, exc) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{what} {path} is not a regular file; fix: point it at a regular file")
        if st.st_uid != os.geteuid():
            raise UnsafeFile(f"{what} {path} belongs to uid {st.st_uid}, not to the gateway's user "
                             f"(uid {os.geteuid()}); fix: chown it to that user and chmod 600 {path}")
        if st.st_mode & 0o077:
            raise UnsafeFile(f"{what} {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                             f"fix: chmod 600 {path}")
        data = os.read(fd, max_bytes + 1)  # a regular file: one read returns all of it up to the limit
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UnsafeFile(f"{what} {path} is larger than {max_bytes} bytes; fix: put only the secret in it")
    return data
