"""Where audit rows are forwarded: ``syslog.yaml`` (see ``syslog.example.yaml``); no file, no forwarding.

Parsed strictly, each problem ``file:line:column: ...`` with its fix.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway.config import ConfigProblems, load_yaml, located
from gateway.errors import ConfigError

TRANSPORTS: Final = ("tls", "tcp")
DEFAULT_PORT: Final = 6514
DEFAULT_APP_NAME: Final = "vsphere-mcp-gateway"
#: RFC 5424 facility 13, "log audit"
DEFAULT_FACILITY: Final = 13
#: 32473 is the enterprise number RFC 5612 reserves for documentation; operators put their own
DEFAULT_SD_ID: Final = "audit@32473"
DEFAULT_BACKLOG: Final = 10_000
MAX_BACKLOG: Final = 1_000_000
_KEYS: Final = frozenset({"host", "port", "transport", "ca_file", "server_name", "client_cert_file",
                          "client_key_file", "hostname", "app_name", "facility", "sd_id", "backlog",
                          "connect_timeout_seconds", "max_backoff_seconds"})
#: RFC 5424 PRINTUSASCII (33-126), the characters of HOSTNAME and APP-NAME
_PRINTABLE: Final = re.compile(r"[!-~]+")
#: SD-NAME: printable, without '=', ' ', ']' and '"'; an SD-ID other than the IANA ones holds one '@'
_SD_ID: Final = re.compile(r"[!#-<>-\\^-~]{1,32}")


@dataclass(frozen=True)
class SyslogConfig:
    """One syslog receiver and how messages to it are shaped."""

    host: str
    port: int = DEFAULT_PORT
    transport: str = "tls"
    ca_file: Path | None = None
    server_name: str | None = None
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    hostname: str = "-"
    app_name: str = DEFAULT_APP_NAME
    facility: int = DEFAULT_FACILITY
    sd_id: str = DEFAULT_SD_ID
    backlog: int = DEFAULT_BACKLOG
    connect_timeout_seconds: float = 10.0
    max_backoff_seconds: float = 60.0

    @property
    def where(self) -> str:
        """How logs and errors name the receiver (never a secret: there is none in this file)."""
        return f"syslog receiver {self.host}:{self.port} ({self.transport})"


def load(path: Path) -> SyslogConfig | None:
    """Parse ``path`` strictly; None when the file does not exist (no forwarding). ``ConfigProblems``
    lists every problem as ``file:line:column: ...`` with its fix."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the syslog file ({exc.strerror}); fix its permissions or "
                          "set GATEWAY_SYSLOG_FILE") from None
    problems: list[str] = []
    config = parse(load_yaml(text, str(path)), problems, str(path), base=path.parent)
    if problems:
        raise ConfigProblems(problems)
    return config


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Section:
    """Reads the keys of one ``syslog:`` mapping, appending a located problem for each bad value."""

    def __init__(self, section: dict[Any, Any], problems: list[str], source: str, base: Path) -> None:
        self.section, self.problems, self.source, self.base = section, problems, source, base

    def at(self, key: str) -> str:
        return f"{located(self.source, self.section, key)}: syslog.{key}"

    def value(self, key: str, ok: Callable[[Any], bool], need: str, default: Any) -> Any:
        if key not in self.section:
            return default
        got = self.section[key]
        if ok(got):
            return got
        self.problems.append(f"{self.at(key)} must be {need}")
        return default

    def file(self, key: str) -> Path | None:
        raw = self.value(key, _text, "a file path", None)
        if raw is None:
            return None
        path = Path(raw).expanduser()
        path = path if path.is_absolute() else self.base / path
        if not path.is_file():
            self.problems.append(f"{self.at(key)}: {path} is not a readable file; fix the path")
        return path


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _printable(limit: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and _PRINTABLE.fullmatch(v) is not None and len(v) <= limit


def _integer(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: type(v) is int and low <= v <= high


def _seconds(v: Any) -> bool:
    return type(v) in (int, float) and 0 < v <= 3600


def _sd_id(v: Any) -> bool:
    return isinstance(v, str) and _SD_ID.fullmatch(v) is not None and v.count("@") == 1


def parse(data: Any, problems: list[str], source: str, *, base: Path = Path()) -> SyslogConfig | None:
    """The ``syslog:`` document as a value (None when empty or broken); each problem appended to
    ``problems`` starting with its ``file:line:column``. Relative paths are read from ``base``."""
    if data is None:
        return None
    if not isinstance(data, dict) or set(data) != {"syslog"}:
        problems.append(f"{located(source, data)}: the file must hold one top-level key, 'syslog:'")
        return None
    section = data["syslog"]
    if not isinstance(section, dict):
        problems.append(f"{located(source, data, 'syslog')}: 'syslog' must be a mapping with at least "
                        "'host' (and 'ca_file' for tls)")
        return None
    before = len(problems)
    top = located(source, data, "syslog")
    for key in sorted(set(section) - _KEYS, key=str):
        problems.append(f"{located(source, section, key)}: syslog: unknown key '{key}'; allowed keys are "
                        f"{', '.join(sorted(_KEYS))}")
    read = _Section(section, problems, source, base)
    host = read.value("host", _printable(255), "the receiver's host name or address, e.g. siem.example.com",
                      None)
    if "host" not in section:
        problems.append(f"{top}: syslog.host is required: the receiver's host name or address")
    transport = read.value("transport", lambda v: v in TRANSPORTS, "tls or tcp", "tls")
    ca_file = read.file("ca_file")
    if transport == "tls" and "ca_file" not in section:
        problems.append(f"{top}: syslog.ca_file is required with transport tls: the CA certificate (PEM) "
                        "the receiver's certificate chains to")
    if transport == "tcp" and isinstance(host, str) and not _is_loopback(host):
        problems.append(f"{read.at('transport')}: plain tcp sends audit rows unencrypted; it is allowed only "
                        "to a loopback host (127.0.0.1, ::1, localhost). Use transport: tls with a ca_file")
    if ("client_cert_file" in section) != ("client_key_file" in section):
        problems.append(f"{top}: syslog.client_cert_file and client_key_file go together: give both or "
                        "neither")
    config = SyslogConfig(
        host=host or "",
        port=read.value("port", _integer(1, 65535), "a port number (1-65535)", DEFAULT_PORT),
        transport=transport,
        ca_file=ca_file,
        server_name=read.value("server_name", _text, "the name the receiver's certificate carries", None),
        client_cert_file=read.file("client_cert_file"),
        client_key_file=read.file("client_key_file"),
        hostname=read.value("hostname", _printable(255),
                            "up to 255 printable ASCII characters without spaces", _default_hostname()),
        app_name=read.value("app_name", _printable(48), "up to 48 printable ASCII characters without spaces",
                            DEFAULT_APP_NAME),
        facility=read.value("facility", _integer(0, 23), "a syslog facility number 0-23 (13: log audit)",
                            DEFAULT_FACILITY),
        sd_id=read.value("sd_id", _sd_id, "NAME@ENTERPRISE-NUMBER, e.g. audit@32473", DEFAULT_SD_ID),
        backlog=read.value("backlog", _integer(1, MAX_BACKLOG), f"a row count 1-{MAX_BACKLOG}",
                           DEFAULT_BACKLOG),
        connect_timeout_seconds=float(read.value("connect_timeout_seconds", _seconds, "seconds (0-3600]",
                                                 10.0)),
        max_backoff_seconds=float(read.value("max_backoff_seconds", _seconds, "seconds (0-3600]", 60.0)),
    )
    return config if len(problems) == before else None


def _default_hostname() -> str:
    """This machine's name as RFC 5424 HOSTNAME allows it (``-`` when it has none usable)."""
    name = socket.gethostname()
    return name if _PRINTABLE.fullmatch(name or "") and len(name) <= 255 else "-"
