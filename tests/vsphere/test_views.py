"""Container views kept per session (``gateway.vsphere.views``), against the simulator: a sweep reuses
its session's view, the view follows the inventory, and a view that is gone, a new login or the limit
makes a new one."""

from __future__ import annotations

from typing import Any

import pytest
from pyVim.connect import Disconnect
from pyVmomi import vim, vmodl
from support.simulator import (
    MakeSimulator,
    Simulator,
    find_vm,
    logged,
    open_pool,
    pyvmomi_connect,
    read_properties,
    wait_task,
)

from gateway.vsphere import listings
from gateway.vsphere.collector import Query, sweep
from gateway.vsphere.listings import VmQuery
from gateway.vsphere.pool import SessionPool, VSphereSession
from gateway.vsphere.views import ViewCache


@pytest.fixture
def pool(make_simulator: MakeSimulator) -> Any:
    sim = make_simulator(clusters=1, hosts_per_cluster=1, standalone_hosts=0, vms=2)
    pool = open_pool("views", sim)
    yield pool, sim
    pool.close()


def _names(pool: SessionPool) -> list[str]:
    result = pool.run(lambda s: listings.list_vms(s, VmQuery(fields=("name",))))
    return [row["name"] for row in result["vms"]]


def test_a_kept_view_follows_the_inventory(pool: tuple[SessionPool, Simulator]) -> None:
    sessions, sim = pool
    before = _names(sessions)
    si = pyvmomi_connect(sim)
    try:
        vm = find_vm(si, before[0])
        spec = vim.vm.CloneSpec(location=vim.vm.RelocateSpec())  # type: ignore[no-untyped-call]
        wait_task(si, vm.CloneVM_Task(folder=vm.parent, name="made-after-the-view", spec=spec))
        _result, methods = logged(sessions, lambda s: listings.list_vms(s, VmQuery(fields=("name",))))
        assert methods == ["RetrievePropertiesEx"]  # through the view the first call made
        assert sorted(_names(sessions)) == sorted([*before, "made-after-the-view"])
        wait_task(si, find_vm(si, "made-after-the-view").Destroy_Task())
        assert _names(sessions) == before
    finally:
        Disconnect(si)  # type: ignore[no-untyped-call]
    assert sessions.run(lambda s: s.views.made) == 1


def _kept_view(session: VSphereSession) -> Any:
    view, made = session.views.view(session.content, session.content.rootFolder, [vim.VirtualMachine])
    assert not made
    return view


def test_a_view_the_server_no_longer_knows_is_made_again(pool: tuple[SessionPool, Simulator]) -> None:
    sessions, _sim = pool
    before = _names(sessions)
    sessions.run(lambda s: _kept_view(s).DestroyView())
    result, methods = logged(sessions, lambda s: listings.list_vms(s, VmQuery(fields=("name",))))
    assert methods == ["RetrievePropertiesEx", "CreateContainerView", "RetrievePropertiesEx"]
    assert [row["name"] for row in result["vms"]] == before


def test_a_new_login_forgets_the_old_logins_views(pool: tuple[SessionPool, Simulator]) -> None:
    sessions, sim = pool
    before = _names(sessions)
    assert sim.control("/terminate-sessions", {})["terminated"] >= 1
    assert _names(sessions) == before
    assert sessions.stats.relogins == 1
    assert sessions.run(lambda s: (s.views.made, len(s.views))) == (2, 1)


def test_past_the_limit_the_view_used_least_recently_is_destroyed(
        pool: tuple[SessionPool, Simulator]) -> None:
    sessions, _sim = pool

    def three_sweeps(session: VSphereSession) -> Any:
        session.views = ViewCache(limit=2)
        first, _made = session.views.view(session.content, session.content.rootFolder, [vim.HostSystem])
        for kind in (vim.Datastore, vim.Network):
            sweep(session, [Query(kind, ("name",))])
        assert len(session.views) == 2
        with pytest.raises(vmodl.fault.ManagedObjectNotFound):
            read_properties(session.si, first, "view")
        return sweep(session, [Query(vim.HostSystem, ("name",))])

    assert [o.type for o in sessions.run(three_sweeps)] == ["HostSystem"]
