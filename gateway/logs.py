"""The process's log output: plain text for people, or one JSON object per line for log pipelines.

One handler on the root logger, stderr by default (stdio keeps stdout for the protocol). Every line,
tracebacks and ``extra=`` fields included, passes through ``gateway.audit.redact`` first, so a secret
that slipped into a message is masked before it is written.

A logging call only hands its record to a queue (``LogWriter``): one writer thread formats, masks and
writes it. The event loop never waits on the stream, so a stderr pipe nobody reads (a stuck log
shipper, a terminal paused with ^S) stalls the writer, not the server; when the queue is full a record
is dropped and counted, and the writer says how many when the stream takes lines again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import sys
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from gateway.audit.redact import redact, redact_text
from gateway.errors import ConfigError

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: the HTTP client's loggers: their INFO and DEBUG lines quote request URLs, and a webhook URL kept in
#: the environment holds its secret in its path or query, so they only ever log warnings and worse
QUIET_LOGGERS: Final = ("httpx2", "httpcore2", "httpx", "httpcore")
#: records waiting for the writer thread at most; one more is dropped (and counted), never waited for
QUEUE_RECORDS: Final = 10_000
#: how long the writer rests once it has written everything queued
WRITER_PAUSE_SECONDS: Final = 0.05
#: how long the process's exit and ``flush_logs`` wait for the writer to write what waits
FLUSH_SECONDS: Final = 5.0

#: attributes every LogRecord has; anything else on a record came from ``extra=``
_RECORD_ATTRS: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName",
}


class RedactingTextFormatter(logging.Formatter):
    """The plain text format, with credential-shaped pieces of the whole line masked."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = redact(extra_fields(record))
        event.update({
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
                  .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact_text(record.getMessage()),
        })
        if record.exc_info:
            event["exc"] = redact_text(self.formatException(record.exc_info))
        elif record.exc_text:  # made text when the record was queued (``LogWriter``)
            event["exc"] = redact_text(record.exc_text)
        if record.stack_info:
            event["stack"] = redact_text(self.formatStack(record.stack_info))
        return json.dumps(event, ensure_ascii=False, separators=(",", ":"), default=str)


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a logging call added with ``extra=`` (private ``_``-names left out)."""
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS and not k.startswith("_")}


FORMATTERS: Final[dict[str, Callable[[], logging.Formatter]]] = {
    "text": RedactingTextFormatter,
    "json": JsonFormatter,
}


def parse_level(level: str) -> int:
    """A level name (``debug``, ``INFO``, ...) as its number; ConfigError naming the choices otherwise."""
    levels = logging.getLevelNamesMapping()
    number = levels.get(level.strip().upper())
    if number is None:
        raise ConfigError(f"GATEWAY_LOG_LEVEL={level!r} is not a log level; use one of "
                          "DEBUG, INFO, WARNING, ERROR, CRITICAL")
    return number


def cli_log_level(command: str, verbose: bool, environ: Mapping[str, str]) -> str | None:
    """The log level of one ``gateway`` command: GATEWAY_LOG_LEVEL when set, else INFO for ``serve``
    (a server's log is its output), with ``--verbose`` or when GATEWAY_LOG_FORMAT asks for a format;
    else None: the other commands print their results on stdout and their problems on stderr, and
    log nothing unless asked."""
    level = environ.get("GATEWAY_LOG_LEVEL")
    if level:
        return level
    asked = verbose or command == "serve" or bool(environ.get("GATEWAY_LOG_FORMAT"))
    return "INFO" if asked else None


_TRACEBACKS: Final = logging.Formatter()


class _Flushed:
    """A marker in the writer's queue: set once every record queued before it is written."""

    def __init__(self) -> None:
        self.done = threading.Event()


class LogWriter(logging.Handler):
    """The root logger's handler: queues each record (no formatting, no I/O on the calling thread) for
    one daemon thread that hands it to ``target`` (the stream's handler, formatter and all).

    On the calling thread only what cannot wait is done: the message merged with its arguments (they
    may change later) and a traceback made text (its frames go away). A full queue drops the record;
    the writer then writes one line saying how many were dropped before the next record it writes."""

    def __init__(self, target: logging.Handler, capacity: int = QUEUE_RECORDS) -> None:
        super().__init__()
        self.target = target
        self.dropped = 0
        self._dropped_lock = threading.Lock()  # not the handler's lock: logging.shutdown holds that
        self._hurry = threading.Event()
        self._queue: queue.Queue[logging.LogRecord | _Flushed | None] = queue.Queue(capacity)
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            traceback = record.exc_text or (_TRACEBACKS.formatException(record.exc_info)
                                            if record.exc_info else None)
            self._queue.put_nowait(logging.makeLogRecord({
                **vars(record), "msg": message, "args": None, "message": message, "exc_info": None,
                "exc_text": traceback}))
        except queue.Full:
            with self._dropped_lock:
                self.dropped += 1
        except Exception:
            self.handleError(record)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                # the queue drained: a pause before the next look (cut short by ``flush``), so a busy
                # server's lines are written in batches, not one thread switch per line
                self._hurry.wait(WRITER_PAUSE_SECONDS)
                self._hurry.clear()
                item = self._queue.get()
            if item is None:
                return
            if isinstance(item, _Flushed):
                with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: nothing to flush
                    self.target.flush()
                item.done.set()
                continue
            self._say_dropped()
            self.target.handle(item)  # its errors go to its handleError, as on the calling thread

    def _say_dropped(self) -> None:
        with self._dropped_lock:
            dropped, self.dropped = self.dropped, 0
        if dropped:
            self.target.handle(logging.makeLogRecord({
                "name": __name__, "levelno": logging.WARNING, "levelname": "WARNING",
                "msg": f"{dropped} log records were dropped: the log stream did not take them in time "
                       "(a reader of this process's stderr stalled?)"}))

    def flush(self, timeout: float = FLUSH_SECONDS) -> bool:  # type: ignore[override]
        """Wait (at most ``timeout``) until every record queued so far is written; whether it was."""
        if not self._thread.is_alive():
            return self._queue.empty()
        marker = _Flushed()
        try:
            self._queue.put(marker, timeout=timeout)
        except queue.Full:
            return False
        self._hurry.set()
        return marker.done.wait(timeout)

    def close(self) -> None:
        """Write what waits (``FLUSH_SECONDS`` at most), then stop the writer thread (``logging``'s own
        exit hook calls this too, so a process's last lines are written)."""
        if self._thread.is_alive():
            self.flush()
            try:
                self._queue.put_nowait(None)
            except queue.Full:  # the stream is stuck: the daemon thread dies with the process
                pass
            else:
                self._hurry.set()
                self._thread.join(FLUSH_SECONDS)
        self.target.close()
        super().close()


def flush_logs(timeout: float = FLUSH_SECONDS) -> bool:
    """Wait (at most ``timeout``) until every record logged so far is written by the root logger's
    ``LogWriter`` (true at once without one); whether it was."""
    return all(h.flush(timeout) for h in logging.getLogger().handlers if isinstance(h, LogWriter))


def configure_logging(format: str = "text", level: str | None = "INFO", stream: TextIO | None = None) -> None:
    """Send every log record at ``level`` or above to ``stream`` (stderr) in ``format`` (text or json);
    ``level=None`` logs nothing at all.

    The lines are written by a thread (``LogWriter``); ``flush_logs`` waits for them. Replaces the
    root logger's handlers (closing them), so calling it again switches format. The HTTP client's
    loggers (``QUIET_LOGGERS``) are held at WARNING whatever ``level`` says. Raises ``ConfigError``
    for an unknown format or level (before changing anything).
    """
    factory = FORMATTERS.get(format.strip().lower())
    if factory is None:
        raise ConfigError(f"GATEWAY_LOG_FORMAT={format!r} is not a log format; use "
                          f"{' or '.join(FORMATTERS)}")
    number = logging.CRITICAL + 1 if level is None else parse_level(level)
    target = logging.StreamHandler(stream or sys.stderr)
    target.setFormatter(factory())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(LogWriter(target))
    root.setLevel(number)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(number, logging.WARNING))
