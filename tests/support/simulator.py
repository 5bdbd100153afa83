"""Simulators for tests: the process handling of ``gateway.dev.simulators`` plus what only tests need.

``start_simulator(**options)`` runs the launcher (deploy/vcsim) on free loopback ports and returns a
``Simulator`` (``gateway.dev.simulators.SimulatorProcess``); ``Simulator.control(path, payload)`` drives its
test-only control endpoint (deploy/vcsim/README.md). The helpers below read vSphere through pyVmomi
directly, so tests can check what the gateway did without going through the gateway.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from gateway.config import Credentials, Target
from gateway.dev import simulators
from gateway.dev.simulators import (
    BUILD_SCRIPT,
    DEFAULT_USER,
    REPO,
    VCSIM_BIN,
    SimulatorError,
    credential_prefix,
    credentials_env,
    target_entry,
    write_targets,
)
from gateway.dev.simulators import SimulatorProcess as Simulator
from gateway.vsphere.pool import SessionPool
from support import tier

__all__ = [
    "BUILD_SCRIPT",
    "DEFAULT_USER",
    "REPO",
    "VC1_INSTANCE_UUID",
    "VC2_INSTANCE_UUID",
    "VCSIM_BIN",
    "MakeSimulator",
    "Simulator",
    "SimulatorError",
    "build_simulator",
    "closed_port",
    "credential_prefix",
    "credentials_env",
    "find_vm",
    "mirror_credentials",
    "mirror_synced",
    "open_pool",
    "pyvmomi_connect",
    "read_properties",
    "sim_target",
    "start_simulator",
    "target_entry",
    "wait_until",
    "write_targets",
]

VC1_INSTANCE_UUID = "5f1e6d1a-0c1b-4f55-9a31-000000000001"
VC2_INSTANCE_UUID = "5f1e6d1a-0c1b-4f55-9a31-000000000002"

T = TypeVar("T")

MakeSimulator = Callable[..., Simulator]
"""The type of the ``make_simulator`` fixture: ``make_simulator(**start_simulator options)``."""


def build_simulator(timeout: float = 600.0) -> Path:
    """``gateway.dev.simulators.build_simulator``, once the running test may use the simulator."""
    tier.start("simulator")
    return simulators.build_simulator(timeout)


def start_simulator(**options: Any) -> Simulator:
    """``gateway.dev.simulators.start_simulator``, once the running test may use the simulator."""
    tier.start("simulator")
    return simulators.start_simulator(**options)


def sim_target(name: str, sim: Simulator, **options: Any) -> Target:
    """A ``Target`` for ``sim`` (TLS verification off: the simulator's certificate is self-signed)."""
    settings: dict[str, Any] = {"insecure": True, **options}
    return Target(
        name=name, host=sim.host, port=sim.port, credential_env_prefix=credential_prefix(name), **settings
    )


def open_pool(name: str, sim: Simulator, **options: Any) -> SessionPool:
    """A session pool on ``sim`` with its credentials (lazy: nothing logs in until the first call)."""
    return SessionPool(sim_target(name, sim, **options), Credentials(sim.user, sim.password))


class RequestLog:
    """A pyVmomi request modifier that records the SOAP method of every request the stub sends."""

    _METHOD = re.compile(rb"<soapenv:Body>\s*<(\w+)")

    def __init__(self) -> None:
        self.methods: list[str] = []

    def __call__(self, request: bytes) -> bytes:
        match = self._METHOD.search(request)
        self.methods.append(match.group(1).decode() if match else "?")
        return request


def logged(pool: SessionPool, fn: Callable[[Any], Any]) -> tuple[Any, list[str]]:
    """Run ``fn`` in the pool and return its result with the SOAP methods it sent."""
    def run(session: Any) -> tuple[Any, list[str]]:
        log = RequestLog()
        modifiers = session.si._stub.requestModifierList
        modifiers.append(log)
        try:
            return fn(session), log.methods
        finally:
            modifiers.remove(log)
    result: tuple[Any, list[str]] = pool.run(run)
    return result


def wait_task(si: Any, task: Any) -> None:
    """Until ``task`` ends; it must end in success."""
    wait_until(lambda: read_properties(si, task, "info.state").get("info.state") in ("success", "error"),
               what="task to finish")
    assert read_properties(si, task, "info.state")["info.state"] == "success"


def closed_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        return int(server.getsockname()[1])


def pyvmomi_connect(sim: Simulator, *, user: str | None = None, password: str | None = None) -> Any:
    """Log in with pyVmomi (certificate checks off: the simulator's certificate is self-signed).

    Returns the ``vim.ServiceInstance``; the caller logs out with ``pyVim.connect.Disconnect(si)``.
    """
    from pyVim.connect import SmartConnect

    connect: Any = SmartConnect  # untyped
    return connect(
        host=sim.host,
        port=sim.port,
        user=user if user is not None else sim.user,
        pwd=password if password is not None else sim.password,
        disableSslCertValidation=True,
    )


def read_properties(si: Any, obj: Any, *paths: str) -> dict[str, Any]:
    """Read ``paths`` of one managed object through the PropertyCollector (unset ones are absent).

    Prefer this to pyVmomi's attribute accessors in tests: the simulator mishandles some of those
    (``vm.snapshot`` on a VM without snapshots) and task ``info`` on snapshot tasks.
    """
    from pyVmomi import vmodl

    collector: Any = vmodl.query.PropertyCollector
    spec = collector.FilterSpec(
        objectSet=[collector.ObjectSpec(obj=obj, skip=False)],
        propSet=[collector.PropertySpec(type=type(obj), pathSet=list(paths))],
    )
    result = si.content.propertyCollector.RetrievePropertiesEx([spec], collector.RetrieveOptions())
    if result is None:
        return {}
    return {prop.name: prop.val for prop in result.objects[0].propSet}


def find_vm(si: Any, name: str) -> Any:
    """The ``vim.VirtualMachine`` called ``name`` (first match in any datacenter); raises ``LookupError``."""
    from pyVmomi import vim

    view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
    try:
        for vm in view.view:
            if vm.name == name:
                return vm
    finally:
        view.DestroyView()
    raise LookupError(f"no VM named {name!r}")


def vm_exists(sim: Simulator, name: str) -> bool:
    """Whether ``name`` is still a VM of ``sim``, as pyVmomi sees it (not through the gateway)."""
    from pyVim.connect import Disconnect

    si = pyvmomi_connect(sim)
    try:
        find_vm(si, name)
        return True
    except LookupError:
        return False
    finally:
        Disconnect(si)


def count_vms_named(si: Any, name: str) -> int:
    """How many VMs called ``name`` the inventory holds (the simulator accepts duplicate clone names)."""
    from pyVmomi import vim

    view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
    try:
        return sum(1 for vm in view.view if vm.name == name)
    finally:
        view.DestroyView()


def wait_until(
    condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that; else ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"condition not met within {timeout}s: {what or condition!r}")
        time.sleep(interval)


class Relay:
    """A loopback TCP relay to a simulator whose open connections can be cut at any moment: ``sever()``
    cuts them (new ones are relayed again; ``cuts`` counts the calls); ``switch(backend)`` points new
    connections at another simulator's port and cuts the open ones, which is a vCenter restart as a
    client sees it (same address, new process, no sessions). ``close()`` stops it."""

    def __init__(self, backend: int) -> None:
        self.backend = backend
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._links: list[socket.socket] = []
        self._lock = threading.Lock()
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.backend))
            except OSError:
                client.close()
                continue
            for link in (client, upstream):  # no Nagle delays on relayed small writes
                link.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._links += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def sever(self) -> None:
        """Cut every open connection (new ones are relayed again)."""
        with self._lock:
            links, self._links = self._links, []
            self.cuts += 1
        for link in links:
            with contextlib.suppress(OSError):
                link.shutdown(socket.SHUT_RDWR)
            link.close()

    def switch(self, backend: int) -> None:
        """Point new connections at ``backend`` and cut every open one."""
        self.backend = backend
        self.sever()

    def close(self) -> None:
        self._server.close()
        self.sever()


class CountingRelay:
    """A TCP relay in front of a simulator that counts what reaches it: ``connections`` accepted and
    ``bytes_sent`` from the client towards vSphere. Point a target's ``port`` at ``relay.port``; a
    gateway that sends nothing to vSphere leaves both at 0 (the bytes are TLS, so they are counted,
    not read). ``close()`` stops it."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.connections = 0
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="counting-relay", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:  # the simulator is gone (teardown): the client sees its connection close
                client.close()
                continue
            with self._lock:
                self.connections += 1
                self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while data := source.recv(65536):
                if counted:
                    with self._lock:
                        self.bytes_sent += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            for s in self._sockets:
                s.close()
# --------------------------------------------------------------------------------------------------
# rules.yaml for tests: every section present, as the gateway requires of a rules file

RULES_SECTIONS: dict[str, Any] = {
    "defaults": {}, "protected": [], "rules": [], "targets": {}, "maintenance_windows": [],
}


def complete_rules(rules: Mapping[str, Any]) -> dict[str, Any]:
    """``rules`` with every section a rules file must hold (the missing ones empty)."""
    return {**RULES_SECTIONS, **rules}


def complete_rules_text(text: str) -> str:
    """The YAML ``text`` of a rules file with the sections it lacks appended, empty (positions of what
    ``text`` holds are unchanged)."""
    import yaml

    try:
        present = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return text  # a test of a broken file: left as it is
    if not isinstance(present, dict):
        return text
    missing = [name for name in RULES_SECTIONS if name not in present]
    body = text if text.endswith("\n") or not text else text + "\n"
    return body + "".join(f"{name}: {'{}' if isinstance(RULES_SECTIONS[name], dict) else '[]'}\n"
                          for name in missing)


def mirror_credentials(*pairs: tuple[Target, Simulator]) -> dict[str, str]:
    """The environment a mirror of each (target, simulator) pair logs in with."""
    env: dict[str, str] = {}
    for target, sim in pairs:
        env[f"{target.credential_env_prefix}_USER"] = sim.user
        env[f"{target.credential_env_prefix}_PASSWORD"] = sim.password
    return env


def mirror_synced(mirrors: Any, name: str, resyncs: int = 0) -> bool:
    """Whether ``mirrors`` (``gateway.vsphere.mirror.Mirrors``) holds target ``name`` synced, after at
    least ``resyncs`` resyncs."""
    stats = mirrors.stats().get(name)
    return stats is not None and stats.state == "synced" and stats.resyncs >= resyncs
