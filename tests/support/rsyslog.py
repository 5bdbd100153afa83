"""A real rsyslog receiver for tests, from Debian's ``rsyslog`` and ``rsyslog-gnutls`` packages.

``Rsyslog(directory)`` writes its own configuration (imtcp on one loopback port, TLS through the
``gtls`` driver with a certificate made by ``gateway.server.edge.tls.create_certificate``; anonymous
clients, or only clients with a certificate ``client_ca`` signed) and runs ``rsyslogd -n -f CONF -i
PIDFILE`` in the foreground; ``start``/``stop`` may be called again (the same port), so a test can
take the receiver away and bring it back. Every message received on the port lands as one JSON line
in ``received.jsonl`` (PRI, HOSTNAME, APP-NAME, MSGID, the structured data and MSG, as rsyslog parsed
them); ``messages()`` reads them back.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.server.edge.tls import create_certificate
from support.processes import unavailable

START_SECONDS = 30.0

CONFIG = """\
global(
  workDirectory="{dir}/work"
  maxMessageSize="256k"
  defaultNetstreamDriver="gtls"
  defaultNetstreamDriverCAFile="{dir}/trusted.pem"
  defaultNetstreamDriverCertFile="{dir}/tls/cert.pem"
  defaultNetstreamDriverKeyFile="{dir}/tls/key.pem"
)
module(load="imtcp" streamDriver.name="gtls" streamDriver.mode="1" streamDriver.authMode="{auth_mode}")
template(name="received" type="list" option.jsonf="on") {{
  property(outname="pri" name="pri" format="jsonf")
  property(outname="hostname" name="hostname" format="jsonf")
  property(outname="app" name="app-name" format="jsonf")
  property(outname="msgid" name="msgid" format="jsonf")
  property(outname="sd" name="structured-data" format="jsonf")
  property(outname="msg" name="msg" format="jsonf")
}}
ruleset(name="gateway") {{
  action(type="omfile" file="{dir}/received.jsonl" template="received" flushOnTXEnd="on" asyncWriting="off")
}}
input(type="imtcp" address="127.0.0.1" port="{port}" ruleset="gateway")
"""


def rsyslogd() -> str:
    """The daemon's path; skip (fail under CI=true) when Debian's rsyslog is not installed."""
    found = shutil.which("rsyslogd", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        unavailable("rsyslogd not found; install Debian's rsyslog and rsyslog-gnutls (deploy/bootstrap.sh)")
    if not list(Path("/usr/lib").glob("*/rsyslog/lmnsd_gtls.so")):
        unavailable("rsyslog's gtls driver not found; install Debian's rsyslog-gnutls (deploy/bootstrap.sh)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Rsyslog:
    """One rsyslogd listening with TLS on ``port`` (see the module doc)."""

    def __init__(self, directory: Path, *, client_ca: Path | None = None) -> None:
        """``client_ca``: require a client certificate signed by it (``x509/certvalid``); else
        anonymous clients."""
        self.binary = rsyslogd()
        self.dir = directory
        (directory / "work").mkdir(parents=True, exist_ok=True)
        paths = create_certificate(directory / "tls", ["localhost"], ["127.0.0.1"])
        self.ca_file = paths.cert
        self.port = _free_port()
        self.output = directory / "received.jsonl"
        self.conf = directory / "rsyslog.conf"
        trusted = self.ca_file.read_bytes() + (client_ca.read_bytes() if client_ca else b"")
        (directory / "trusted.pem").write_bytes(trusted)
        auth_mode = "x509/certvalid" if client_ca else "anon"
        self.conf.write_text(CONFIG.format(dir=directory, port=self.port, auth_mode=auth_mode))
        self.process: subprocess.Popen[bytes] | None = None
        self.log = directory / "rsyslogd.log"

    def start(self) -> Rsyslog:
        check = subprocess.run([self.binary, "-N1", "-f", str(self.conf)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"rsyslogd refused its configuration: {check.stderr or check.stdout}")
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [self.binary, "-n", "-f", str(self.conf), "-i", str(self.dir / "rsyslogd.pid")],
                stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_SECONDS
        while not self.listening():
            if self.process.poll() is not None:
                raise RuntimeError(f"rsyslogd exited ({self.process.returncode}): {self.log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"rsyslogd did not listen on {self.port} within {START_SECONDS:g}s")
            time.sleep(0.05)
        return self

    def listening(self) -> bool:
        """Whether the port is in LISTEN state (read from /proc, so no probe connection reaches rsyslog)."""
        hex_port = f"{self.port:04X}"
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError), open(table) as f:
                for line in f.readlines()[1:]:
                    local, state = line.split()[1], line.split()[3]
                    if local.endswith(f":{hex_port}") and state == "0A":
                        return True
        return False

    def stop(self) -> None:
        """Stop rsyslogd cleanly (SIGTERM: it closes its connections) and wait for it."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=START_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def messages(self) -> list[dict[str, Any]]:
        """Every message received so far, as rsyslog parsed it."""
        try:
            text = self.output.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def wait_for(self, ok: Callable[[list[dict[str, Any]]], bool],
                 seconds: float = 20.0) -> list[dict[str, Any]]:
        """Poll ``messages()`` until ``ok`` holds; the messages then (AssertionError at the deadline)."""
        deadline = time.monotonic() + seconds
        while True:
            got = self.messages()
            if ok(got):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"rsyslog received {len(got)} messages; the condition never held "
                                     f"within {seconds:g}s. rsyslogd said: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
