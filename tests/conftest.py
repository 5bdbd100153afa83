"""Shared fixtures: simulators (deploy/vcsim) for integration tests.

- ``vcsim_bin``: the built launcher (built on first use). Skips when it cannot be built, except under
  ``CI=true``, where that is a failure.
- ``sim_vc1``, ``sim_vc2``: session-scoped vCenters with distinct instance uuids; ``sim_esx``: a
  standalone ESXi host. Treat them as read-only: tests that change state (power, snapshots, control
  rules, delays, sessions) use ``make_simulator`` instead.
- ``make_simulator(**options)``: a fresh simulator per call, stopped at the end of the test.

- ``pg_server``: a session-scoped real PostgreSQL (tests/support/postgres.py); ``pg_url``: a fresh database
  on it per test. Skips when PostgreSQL cannot start, except under ``CI=true``.
- ``env``: a gateway rig (tests/support/gateway_env.py) over a fresh two-VM simulator; its gateways close
  after the test.
- ``si``: a pyVmomi session on the test module's own ``sim`` fixture (a simulator it starts), logged
  out afterwards.
- ``rig``: a vSphere action rig (tests/support/vsphere_rig.py) on a fresh simulator.
- ``anyio_backend``: every ``@pytest.mark.anyio`` test and async fixture runs on asyncio.

Markers follow the fixtures (tests/support/tier.py): a fixture that starts a part carries
``@needs(marker)``, and every test whose fixture closure holds it gets that marker (``simulator``,
``postgres``, ``browser``, ``oidc``, ``slow``), so ``-m "not postgres"`` leaves out every test that would
start PostgreSQL. A test that starts a part without its marker fails after it ran, and under the fast tier
(``TEST_TIER=fast``, ``make test-fast``) every such fixture and helper fails at once.
"""

from __future__ import annotations

import logging
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyVim.connect import Disconnect
from support import loop_reads, tier
from support.browser import launched_chromium
from support.gateway_env import Env
from support.postgres import PgServer, PostgresError, discard, start_postgres
from support.processes import unavailable
from support.simulator import (
    VC1_INSTANCE_UUID,
    VC2_INSTANCE_UUID,
    MakeSimulator,
    Simulator,
    SimulatorError,
    build_simulator,
    open_pool,
    pyvmomi_connect,
    start_simulator,
)
from support.tier import needs
from support.vsphere_rig import Rig, start_rig

from gateway.vsphere.pool import SessionPool


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each test the markers its fixture closure's ``@needs`` declare (before ``-m`` selects)."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        declared = {marker for name in item.fixturenames for fixturedef in info.name2fixturedefs.get(name, ())
                    for marker in tier.needed_by(fixturedef.func)}
        for marker in sorted(declared):
            item.add_marker(marker)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    """Tell ``tier.start`` which test is running."""
    tier.running = item
    tier.unmarked.clear()
    try:
        return (yield)
    finally:
        tier.running = None


@pytest.fixture(autouse=True)
def _parts_marked() -> Iterator[None]:
    """Fail, once it has run, a test that started a part without its marker (tests/support/tier.py)."""
    yield
    if tier.unmarked:
        found, tier.unmarked[:] = "\n".join(tier.unmarked), []
        pytest.fail(found, pytrace=False)


@pytest.fixture(autouse=True)
def _no_config_read_on_a_serving_loop() -> Iterator[None]:
    """Fail a test whose server read rules.yaml or roles.yaml on its event loop while serving a request
    (tests/support/loop_reads.py)."""
    loop_reads.install()
    loop_reads.found()
    yield
    if found := loop_reads.found():
        pytest.fail("\n".join(found), pytrace=False)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """The one backend the suite runs async tests on (module scope, like anyio's own fixture, so
    module-scoped async fixtures can use it)."""
    return "asyncio"


@pytest.fixture(scope="module")
@needs("browser")
def browser() -> Iterator[Any]:
    """Headless Chromium for the web page tests, once per module (tests/support/browser.py)."""
    with launched_chromium() as launched:
        yield launched


@pytest.fixture(scope="session")
@needs("postgres")
def pg_server() -> Iterator[PgServer]:
    """A real PostgreSQL (initdb + pg_ctl on a loopback port) for the whole run; skip (fail under
    CI=true) with the reason when it cannot start. Tests take their own database with ``pg_url``."""
    try:
        server = start_postgres()
    except (PostgresError, OSError, subprocess.SubprocessError) as exc:
        unavailable(f"PostgreSQL unavailable: {exc}")
    try:
        yield server
    finally:
        discard(server)


@pytest.fixture
@needs("postgres")
def pg_url(pg_server: PgServer) -> str:
    """The URL (with password) of a fresh, empty database on ``pg_server``."""
    return pg_server.create_database()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port whose peer completes the TCP handshake (in the kernel backlog) and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as server:
        yield server.getsockname()[1]


@pytest.fixture(scope="session")
@needs("simulator")
def vcsim_bin() -> Path:
    """The launcher binary; skip (fail under CI=true) with the reason when it cannot be built."""
    try:
        return build_simulator()
    except SimulatorError as exc:
        unavailable(f"vcsim launcher unavailable: {exc}")


def _session_simulator(vcsim_bin: Path, **options: Any) -> Iterator[Simulator]:
    sim = start_simulator(binary=vcsim_bin, **options)
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture(scope="session")
@needs("simulator")
def sim_vc1(vcsim_bin: Path) -> Iterator[Simulator]:
    """vCenter: DC0 with cluster DC0_C0 (2 hosts, VMs DC0_C0_RP0_VM0..1), standalone host DC0_H0 (VMs
    DC0_H0_VM0..1), datastores LocalDS_0 and LocalDS_1; instance uuid ``VC1_INSTANCE_UUID``."""
    yield from _session_simulator(
        vcsim_bin, clusters=1, hosts_per_cluster=2, standalone_hosts=1, vms=2, datastores=2,
        instance_uuid=VC1_INSTANCE_UUID,
    )


@pytest.fixture(scope="session")
@needs("simulator")
def sim_vc2(vcsim_bin: Path) -> Iterator[Simulator]:
    """vCenter: DC0 with cluster DC0_C0 (2 hosts, VMs DC0_C0_RP0_VM0..2), datastore LocalDS_0;
    instance uuid ``VC2_INSTANCE_UUID``."""
    yield from _session_simulator(
        vcsim_bin, clusters=1, hosts_per_cluster=2, standalone_hosts=0, vms=3, datastores=1,
        instance_uuid=VC2_INSTANCE_UUID,
    )


@pytest.fixture(scope="session")
@needs("simulator")
def sim_esx(vcsim_bin: Path) -> Iterator[Simulator]:
    """Standalone ESXi host (no instance uuid): VMs ha-host_VM0..1 on datastore LocalDS_0."""
    yield from _session_simulator(vcsim_bin, model="esx", vms=2, datastores=1)


@pytest.fixture(scope="module")
@needs("simulator")
def vc1(sim_vc1: Simulator) -> Iterator[SessionPool]:
    """A session pool on ``sim_vc1`` shared by one test module (read-only use)."""
    pool = open_pool("vc1", sim_vc1)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
@needs("simulator")
def esx(sim_esx: Simulator) -> Iterator[SessionPool]:
    """A session pool on ``sim_esx`` shared by one test module (read-only use)."""
    pool = open_pool("esx", sim_esx)
    yield pool
    pool.close()


@pytest.fixture
@needs("simulator")
def make_simulator(vcsim_bin: Path) -> Iterator[MakeSimulator]:
    """Factory: ``make_simulator(**start_simulator options)``; every simulator stops after the test."""
    started: list[Simulator] = []

    def make(**options: Any) -> Simulator:
        sim = start_simulator(binary=vcsim_bin, **options)
        started.append(sim)
        return sim

    yield make
    for sim in started:
        sim.stop()


@pytest.fixture
def si(sim: Simulator) -> Iterator[Any]:
    """A pyVmomi session on ``sim``, which each module using this defines (the simulator it needs)."""
    connection = pyvmomi_connect(sim)
    yield connection
    Disconnect(connection)


@pytest.fixture
def rig(make_simulator: MakeSimulator) -> Iterator[Rig]:
    """A fresh simulator (two clustered hosts, a standalone host, two datastores) with a pool and a pyVmomi
    session; all closed afterwards."""
    yield from start_rig(make_simulator)


@pytest.fixture
async def env(tmp_path: Path, make_simulator: MakeSimulator) -> AsyncIterator[Env]:
    """A gateway rig over a fresh two-VM simulator; every gateway it built is closed afterwards."""
    e = Env(tmp_path, make_simulator(vms=2))
    yield e
    for gw in e.gateways:
        await gw.close()


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """``gateway.cli.main`` configures the root logger (quiet for most commands); put its level and
    handlers back after each test so one command's choice never hides another test's log records."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield
    for handler in list(root.handlers):
        if handler not in saved[0]:
            root.removeHandler(handler)
            handler.close()  # a LogWriter's thread stops with it
    for handler in saved[0]:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(saved[1])
