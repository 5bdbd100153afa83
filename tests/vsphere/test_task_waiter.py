"""The task waiter and the mutation plumbing (gateway/vsphere/task_waiter.py, gateway/vsphere/actions/).

Against a fresh simulator per test: progress relayed from a slowly running task, vSphere errors,
deadlines (outcome unknown for destructive tasks, timeout for writes), the private collector and
filter destroyed on every path, and session expiry re-run only before anything changed. Pure
helpers (ISO paths, bulk name patterns) get table tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from pyVmomi import vim, vmodl
from support.simulator import Simulator, wait_until
from support.vsphere_rig import Rig, start_rig

from gateway import errors
from gateway.tools.destructive import DELETE_VM, UNREGISTER_VM
from gateway.tools.write import CLONE, POWER_OFF, POWER_ON
from gateway.vocabulary import Plan
from gateway.vsphere.actions import bulk, execution, hardware, planning, power
from gateway.vsphere.collector import managed_object
from gateway.vsphere.pool import VSphereSession
from gateway.vsphere.task_waiter import wait_for_task

MakeSimulator = Callable[..., Simulator]
CLUSTER_VM = "DC0_C0_RP0_VM0"


def _wait(rig: Rig, vm_name: str, method: str, *, seconds: float, destructive: bool,
          progress: Callable[[float, str], None] | None = None, session: Any = None, **kwargs: Any) -> Any:
    """Start ``method`` on the VM and wait for it with a deadline ``seconds`` from now."""
    moid = rig.moid(vm_name)

    def go(s: VSphereSession) -> Any:
        task = getattr(managed_object(s, vim.VirtualMachine, moid), method)(**kwargs)
        return wait_for_task(session or s, task, deadline=time.monotonic() + seconds,
                             progress=progress or rig.record, destructive=destructive, label=method)

    return rig.run(go)


# --------------------------------------------------------------------------------------------------
# The waiter


def test_waiter_returns_the_task_result_and_reports_completion(rig: Rig) -> None:
    ref = _wait(rig, "DC0_H0_VM0", "CreateSnapshot_Task", seconds=30, destructive=False, name="s1",
                description="", memory=False, quiesce=False)

    rows, current = rig.snapshots("DC0_H0_VM0")
    assert ref._moId == current == rows[0]["moid"]
    assert rig.progress[-1][0] == 1.0


def test_waiter_relays_progress_of_a_slow_task_in_increasing_fractions(rig: Rig) -> None:
    rig.sim.control("/slow-task", {"method": "PowerOffVM_Task", "seconds": 2, "count": 1})

    _wait(rig, "DC0_H0_VM0", "PowerOffVM_Task", seconds=30, destructive=False)

    fractions = [f for f, _m in rig.progress]
    assert fractions == sorted(set(fractions)), fractions
    assert len([f for f in fractions if 0 < f < 1]) >= 2, fractions
    assert fractions[-1] == 1.0
    assert all(m.startswith("PowerOffVM_Task") for _f, m in rig.progress)
    assert rig.power("DC0_H0_VM0") == "poweredOff"


def test_waiter_raises_task_failed_with_the_targets_message(rig: Rig) -> None:
    rig.sim.control("/fail-next", {"method": "CreateSnapshot_Task", "entity": "DC0_H0_VM0",
                                   "fault": "FileFault", "message": "disk locked by another process"})

    with pytest.raises(errors.TaskFailed) as caught:
        _wait(rig, "DC0_H0_VM0", "CreateSnapshot_Task", seconds=30, destructive=False, name="s1",
              description="", memory=False, quiesce=False)

    assert "disk locked by another process" in caught.value.message
    assert caught.value.details["task"].startswith("task-")
    assert caught.value.details["fault"] == "vim.fault.FileFault"


def test_destructive_task_past_its_deadline_has_an_unknown_outcome_with_the_task_id(rig: Rig) -> None:
    rig.sim.control("/slow-task", {"method": "Destroy_Task", "seconds": 2.5, "count": 1})
    rig.vm("DC0_H0_VM1").PowerOffVM_Task()
    wait_until(lambda: rig.power("DC0_H0_VM1") == "poweredOff", what="powered off")

    with pytest.raises(errors.OutcomeUnknown) as caught:
        _wait(rig, "DC0_H0_VM1", "Destroy_Task", seconds=0.5, destructive=True)

    task = caught.value.details["task"]
    assert task.startswith("task-")
    assert task in caught.value.message and "get_tasks" in caught.value.message
    assert "DC0_H0_VM1" in rig.vm_names()  # not done yet: neither failed nor finished
    wait_until(lambda: "DC0_H0_VM1" not in rig.vm_names(), timeout=15, what="the slow delete to finish")


def test_write_task_past_its_deadline_is_a_timeout_with_the_task_id(rig: Rig) -> None:
    rig.sim.control("/slow-task", {"method": "PowerOffVM_Task", "seconds": 3, "count": 1})

    with pytest.raises(errors.Timeout) as caught:
        _wait(rig, "DC0_H0_VM0", "PowerOffVM_Task", seconds=0.5, destructive=False)

    assert caught.value.details["task"].startswith("task-")
    assert caught.value.details["task"] in caught.value.message


class _RecordingCollectors:
    """A session whose PropertyCollector hands out real private collectors and remembers them."""

    def __init__(self, session: VSphereSession) -> None:
        self.collectors: list[Any] = []
        self.filters: list[Any] = []
        outer = self
        real = session.content.propertyCollector

        class Root:
            def CreatePropertyCollector(self) -> Any:
                collector = real.CreatePropertyCollector()
                outer.collectors.append(collector)
                return SimpleNamespace(
                    CreateFilter=outer._create_filter(collector),
                    WaitForUpdatesEx=collector.WaitForUpdatesEx,
                    RetrievePropertiesEx=collector.RetrievePropertiesEx,
                    DestroyPropertyCollector=collector.DestroyPropertyCollector)

        self.session = SimpleNamespace(target=session.target, si=session.si,
                                       socket_timeout=session.socket_timeout,
                                       content=SimpleNamespace(propertyCollector=Root()))

    def _create_filter(self, collector: Any) -> Callable[..., Any]:
        def create(*args: Any, **kwargs: Any) -> Any:
            made = collector.CreateFilter(*args, **kwargs)
            self.filters.append(made)
            return made
        return create


def _gone(obj: Any, method: str) -> bool:
    try:
        getattr(obj, method)()
    except vmodl.fault.ManagedObjectNotFound:
        return True
    return False


@pytest.mark.parametrize("outcome", ["success", "deadline"])
def test_waiter_destroys_its_filter_and_collector_on_every_path(rig: Rig, outcome: str) -> None:
    if outcome == "deadline":
        rig.sim.control("/slow-task", {"method": "PowerOffVM_Task", "seconds": 2, "count": 1})
    seen: list[_RecordingCollectors] = []

    def go(s: VSphereSession) -> None:
        recorder = _RecordingCollectors(s)
        seen.append(recorder)
        task = managed_object(s, vim.VirtualMachine, rig.moid("DC0_H0_VM0")).PowerOffVM_Task()
        try:
            seconds = 30 if outcome == "success" else 0.5
            wait_for_task(recorder.session, task, deadline=time.monotonic() + seconds, progress=rig.record,
                          destructive=True)
        except errors.OutcomeUnknown:
            assert outcome == "deadline"
        # Still inside the same session: the objects would exist if they had not been destroyed.
        assert len(recorder.filters) == len(recorder.collectors) == 1
        assert _gone(recorder.filters[0], "DestroyPropertyFilter")
        assert _gone(recorder.collectors[0], "DestroyPropertyCollector")

    rig.run(go)
    assert seen


# --------------------------------------------------------------------------------------------------
# Session expiry: re-run before any change, reported after one


def test_session_expiry_before_the_first_change_is_retried_by_the_pool(rig: Rig) -> None:
    rig.vm("DC0_H0_VM0").PowerOffVM_Task()
    wait_until(lambda: rig.power("DC0_H0_VM0") == "poweredOff", what="powered off")
    plan = rig.plan(UNREGISTER_VM, vm="DC0_H0_VM0")
    rig.sim.control("/fail-next", {"method": "UnregisterVM", "fault": "NotAuthenticated"})

    result = rig.execute(UNREGISTER_VM, plan)

    assert result["unregistered_vm"] == "DC0_H0_VM0"
    assert "DC0_H0_VM0" not in rig.vm_names()
    assert rig.pool.stats.relogins == 1


def test_session_expiry_after_a_change_is_reported_not_retried(rig: Rig) -> None:
    plan = rig.plan(POWER_OFF, vm="DC0_H0_VM0")
    rig.sim.control("/fail-next", {"method": "CreatePropertyCollector", "fault": "NotAuthenticated"})

    with pytest.raises(errors.NotAuthenticated) as caught:
        rig.execute(POWER_OFF, plan)

    assert caught.value.details["task"].startswith("task-")
    assert rig.pool.stats.relogins == 0
    assert rig.power("DC0_H0_VM0") == "poweredOff"  # the task ran once; the wait for it was what failed


def test_destructive_change_whose_wait_is_lost_reports_an_unknown_outcome(rig: Rig) -> None:
    plan = rig.plan(DELETE_VM, vm="DC0_H0_VM0", force_power_off=True)
    rig.sim.control("/fail-next", {"method": "CreatePropertyCollector", "fault": "NotAuthenticated"})

    with pytest.raises(errors.OutcomeUnknown) as caught:
        rig.execute(DELETE_VM, plan)

    assert caught.value.details["task"].startswith("task-")
    assert caught.value.details["cause"] == "not_authenticated"
    assert rig.pool.stats.relogins == 0


def test_guest_shutdown_waits_for_the_vm_to_be_off(rig: Rig) -> None:
    # power_off_vm only asks the guest when VMware Tools runs, which the simulator never reports; so the
    # request-and-watch step is exercised on its own (the simulator's ShutdownGuest powers off at once).
    moid = rig.moid("DC0_H0_VM0")
    plan = Plan("", (), {"vm": moid, "vm_name": "DC0_H0_VM0"})

    why = rig.run(lambda s: power.guest_shutdown(execution.Execution(s, plan, rig.record), 10))

    assert why is None
    assert rig.power("DC0_H0_VM0") == "poweredOff"
    refused = rig.run(lambda s: power.guest_shutdown(execution.Execution(s, plan, rig.record), 10))
    assert refused is not None and "refused" in refused  # already off: vSphere refuses, the caller goes hard


# --------------------------------------------------------------------------------------------------
# Write outcomes: a lost answer is an unknown outcome, never "unreachable" (worth a retry)


@pytest.fixture
def quick_rig(make_simulator: MakeSimulator) -> Iterator[Rig]:
    """A rig whose target times out a SOAP call after 2 s (to lose an answer on purpose)."""
    yield from start_rig(make_simulator, timeout_seconds=2)


def _powered_off(rig: Rig, name: str) -> None:
    rig.vm(name).PowerOffVM_Task()
    wait_until(lambda: rig.power(name) == "poweredOff", what=f"{name} powered off")


def test_a_write_whose_answer_is_lost_has_an_unknown_outcome(quick_rig: Rig) -> None:
    rig = quick_rig
    _powered_off(rig, "DC0_H0_VM0")
    plan = rig.plan(POWER_ON, vm="DC0_H0_VM0")
    # The request reaches the target and is carried out; its answer comes after the socket timeout.
    rig.sim.control("/delay", {"method_delay": {"PowerOnVM_Task": 4000}})

    with pytest.raises(errors.OutcomeUnknown) as caught:
        rig.execute(POWER_ON, plan)

    assert caught.value.details["cause"] == "timeout"
    assert "Do not retry" in caught.value.message
    rig.sim.control("/reset", {})
    wait_until(lambda: rig.power("DC0_H0_VM0") == "poweredOn", timeout=20, what="the power-on to take effect")


def test_a_write_whose_task_is_lost_while_waiting_has_an_unknown_outcome(quick_rig: Rig) -> None:
    rig = quick_rig
    _powered_off(rig, "DC0_H0_VM0")
    plan = rig.plan(POWER_ON, vm="DC0_H0_VM0")
    # The task is submitted; the connection is lost while following it (the waiter's first call).
    rig.sim.control("/delay", {"method_delay": {"CreatePropertyCollector": 4000}})

    with pytest.raises(errors.OutcomeUnknown) as caught:
        rig.execute(POWER_ON, plan)

    assert caught.value.details["task"].startswith("task-")
    assert caught.value.details["cause"] == "timeout"
    rig.sim.control("/reset", {})
    assert rig.power("DC0_H0_VM0") == "poweredOn"


def _refused_connection_fake(**_kwargs: Any) -> Any:
    """Stands in for a SOAP method whose connection is refused at that very call (the simulator cannot
    refuse one call while answering the reads around it)."""
    raise ConnectionRefusedError(111, "Connection refused")


def test_a_write_that_was_never_sent_stays_unreachable(rig: Rig) -> None:
    plan = Plan("", (), {"vm": rig.moid("DC0_H0_VM0"), "vm_name": "DC0_H0_VM0"})

    def body(call: execution.Execution) -> dict[str, Any]:
        call.invoke(_refused_connection_fake, destructive=False, what="power on")
        return {}

    execute = execution._executor(body)
    with pytest.raises(errors.Unreachable) as caught:
        rig.run(lambda s: execute(s, plan, rig.record))
    assert not isinstance(caught.value, errors.OutcomeUnknown)


@pytest.mark.parametrize(("name", "stored"), [
    ("web/1", "web%2f1"),
    ("back\\slash", "back%5cslash"),
    ("cost%20", "cost%2520"),
    ("a%2fb", "a%2fb"),  # already escaped as vSphere escapes it: kept
    ("plain-name", "plain-name"),
])
def test_clone_names_are_escaped_as_vsphere_escapes_them(rig: Rig, name: str, stored: str) -> None:
    plan = rig.plan(CLONE, vm=CLUSTER_VM, name=name)
    assert plan.affected[1].name == stored

    result = rig.execute(CLONE, plan)

    assert result["clone"]["name"] == stored
    assert stored in rig.vm_names()
    with pytest.raises(errors.InvalidArgument, match="already exists"):
        rig.plan_checked(CLONE, vm=CLUSTER_VM, name=name)  # the same name again is taken, however it is spelt


@pytest.mark.parametrize(("name", "stored"), [
    ("web/1", "web%2f1"), ("a\\b", "a%5cb"), ("50%", "50%25"), ("%25", "%25"), ("%2F%5C", "%2F%5C"),
    ("%zz", "%25zz"), ("%2", "%252"), ("plain", "plain"),
])
def test_vsphere_name_escaping(name: str, stored: str) -> None:
    assert planning.vsphere_name(name) == stored


# --------------------------------------------------------------------------------------------------
# Pure helpers


@pytest.mark.parametrize(("value", "expected"), [
    ("[LocalDS_0] isos/ubuntu.iso", ("LocalDS_0", "isos/ubuntu.iso")),
    ("[shared nfs]  a b/c.ISO", ("shared nfs", "a b/c.ISO")),
    ("[ds]image.iso", ("ds", "image.iso")),
])
def test_parse_iso_path_accepts_datastore_paths(value: str, expected: tuple[str, str]) -> None:
    assert hardware.parse_iso_path(value) == expected


@pytest.mark.parametrize("value", [
    "isos/ubuntu.iso", "[ds] isos/disk.vmdk", "[] x.iso", "[ds] ", "[ds] a\nb.iso",
])
def test_parse_iso_path_refuses_anything_else_naming_the_field(value: str) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        hardware.parse_iso_path(value)
    assert caught.value.details["field"] == "iso_path"


@pytest.mark.parametrize(("pattern", "name", "matches"), [
    ("web-\\d+", "web-12", True),
    ("web-\\d+", "old-web-12", False),
    ("web-\\d+", "web-12-old", False),
    ("web|db", "db", True),
    ("web|db", "dbx", False),
    (".*", "anything", True),
])
def test_bulk_name_regex_must_match_the_whole_name(pattern: str, name: str, matches: bool) -> None:
    assert bulk.compile_name_regex(pattern).fullmatch(name) is matches


@pytest.mark.parametrize("pattern", ["web-(", "x" * 201, "[z-a]"])
def test_bulk_name_regex_errors_name_the_field(pattern: str) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        bulk.compile_name_regex(pattern)
    assert caught.value.details["field"] == "name_regex"
