"""SIGHUP re-reads the configuration files the gateway re-reads while it runs, instead of ending it.

``systemctl reload`` (the unit's ``ExecReload=/bin/kill -HUP $MAINPID``) and ``kill -HUP PID`` send it.
rules.yaml and roles.yaml are read again at once (``Gateway.reload_files``), each new content one
``config_reload`` audit row as for any reload (gateway/server/base/reloads.py); an unchanged file writes
nothing. targets.yaml and notifications.yaml are read at start only: a change there needs a restart
(``systemctl restart``), which the log line of every SIGHUP says.

The signal handler only starts a worker thread, so the event loop never reads a file; two signals in
a row run one reload after the other.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Protocol

log = logging.getLogger(__name__)


class Reloadable(Protocol):
    def reload_files(self) -> None: ...


class Hangup:
    """Reloads ``gateway``'s files in a worker thread for each SIGHUP while installed."""

    def __init__(self, gateway: Reloadable) -> None:
        self.gateway = gateway
        self._lock = threading.Lock()
        self._previous: Callable[[int, FrameType | None], object] | int | None = None

    def reload(self) -> None:
        """Re-read the files now (blocking; the signal handler calls it in a worker thread)."""
        with self._lock:
            log.info("SIGHUP: re-reading rules.yaml and roles.yaml (targets.yaml and notifications.yaml "
                     "are read at start only: restart the gateway for a change there)")
            try:
                self.gateway.reload_files()
            except Exception:  # a reload must never end the process; the file's own row says what failed
                log.exception("SIGHUP: re-reading the configuration files failed")

    def _handle(self, _sig: int, _frame: FrameType | None) -> None:
        threading.Thread(target=self.reload, name="sighup-reload", daemon=True).start()

    def install(self) -> None:
        """Handle SIGHUP from now on (the main thread only, as Python's signal module requires)."""
        self._previous = signal.signal(signal.SIGHUP, self._handle)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGHUP, self._previous)
            self._previous = None
