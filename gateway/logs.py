"""The process's log output: plain text for people, or one JSON object per line for log pipelines.

One handler on the root logger, stderr by default (stdio keeps stdout for the protocol). Every line,
tracebacks and ``extra=`` fields included, passes through ``gateway.audit.redact`` first, so a secret
that slipped into a message is masked before it is written.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from gateway.audit.redact import redact, redact_text
from gateway.errors import ConfigError

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: the HTTP client's loggers: their INFO and DEBUG lines quote request URLs, and a webhook URL kept in
#: the environment holds its secret in its path or query, so they only ever log warnings and worse
QUIET_LOGGERS: Final = ("httpx2", "httpcore2", "httpx", "httpcore")

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


def configure_logging(format: str = "text", level: str | None = "INFO", stream: TextIO | None = None) -> None:
    """Send every log record at ``level`` or above to ``stream`` (stderr) in ``format`` (text or json);
    ``level=None`` logs nothing at all.

    Replaces the root logger's handlers, so calling it again switches format. The HTTP client's
    loggers (``QUIET_LOGGERS``) are held at WARNING whatever ``level`` says. Raises ``ConfigError``
    for an unknown format or level (before changing anything).
    """
    factory = FORMATTERS.get(format.strip().lower())
    if factory is None:
        raise ConfigError(f"GATEWAY_LOG_FORMAT={format!r} is not a log format; use "
                          f"{' or '.join(FORMATTERS)}")
    number = logging.CRITICAL + 1 if level is None else parse_level(level)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(factory())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(number)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(number, logging.WARNING))
