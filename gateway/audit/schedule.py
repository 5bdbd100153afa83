"""The checkpoint timer: signs the audit chain's head on schedule, whether or not rows arrive.

Without it the rows after the last checkpoint stay unsigned while nobody calls, and cutting them is
invisible even to a witness. It has its own thread (sinks block); replicas' ticks sign a head once.
"""

from __future__ import annotations

import logging
import math
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gateway.errors import AuditUnavailable, ConfigError

log = logging.getLogger(__name__)

#: the longest accepted GATEWAY_AUDIT_CHECKPOINT_SECONDS: a day (a tail unsigned longer is no schedule)
MAX_CHECKPOINT_SECONDS = 86400.0
#: the shortest accepted: below it the timer would sign the head faster than a disk flushes it
MIN_CHECKPOINT_SECONDS = 0.1


class IntervalSettings(Protocol):
    """What ``checkpoint_interval`` reads of ``gateway.settings.Settings``."""

    @property
    def audit_checkpoint_seconds(self) -> float: ...


class SigningSettings(IntervalSettings, Protocol):
    """What ``signing_options`` reads of ``gateway.settings.Settings``."""

    @property
    def signing_key_file(self) -> Path: ...
    @property
    def audit_origin(self) -> str: ...
    @property
    def audit_witness_dir(self) -> Path | None: ...


def signing_options(settings: SigningSettings, **options: Any) -> dict[str, Any]:
    """A sink's checkpoint options from ``settings`` (both engines' ``for_settings``), ``options`` on top:
    the signing key, origin and witness directory, and the timer's interval (``checkpoint_interval``)."""
    return {"key_file": settings.signing_key_file, "origin": settings.audit_origin,
            "witness_dir": settings.audit_witness_dir, "checkpoint_seconds": checkpoint_interval(settings),
            **options}


@runtime_checkable
class Checkpointing(Protocol):
    """A sink the timer can drive: ``checkpoint`` signs the head unless it is signed already."""

    def checkpoint(self, *, timeout: float | None = None) -> dict[str, Any] | None: ...


def checkpoint_interval(settings: IntervalSettings) -> float:
    """``settings.audit_checkpoint_seconds`` checked: ``ConfigError`` naming the variable and the
    accepted range when it is not a number of seconds between ``MIN_CHECKPOINT_SECONDS`` and
    ``MAX_CHECKPOINT_SECONDS``."""
    seconds = settings.audit_checkpoint_seconds
    if not (isinstance(seconds, int | float) and math.isfinite(seconds)
            and MIN_CHECKPOINT_SECONDS <= seconds <= MAX_CHECKPOINT_SECONDS):
        raise ConfigError(
            f"GATEWAY_AUDIT_CHECKPOINT_SECONDS={seconds!r} is not a checkpoint interval: set it to a number "
            f"of seconds from {MIN_CHECKPOINT_SECONDS:g} to {MAX_CHECKPOINT_SECONDS:g} (default 300), "
            "the longest an audit row may wait for a signed checkpoint")
    return float(seconds)


class CheckpointTimer:
    """A daemon thread that calls ``sink.checkpoint()`` every ``seconds`` until ``stop``.

    A failed checkpoint is logged and counted (``failures``) and tried again on the next tick; it never
    ends the thread. ``ticks`` counts the attempts, ``written`` the checkpoints this timer wrote.
    """

    def __init__(self, sink: Checkpointing, seconds: float, *, timeout: float = 10.0) -> None:
        self.sink = sink
        self.seconds = float(seconds)
        self.timeout = min(timeout, self.seconds)
        self.ticks = self.written = self.failures = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> CheckpointTimer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="audit-checkpoints", daemon=True)
            self._thread.start()
        return self

    def stop(self, wait: float = 30.0) -> None:
        """Stop ticking and wait (up to ``wait`` seconds) for a checkpoint under way; blocking."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(wait)
            if self._thread.is_alive():
                log.warning("the audit checkpoint timer did not stop within %g s", wait)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def tick(self) -> dict[str, Any] | None:
        """One scheduled attempt: the checkpoint written, or None (signed already, or it failed)."""
        self.ticks += 1
        try:
            entry = self.sink.checkpoint(timeout=self.timeout)
        except (AuditUnavailable, OSError, ValueError) as exc:
            self.failures += 1
            log.warning("scheduled audit checkpoint failed (next try in %g s): %s", self.seconds, exc)
            return None
        if entry is not None:
            self.written += 1
        return entry

    def _run(self) -> None:
        while not self._stopping.wait(self.seconds):
            try:
                self.tick()
            except Exception:  # the schedule outlives any one failure; the next tick tries again
                self.failures += 1
                log.exception("scheduled audit checkpoint failed unexpectedly")
