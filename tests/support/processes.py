"""Child processes for tests: a tool that must be installed (``need``), ``chattr``, a free loopback port,
waiting for a listener or for a line of output, stopping; nginx (its main configuration and the deploy/nginx
recipes made local) for test_deploy and test_replicas, and the demo (``start_demo``, ``RunningDemo``) for
test_demo and test_clients."""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from support.simulator import REPO, wait_until


def unavailable(reason: str) -> NoReturn:
    """Skip the test for ``reason`` (what this machine lacks), or fail it under CI=true, where every part
    must be present."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def need(tool: str, package: str) -> str:
    """The path of ``tool``; skip (fail under CI=true) naming the Debian package when it is missing."""
    candidates = (shutil.which(tool), f"/usr/sbin/{tool}", f"/sbin/{tool}")
    path = next((p for p in candidates if p and Path(p).is_file()), None)
    if path is None:
        unavailable(f"{tool} is not installed (Debian: apt-get install {package})")
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def chattr(flag: str, path: Path) -> None:
    """``chattr FLAG PATH`` (``+i`` makes a file immutable); skip (fail under CI=true) when it cannot."""
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        unavailable(f"chattr {flag} is not available here: {done.stderr.strip()}")


def wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    def listening() -> bool:
        assert process.poll() is None, log.read_text(errors="replace")
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, timeout=60, interval=0.1, what=f"a listener on port {port}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


NGINX_MAIN = """\
daemon off;
master_process off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 128; }}
http {{
    log_format ids '$request_id $status $request_uri';
    access_log {tmp}/access.log ids;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/gateway.conf;
}}
"""


def local_nginx_recipe(
    recipe: str, upstreams: Mapping[str, str], listen_port: int, cert: Path, key: Path,
) -> str:
    """deploy/nginx/RECIPE with its upstream lines swapped as ``upstreams`` says, and its listen address,
    name and certificate paths made local; fails when the recipe no longer holds a line it swaps."""
    text = (REPO / "deploy" / "nginx" / recipe).read_text()
    swaps = {**upstreams, "listen 443 ssl;": f"listen 127.0.0.1:{listen_port} ssl;",
             "server_name gateway.example.com;": "server_name localhost;",
             "/etc/nginx/tls/gateway.crt": str(cert), "/etc/nginx/tls/gateway.key": str(key)}
    for old, new in swaps.items():
        assert old in text, f"the nginx recipe no longer contains {old!r}: update this test"
        text = text.replace(old, new)
    return text


def _as_a_background_job() -> None:
    """A ``preexec_fn``: SIGINT ignored, as a non-interactive shell starts a background job (``cmd &``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_demo(vcsim_bin: Path, port: int, folder: Path) -> subprocess.Popen[bytes]:
    """``python -m gateway.dev.demo`` on ``port`` in ``folder``, its output on a pipe (``read_until``), in a
    process group of its own (its pid) and with SIGINT ignored as a script's ``&`` leaves it: however
    pytest itself was started, a SIGINT to that group is Ctrl-C in a terminal."""
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.dev.demo", "--port", str(port), "--dir", str(folder),
         "--vcsim", str(vcsim_bin)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0, preexec_fn=_as_a_background_job,
    )


@dataclass
class RunningDemo:
    process: subprocess.Popen[bytes]
    output: str
    folder: Path
    port: int

    def token(self, name: str) -> str:
        match = re.search(rf"{name} \(\w+\): (gwt_\S+)", self.output)
        assert match, self.output
        return match.group(1)


def read_until(process: subprocess.Popen[bytes], marker: str, timeout: float) -> str:
    """stdout of ``process`` up to and including the line holding ``marker``; fail on exit or timeout."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    text = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while marker.encode() not in text or not text.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"no {marker!r} within {timeout}s; output so far:\n{text.decode()}")
            if selector.select(remaining):
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:
                    pytest.fail(f"the demo exited ({process.wait()}) before {marker!r}:\n{text.decode()}")
                text += chunk
    return text.decode()
