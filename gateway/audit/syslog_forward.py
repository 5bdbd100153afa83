"""Audit rows forwarded to the SIEM as they are written: RFC 5424 over TCP or TLS (RFC 5425).

- Never blocks a call: ``offer`` appends to a bounded backlog; a full backlog drops the oldest row,
  counted. Nothing is spilled to disk: the audit log is the durable copy.
- At least once: a failed batch is resent whole (deduplicate on ``seq`` and ``hash``). A row the
  kernel took just before the receiver's host died is lost to syslog (no acknowledgement), not to the log.
- The chain fields and Merkle leaf ride in structured data, so a SIEM checks gaps without parsing MSG.
- Rows other processes write (the CLI) and the sink's own bookkeeping rows are not sent: gaps in ``seq``.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import logging
import os
import re
import select
import socket
import ssl
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.audit.chain import row_line
from gateway.audit.merkle import leaf_hash
from gateway.audit.syslog_config import SyslogConfig, load
from gateway.errors import ConfigError

log = logging.getLogger(__name__)

SEVERITY_INFO: Final = 6
SEVERITY_NOTICE: Final = 5
#: rows framed and sent in one write
BATCH_ROWS: Final = 256
FIRST_BACKOFF_SECONDS: Final = 1.0
#: how long ``close`` lets the sender drain the backlog before counting what is left as dropped
CLOSE_DRAIN_SECONDS: Final = 5.0
#: how long a new connection is watched for a refusal before rows go into it: TLS 1.3 tells the
#: client its certificate was refused only after the handshake
REFUSAL_WAIT_SECONDS: Final = 0.25
#: the chain fields every message's structured data carries, in this order
CHAIN_FIELDS: Final = ("seq", "hash", "prev")
_MSGID: Final = re.compile(r"[!-~]{1,32}")
_TS: Final = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?(Z|[+-]\d\d:\d\d)")

STOPPED: Final = "the forwarder stopped"

Connect = Callable[[], socket.socket]


# ------------------------------------------------------------------------------------------ framing


def sd_escape(value: str) -> str:
    """A PARAM-VALUE as RFC 5424 section 6.3.3 requires: ``"``, ``\\`` and ``]`` escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


def chain_params(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The structured-data parameters of one row: the chain fields, then its place in the tree."""
    return [(name, str(row[name])) for name in CHAIN_FIELDS if name in row] + tree_params(row)


def tree_params(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The row's place in the Merkle tree (``gateway.audit.merkle``): its leaf index (``seq`` - 1, as
    ``gateway audit prove`` names it) and its RFC 6962 leaf hash (base64, as proofs carry hashes), so
    a SIEM can ask for and check an inclusion proof without the gateway's code."""
    seq = row.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return []
    return [("leaf", str(seq - 1)), ("leaf_hash", base64.b64encode(leaf_hash(row_line(row))).decode("ascii"))]


def message(row: Mapping[str, Any], config: SyslogConfig, procid: str) -> bytes:
    """One RFC 5424 message (without its frame) for one stored audit row."""
    severity = SEVERITY_NOTICE if row.get("error_code") else SEVERITY_INFO
    ts = row.get("ts")
    phase = row.get("phase")
    sd = " ".join(f'{name}="{sd_escape(value)}"' for name, value in chain_params(row))
    header = (f"<{config.facility * 8 + severity}>1 "
              f"{ts if isinstance(ts, str) and _TS.fullmatch(ts) else '-'} "
              f"{config.hostname} {config.app_name} {procid} "
              f"{phase if isinstance(phase, str) and _MSGID.fullmatch(phase) else '-'} "
              f"[{config.sd_id}{' ' + sd if sd else ''}] ")
    return header.encode("utf-8") + row_line(row)


def octet_counted(msg: bytes) -> bytes:
    """RFC 6587 octet counting (the framing RFC 5425 uses): ``MSG-LEN SP SYSLOG-MSG``."""
    return b"%d %s" % (len(msg), msg)


# ------------------------------------------------------------------------------------------ sending


def tls_context(config: SyslogConfig) -> ssl.SSLContext:
    """Verify the receiver against ``ca_file`` (and its name), TLS 1.2 or later, with the client
    certificate when configured. ``ConfigError`` naming the file when one cannot be used."""
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                             cafile=str(config.ca_file) if config.ca_file else None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if config.client_cert_file is not None:
            context.load_cert_chain(str(config.client_cert_file),
                                    str(config.client_key_file) if config.client_key_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"syslog: cannot use the TLS files of {config.where} ({exc}); fix ca_file, "
                          "client_cert_file and client_key_file in syslog.yaml") from None
    return context


def connector(config: SyslogConfig) -> Connect:
    """How the sender opens one connection to the receiver (TLS unless ``transport: tcp``)."""
    context = tls_context(config) if config.transport == "tls" else None

    def connect() -> socket.socket:
        sock = socket.create_connection((config.host, config.port), timeout=config.connect_timeout_seconds)
        if context is None:
            return sock
        try:
            return context.wrap_socket(sock, server_hostname=config.server_name or config.host)
        except BaseException:
            sock.close()
            raise

    return connect


def _peer_closed(sock: socket.socket, wait: float = 0.0) -> bool:
    """Whether the receiver closed (or reset) the connection, waiting up to ``wait`` seconds: it never
    sends on syslog, so anything readable is its end (a FIN, a reset, a TLS alert or close_notify)."""
    try:
        readable, _, _ = select.select([sock], [], [], wait)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _why_closed(sock: socket.socket) -> str:
    """What the receiver said as it closed (a TLS alert names the refusal), for the log."""
    try:
        data = sock.recv(1)
    except (OSError, ssl.SSLError) as exc:
        return str(exc)
    return "it closed the connection" if not data else "it sent data, which a syslog receiver never does"


class Forwarder:
    """Rows offered by the audit trail, sent by one thread to one receiver (see the module doc)."""

    def __init__(self, config: SyslogConfig, *, connect: Connect | None = None) -> None:
        self.config = config
        self._connect = connect or connector(config)
        self._procid = str(os.getpid())
        self._cond = threading.Condition()
        self._backlog: collections.deque[Mapping[str, Any]] = collections.deque()
        self._in_flight = 0
        self._stats: Counter[str] = Counter()
        self._connected = False
        self._dropping = False  # a drop of the current outage was logged
        self._closing = False
        self._stopped = False  # close() gave up waiting: the sender sends nothing more
        self._thread: threading.Thread | None = None

    def start(self) -> Forwarder:
        with self._cond:
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._run, name="syslog-forwarder", daemon=True)
                self._thread.start()
        return self

    def offer(self, row: Mapping[str, Any]) -> None:
        """Queue one stored row; never blocks on the network, never raises."""
        with self._cond:
            if self._closing:
                self._stats["dropped"] += 1
                return
            if len(self._backlog) + self._in_flight >= self.config.backlog and self._backlog:
                self._backlog.popleft()
                self._stats["dropped"] += 1
                if not self._dropping:
                    self._dropping = True
                    log.warning("syslog: the backlog for %s is full (%d rows); the oldest rows are dropped "
                                "and counted (gateway_syslog_dropped_total) until it takes rows again",
                                self.config.where, self.config.backlog)
            self._backlog.append(row)
            self._cond.notify()

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"forwarded": self._stats["forwarded"], "dropped": self._stats["dropped"],
                    "backlog": len(self._backlog) + self._in_flight, "backlog_limit": self.config.backlog,
                    "connected": int(self._connected), "connect_failures": self._stats["connect_failures"],
                    "send_failures": self._stats["send_failures"]}

    def families(self) -> list[Metric]:
        """The ``gateway_syslog_*`` families of ``stats()`` (a /metrics collector)."""
        stats = self.stats()
        families: list[Metric] = []
        for key, kind, help_text in (
            ("forwarded", "counter", "Audit rows sent to the syslog receiver."),
            ("dropped", "counter", "Audit rows never sent: the backlog was full, or left at shutdown."),
            ("backlog", "gauge", "Audit rows waiting to be sent to the syslog receiver."),
            ("backlog_limit", "gauge", "Audit rows the syslog backlog holds at most."),
            ("connected", "gauge", "1 while connected to the syslog receiver, else 0."),
            ("connect_failures", "counter", "Failed connections to the syslog receiver."),
            ("send_failures", "counter", "Sends to the syslog receiver that failed (the batch is resent)."),
        ):
            family: Metric
            if kind == "counter":
                family = CounterMetricFamily(f"gateway_syslog_{key}", help_text)
            else:
                family = GaugeMetricFamily(f"gateway_syslog_{key}", help_text)
            family.add_metric([], float(stats[key]))
            families.append(family)
        return families

    def close(self, drain_seconds: float = CLOSE_DRAIN_SECONDS) -> None:
        """Stop the sender, letting it send what waits for up to ``drain_seconds``; rows still
        waiting then are counted as dropped (and logged)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(drain_seconds)
        with self._cond:  # a batch still in flight is the sender's to count, sent or dropped
            left = len(self._backlog)
            self._backlog.clear()
            self._stats["dropped"] += left
            self._stopped = True
            self._cond.notify_all()
        if left:
            log.warning("syslog: %d audit rows were not sent to %s before shutdown (they are in the audit "
                        "log)", left, self.config.where)

    # -- the sender thread

    def _run(self) -> None:
        sock: socket.socket | None = None
        backoff = FIRST_BACKOFF_SECONDS
        try:
            while True:
                with self._cond:
                    while not self._backlog and not self._closing:
                        self._cond.wait()
                    if not self._backlog or self._stopped:
                        return
                if sock is not None and _peer_closed(sock):
                    self._drop(sock, "the receiver closed the connection")
                    sock = None
                if sock is None:
                    sock = self._open()
                    if sock is None:
                        with self._cond:
                            if self._closing:
                                return
                            self._cond.wait(backoff)
                        backoff = min(backoff * 2, self.config.max_backoff_seconds)
                        continue
                    backoff = FIRST_BACKOFF_SECONDS
                if not self._send_batch(sock):
                    self._drop(sock, "a send failed")
                    sock = None
        finally:
            if sock is not None:
                self._drop(sock, STOPPED)

    def _open(self) -> socket.socket | None:
        try:
            sock = self._connect()
        except (OSError, ssl.SSLError) as exc:
            with self._cond:
                self._stats["connect_failures"] += 1
                first = self._stats["connect_failures"] == 1 or self._connected
            (log.warning if first else log.debug)("syslog: cannot connect to %s: %s", self.config.where, exc)
            return None
        sock.settimeout(self.config.connect_timeout_seconds)  # a stalled receiver fails the send
        if _peer_closed(sock, REFUSAL_WAIT_SECONDS):  # e.g. TLS 1.3: a refused client certificate
            with self._cond:
                self._stats["connect_failures"] += 1
                first = self._stats["connect_failures"] == 1
            (log.warning if first else log.debug)(
                "syslog: %s closed the connection at once (%s); does it refuse this client's certificate? "
                "fix client_cert_file in syslog.yaml or the receiver's trust", self.config.where,
                _why_closed(sock))
            with contextlib.suppress(OSError):
                sock.close()
            return None
        with self._cond:
            self._connected = True
        log.info("syslog: connected to %s", self.config.where)
        return sock

    def _drop(self, sock: socket.socket, why: str) -> None:
        stopping = why == STOPPED
        if stopping and isinstance(sock, ssl.SSLSocket):  # a clean TLS close (close_notify) at shutdown
            with contextlib.suppress(OSError, ssl.SSLError):
                sock.unwrap()
        with contextlib.suppress(OSError):
            sock.close()
        with self._cond:
            was, self._connected = self._connected, False
        if was and not stopping:
            log.warning("syslog: disconnected from %s (%s); rows wait in the backlog", self.config.where, why)

    def _send_batch(self, sock: socket.socket) -> bool:
        with self._cond:
            batch = [self._backlog.popleft() for _ in range(min(BATCH_ROWS, len(self._backlog)))]
            self._in_flight = len(batch)
        try:
            sock.sendall(b"".join(octet_counted(message(row, self.config, self._procid)) for row in batch))
        except (OSError, ssl.SSLError):
            with self._cond:
                self._in_flight = 0
                self._stats["send_failures"] += 1
                if self._stopped:  # close() gave up on the sender: nothing is sent again
                    self._stats["dropped"] += len(batch)
                    return False
                self._backlog.extendleft(reversed(batch))
                while len(self._backlog) > self.config.backlog:  # rows offered meanwhile past the bound
                    self._backlog.popleft()
                    self._stats["dropped"] += 1
            return False
        with self._cond:
            self._in_flight = 0
            self._stats["forwarded"] += len(batch)
            self._dropping = False
        return True


def forwarder_for(path: Path | None) -> Forwarder | None:
    """The forwarder ``syslog.yaml`` at ``path`` describes (not started), or None when there is no
    such file. ``ConfigError`` (``ConfigProblems``) on a bad file, so the gateway does not start."""
    config = load(path) if path is not None else None
    return Forwarder(config) if config is not None else None
