"""Run the bundled vSphere simulator (``deploy/vcsim/bin/vcsim-gw``) as child processes.

For the demo, the benchmarks and the tests; it needs a source checkout or a built launcher. Launchers
run with ``-exit-with-parent`` and are stopped at interpreter exit, so a crashed caller leaves none behind.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import yaml

from gateway.private_files import open_private, write_private

REPO = Path(__file__).resolve().parents[2]
VCSIM_DIR = REPO / "deploy" / "vcsim"
VCSIM_BIN = VCSIM_DIR / "bin" / "vcsim-gw"
BUILD_SCRIPT = VCSIM_DIR / "build.sh"
DEFAULT_USER = "administrator@vsphere.local"

# Control paths read with GET; every other path is a POST with a JSON body.
_GET_PATHS = frozenset({"/health", "/inventory", "/rules", "/inflight"})


class SimulatorError(RuntimeError):
    """The launcher could not be built or started, or a control call failed."""


def build_simulator(timeout: float = 600.0) -> Path:
    """Build the launcher with deploy/vcsim/build.sh when needed (a no-op when it is up to date).

    Returns the binary's path. Raises ``SimulatorError`` carrying build.sh's output, which names the
    packages to install when Go or the govmomi sources are missing.
    """
    try:
        result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True,
                                timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SimulatorError(f"could not run {BUILD_SCRIPT}: {exc}") from exc
    if result.returncode != 0 or not VCSIM_BIN.is_file():
        output = (result.stderr or result.stdout).strip()
        raise SimulatorError(f"building the vcsim launcher failed: {output}")
    return VCSIM_BIN


@dataclass(eq=False)  # identity semantics: one object per process
class SimulatorProcess:
    """A running launcher. ``url`` is its SOAP endpoint (``https://127.0.0.1:PORT/sdk``); ``user`` and
    ``password`` log in to it; ``control_url`` is None when it was started with ``control=False``."""

    url: str
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    instance_uuid: str | None
    control_url: str | None
    pid: int
    model: str
    process: subprocess.Popen[bytes] = field(repr=False)
    tmpdir: Path = field(repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def control(self, path: str, payload: Mapping[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """Call the control endpoint: GET for the read-only paths, POST ``payload`` (default {}) otherwise.

        Returns the decoded JSON reply; raises ``SimulatorError`` with the launcher's message on an error.
        """
        if self.control_url is None:
            raise SimulatorError("this simulator was started without its control endpoint (control=False)")
        data = None if path in _GET_PATHS else json.dumps(dict(payload or {})).encode()
        request = urllib.request.Request(self.control_url + path, data=data,
                                         method="GET" if data is None else "POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise SimulatorError(f"control {path} failed ({exc.code}): {detail}") from exc
        except urllib.error.URLError as exc:
            raise SimulatorError(f"control {path} failed: {exc.reason}") from exc

    def inventory(self) -> dict[str, list[dict[str, str]]]:
        """Entities by kind (datacenters, clusters, hosts, vms, datastores, pools, networks, portgroups)."""
        result: dict[str, list[dict[str, str]]] = self.control("/inventory")
        return result

    def vm_names(self) -> list[str]:
        return [vm["name"] for vm in self.inventory()["vms"]]

    def log(self) -> str:
        """The launcher's stderr so far (for error messages)."""
        try:
            return (self.tmpdir / "vcsim.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process by PID (SIGTERM, SIGKILL after ``timeout``) and delete its temp directory.
        Safe to call more than once."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(timeout)
        if self.process.stdout is not None:
            self.process.stdout.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        _live.discard(self)

    def __enter__(self) -> SimulatorProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# Simulators not stopped yet: stopped at interpreter exit should a caller crash before its cleanup.
_live: weakref.WeakSet[SimulatorProcess] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for sim in list(_live):
        sim.stop()


def start_simulator(
    *,
    model: str = "vpx",
    datacenters: int = 1,
    clusters: int = 1,
    hosts_per_cluster: int = 2,
    standalone_hosts: int = 0,
    vms: int = 2,
    datastores: int = 1,
    user: str | None = DEFAULT_USER,
    password: str | None = None,
    instance_uuid: str | None = None,
    delay_ms: int = 0,
    method_delay: Mapping[str, int] | None = None,
    session_idle_timeout: float | None = None,
    control: bool = True,
    binary: Path | None = None,
    startup_timeout: float = 60.0,
) -> SimulatorProcess:
    """Start a launcher on free loopback ports and return once it serves.

    ``vms`` is VMs per resource pool: per cluster root pool and per standalone host (for ``model="esx"``,
    on the one host). ``user`` set (the default) makes that pair the only valid login, with a random
    ``password`` unless given (it reaches the launcher through its environment, never its command
    line); ``user=None`` lets any non-empty pair log in. ``instance_uuid`` defaults to a random uuid for
    vpx and none for esx. Raises ``SimulatorError`` when the binary is missing or does not start in time.
    """
    binary = binary or VCSIM_BIN
    if not binary.is_file():
        raise SimulatorError(f"{binary} is missing; build it with: bash {BUILD_SCRIPT}")
    if user is not None and password is None:
        password = secrets.token_urlsafe(12)
    args = [
        str(binary), "-listen", "127.0.0.1:0", "-model", model, "-dc", str(datacenters),
        "-cluster", str(clusters), "-host", str(hosts_per_cluster), "-standalone-host", str(standalone_hosts),
        "-vm", str(vms), "-ds", str(datastores), "-delay", str(delay_ms), "-exit-with-parent",
    ]
    if user is not None:
        args += ["-username", user]
    if instance_uuid:
        args += ["-instance-uuid", instance_uuid]
    if method_delay:
        args += ["-method-delay", ",".join(f"{name}={ms}" for name, ms in method_delay.items())]
    if session_idle_timeout is not None:
        args += ["-session-idle-timeout", f"{session_idle_timeout}s"]
    if control:
        args += ["-control", "127.0.0.1:0"]
    return _launch(args, model, user, password, startup_timeout)


def _launch(
    args: list[str], model: str, user: str | None, password: str | None, timeout: float,
) -> SimulatorProcess:
    tmpdir = Path(tempfile.mkdtemp(prefix="vcsim-"))
    env = {k: v for k, v in os.environ.items() if k != "VCSIM_PASSWORD"}
    env["TMPDIR"] = str(tmpdir)
    if user is not None and password is not None:
        env["VCSIM_PASSWORD"] = password  # the launcher's -password default: kept out of `ps`
    with os.fdopen(open_private(tmpdir / "vcsim.log", os.O_WRONLY | os.O_TRUNC), "wb") as log:
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                   env=env)
    try:
        fields = _read_announcement(process, timeout)
    except SimulatorError as exc:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
        log_text = (tmpdir / "vcsim.log").read_text(errors="replace").strip()
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise SimulatorError(f"{exc}; launcher output: {log_text[-2000:] or '(none)'}") from None
    url = fields["VCSIM_URL"]
    parts = urlsplit(url)
    sim = SimulatorProcess(
        url=url, host=parts.hostname or "127.0.0.1", port=parts.port or 443, user=user or "vcsim",
        password=password or "vcsim",
        instance_uuid=_dash_to_none(fields.get("INSTANCE_UUID")),
        control_url=_dash_to_none(fields.get("CONTROL_URL")),
        pid=process.pid, model=model, process=process, tmpdir=tmpdir,
    )
    _live.add(sim)
    return sim


def _dash_to_none(value: str | None) -> str | None:
    return None if value in (None, "", "-") else value


def _read_announcement(process: subprocess.Popen[bytes], timeout: float) -> dict[str, str]:
    """Read the launcher's single ``KEY=value ...`` line from stdout before ``timeout`` seconds pass."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SimulatorError(f"the launcher did not report its URL within {timeout:.0f}s")
            if not selector.select(remaining):
                continue
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                raise SimulatorError(f"the launcher exited with status {process.wait()} before serving")
            buffer += chunk
    line = buffer.split(b"\n", 1)[0].decode()
    fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
    if "VCSIM_URL" not in fields:
        raise SimulatorError(f"unexpected launcher output: {line!r}")
    return fields


# ------------------------------------------------------------------------------------ targets.yaml


def credential_prefix(name: str) -> str:
    """The environment prefix for a target's credentials: ``vc-1`` -> ``SIM_VC_1``."""
    return "SIM_" + "".join(ch if ch.isalnum() else "_" for ch in name.upper())


def target_entry(name: str, sim: SimulatorProcess, **extra: Any) -> dict[str, Any]:
    """One targets.yaml entry for ``sim`` (``insecure: true``: the simulator's certificate is
    self-signed; an esx model is a standalone host). ``extra`` adds or overrides keys."""
    entry: dict[str, Any] = {"name": name, "host": sim.host, "port": sim.port,
                             "credential_env_prefix": credential_prefix(name), "insecure": True}
    if sim.model == "esx":
        entry["standalone_host"] = True
    entry.update(extra)
    return entry


def credentials_env(simulators: Mapping[str, SimulatorProcess]) -> dict[str, str]:
    """``{PREFIX_USER: ..., PREFIX_PASSWORD: ...}`` for every named simulator."""
    env: dict[str, str] = {}
    for name, sim in simulators.items():
        prefix = credential_prefix(name)
        env[f"{prefix}_USER"] = sim.user
        env[f"{prefix}_PASSWORD"] = sim.password
    return env


def write_targets(
    path: Path, simulators: Mapping[str, SimulatorProcess],
    extra: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, str]:
    """Write a targets.yaml naming each simulator; return the credential environment it needs.

    ``extra`` adds or overrides keys per target name (e.g. ``{"vc-1": {"tags": ["lab"]}}``).
    """
    extra = extra or {}
    entries = [target_entry(name, sim, **dict(extra.get(name, {}))) for name, sim in simulators.items()]
    write_private(path, yaml.safe_dump({"targets": entries}, sort_keys=False).encode())
    return credentials_env(simulators)
