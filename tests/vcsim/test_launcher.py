"""The simulator launcher (deploy/vcsim) and its control endpoint, exercised over SOAP with pyVmomi."""

from __future__ import annotations

import http.client
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from pyVim.connect import Disconnect
from pyVmomi import vim
from support.simulator import (
    VC1_INSTANCE_UUID,
    VC2_INSTANCE_UUID,
    MakeSimulator,
    Simulator,
    SimulatorError,
    find_vm,
    pyvmomi_connect,
    read_properties,
    wait_until,
    write_targets,
)

from gateway.config import load_targets

TERMINAL = ("success", "error")


def disconnect(si: Any) -> None:
    disconnect_any: Any = Disconnect  # untyped
    disconnect_any(si)


def test_each_model_answers_pyvmomi_logins(
    sim_vc1: Simulator, sim_vc2: Simulator, sim_esx: Simulator
) -> None:
    kinds = {}
    for sim in (sim_vc1, sim_vc2, sim_esx):
        si = pyvmomi_connect(sim)
        kinds[sim.port] = si.content.about.apiType
        disconnect(si)
    assert kinds == {sim_vc1.port: "VirtualCenter", sim_vc2.port: "VirtualCenter", sim_esx.port: "HostAgent"}


def test_vcenters_report_their_own_instance_uuid(sim_vc1: Simulator, sim_vc2: Simulator) -> None:
    uuids = []
    for sim in (sim_vc1, sim_vc2):
        si = pyvmomi_connect(sim)
        uuids.append(si.content.about.instanceUuid)
        disconnect(si)
    assert uuids == [VC1_INSTANCE_UUID, VC2_INSTANCE_UUID]
    assert (sim_vc1.instance_uuid, sim_vc2.instance_uuid) == (VC1_INSTANCE_UUID, VC2_INSTANCE_UUID)


def test_session_fixtures_have_the_documented_inventories(sim_vc1: Simulator, sim_esx: Simulator) -> None:
    assert sim_vc1.vm_names() == ["DC0_C0_RP0_VM0", "DC0_C0_RP0_VM1", "DC0_H0_VM0", "DC0_H0_VM1"]
    assert [ds["name"] for ds in sim_vc1.inventory()["datastores"]] == ["LocalDS_0", "LocalDS_1"]
    assert sim_esx.vm_names() == ["ha-host_VM0", "ha-host_VM1"]
    assert sim_esx.instance_uuid is None


def test_only_the_configured_password_logs_in(sim_vc1: Simulator) -> None:
    with pytest.raises(vim.fault.InvalidLogin):
        pyvmomi_connect(sim_vc1, password=sim_vc1.password + "x")
    with pytest.raises(vim.fault.InvalidLogin):
        pyvmomi_connect(sim_vc1, user="someone-else")


def test_connection_state_control_shows_in_the_property_collector(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=1)
    si = pyvmomi_connect(sim)
    vm = find_vm(si, "DC0_C0_RP0_VM0")
    assert read_properties(si, vm, "runtime.connectionState") == {"runtime.connectionState": "connected"}

    reply = sim.control("/vm/connection-state", {"vm": "DC0_C0_RP0_VM0", "state": "orphaned"})

    assert reply["moid"] == vm._moId
    props = read_properties(si, vm, "runtime.connectionState", "summary.runtime.connectionState")
    assert props == {"runtime.connectionState": "orphaned", "summary.runtime.connectionState": "orphaned"}
    disconnect(si)


def test_control_rejects_unknown_objects_and_values(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=1)
    with pytest.raises(SimulatorError, match="404"):
        sim.control("/vm/connection-state", {"vm": "no-such-vm", "state": "orphaned"})
    with pytest.raises(SimulatorError, match="400"):
        sim.control("/vm/connection-state", {"vm": "DC0_C0_RP0_VM0", "state": "sideways"})
    with pytest.raises(SimulatorError, match="unknown field"):
        sim.control("/fail-next", {"method": "PowerOnVM_Task", "falut": "InvalidState"})
    with pytest.raises(SimulatorError, match="unknown fault type"):
        sim.control("/fail-next", {"method": "PowerOnVM_Task", "fault": "NoSuchFault"})


def test_method_delay_holds_that_method_while_other_calls_complete(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=1)
    sim.control("/delay", {"method_delay": {"PowerOffVM_Task": 3000}})
    slow_si, fast_si = pyvmomi_connect(sim), pyvmomi_connect(sim)
    slow_vm, fast_vm = find_vm(slow_si, "DC0_C0_RP0_VM0"), find_vm(fast_si, "DC0_C0_RP0_VM0")
    worker = threading.Thread(target=slow_vm.PowerOffVM_Task)
    worker.start()

    wait_until(lambda: sim.control("/inflight")["calls"].get("PowerOffVM_Task"), what="power-off in flight")
    # The delay comes before the handler runs: the VM is still on while other calls go through.
    assert read_properties(fast_si, fast_vm, "runtime.powerState") == {"runtime.powerState": "poweredOn"}
    assert worker.is_alive()

    worker.join(timeout=30)
    assert not worker.is_alive()
    assert read_properties(fast_si, fast_vm, "runtime.powerState") == {"runtime.powerState": "poweredOff"}
    disconnect(slow_si)
    disconnect(fast_si)


def observe_task(si: Any, task: Any, timeout: float = 30.0) -> list[tuple[str, int | None]]:
    """(state, progress) as seen through the PropertyCollector until the task ends."""
    seen: list[tuple[str, int | None]] = []

    def finished() -> bool:
        props = read_properties(si, task, "info.state", "info.progress")
        seen.append((props["info.state"], props.get("info.progress")))
        return seen[-1][0] in TERMINAL

    wait_until(finished, timeout=timeout, interval=0.05, what="task end")
    return seen


@pytest.mark.parametrize("method", ["PowerOffVM_Task", "Destroy_Task"])
def test_slow_task_reports_progress_then_completes(make_simulator: MakeSimulator, method: str) -> None:
    sim = make_simulator(vms=1)
    sim.control("/slow-task", {"method": method, "entity": "DC0_C0_RP0_VM0", "seconds": 2, "count": 1})
    si = pyvmomi_connect(sim)
    vm = find_vm(si, "DC0_C0_RP0_VM0")
    if method == "Destroy_Task":  # only a powered-off VM can be destroyed
        observe_task(si, vm.PowerOffVM_Task())

    task = getattr(vm, method)()
    running = read_properties(si, task, "info.state", "info.progress")
    assert running["info.state"] == "running" and running["info.progress"] < 100
    assert "DC0_C0_RP0_VM0" in sim.vm_names()  # the real work happens at the end

    seen = observe_task(si, task)
    assert seen[-1] == ("success", 100)
    running_progress = [p for state, p in seen if state == "running"]
    steps = [p for p in running_progress if p is not None]
    assert steps == running_progress, "a running slow task always has a progress"
    assert steps == sorted(steps) and all(p % 10 == 0 and p < 100 for p in steps)
    after = sim.inventory()["vms"]
    if method == "Destroy_Task":
        assert after == []
    else:
        assert after[0]["power_state"] == "poweredOff"
    assert sim.control("/rules")["slow"] == []  # count 1 is used up
    disconnect(si)


def test_slow_task_outlives_a_client_that_stops_waiting(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=1)
    sim.control("/slow-task", {"method": "PowerOffVM_Task", "seconds": 1})
    si = pyvmomi_connect(sim)
    task = find_vm(si, "DC0_C0_RP0_VM0").PowerOffVM_Task()
    disconnect(si)  # the caller gives up and leaves

    other = pyvmomi_connect(sim)
    task_type: Any = vim.Task  # untyped
    task_again = task_type(task._moId, other._stub)
    assert observe_task(other, task_again)[-1] == ("success", 100)
    disconnect(other)


def test_fail_next_fails_the_snapshot_of_one_vm_only(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=2)
    sim.control(
        "/fail-next",
        {"method": "CreateSnapshot_Task", "entity": "DC0_C0_RP0_VM1", "fault": "vim.fault.FileFault",
         "message": "disk locked"},
    )
    si = pyvmomi_connect(sim)
    outcomes = {}
    for name in ("DC0_C0_RP0_VM0", "DC0_C0_RP0_VM1"):
        task = find_vm(si, name).CreateSnapshot_Task(name="before-change", memory=False, quiesce=False)
        observe_task(si, task)
        outcomes[name] = read_properties(si, task, "info.state", "info.error")
    assert outcomes["DC0_C0_RP0_VM0"]["info.state"] == "success"
    failed = outcomes["DC0_C0_RP0_VM1"]
    assert failed["info.state"] == "error" and failed["info.error"].msg == "disk locked"
    assert isinstance(failed["info.error"], vim.fault.FileFault)

    # Used up: the next attempt on the same VM succeeds.
    task = find_vm(si, "DC0_C0_RP0_VM1").CreateSnapshot_Task(name="retry", memory=False, quiesce=False)
    assert observe_task(si, task)[-1][0] == "success"
    disconnect(si)


def test_fail_next_on_a_plain_method_raises_the_fault(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=1)
    sim.control("/fail-next", {"method": "RetrievePropertiesEx", "fault": "NoPermission"})
    si = pyvmomi_connect(sim)
    vm = find_vm(si, "DC0_C0_RP0_VM0")
    with pytest.raises(vim.fault.NoPermission):
        read_properties(si, vm, "name")
    assert read_properties(si, vm, "name") == {"name": "DC0_C0_RP0_VM0"}
    disconnect(si)


def test_terminated_sessions_fail_not_authenticated_until_login(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=1)
    first, second = pyvmomi_connect(sim), pyvmomi_connect(sim)

    assert sim.control("/terminate-sessions", {}) == {"terminated": 2}

    for si in (first, second):
        with pytest.raises(vim.fault.NotAuthenticated):
            si.content.sessionManager.currentSession  # noqa: B018 - the property read is the call
    fresh = pyvmomi_connect(sim)
    assert fresh.content.sessionManager.currentSession.userName == sim.user
    disconnect(fresh)


def test_host_connection_state_and_http_status_controls(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(model="esx", vms=1)
    si = pyvmomi_connect(sim)
    view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.HostSystem], True)
    host = view.view[0]

    sim.control("/host/connection-state", {"host": host._moId, "state": "notResponding"})
    sim.control("/status-next", {"status": 503})

    with pytest.raises(http.client.HTTPException, match="503"):
        read_properties(si, host, "runtime.connectionState")
    state = read_properties(si, host, "runtime.connectionState")
    assert state == {"runtime.connectionState": "notResponding"}
    disconnect(si)


def test_stop_leaves_no_simulator_folders(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(datastores=2, vms=1)
    assert list(sim.tmpdir.glob("vcsim-gw-*/govcsim-*")), "datastore folders live under the private temp dir"

    os.kill(sim.pid, signal.SIGTERM)
    assert sim.process.wait(timeout=15) == 0
    assert [p.name for p in sim.tmpdir.iterdir()] == ["vcsim.log"]

    sim.stop()
    assert not sim.tmpdir.exists()
    assert not sim.running


def test_written_targets_load_with_their_credentials(
    tmp_path: Path, sim_vc1: Simulator, sim_vc2: Simulator, sim_esx: Simulator
) -> None:
    path = tmp_path / "targets.yaml"
    env = write_targets(path, {"vc1": sim_vc1, "vc2": sim_vc2, "esx1": sim_esx}, {"vc2": {"tags": ["lab"]}})

    targets = {t.name: t for t in load_targets(path, env)}

    assert set(targets) == {"vc1", "vc2", "esx1"}
    assert targets["vc1"].port == sim_vc1.port and targets["vc1"].insecure
    assert targets["vc2"].tags == ("lab",) and targets["esx1"].standalone_host
    assert targets["vc1"].credentials(env).password == sim_vc1.password
    assert sim_vc1.password not in path.read_text()


def test_gc_control_runs_a_collection_and_reports_the_heap(sim_vc1: Simulator) -> None:
    first = sim_vc1.control("/gc")
    second = sim_vc1.control("/gc")
    assert second["collections"] > first["collections"]  # each call is a collection of its own
    assert second["heap_alloc_bytes"] > 0
