"""Events, tasks and customization status: the window scan and the folding on plain values, then the
collectors against the simulator with events posted through EventManager.PostEvent."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pyVmomi import vim, vmodl
from support.simulator import MakeSimulator, Simulator, open_pool, wait_until

from gateway import errors
from gateway.guard.patterns import compile_user_regex
from gateway.vsphere import history as h
from gateway.vsphere import resolve
from gateway.vsphere.history import Record, Window
from gateway.vsphere.pool import SessionPool, VSphereSession

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


# --------------------------------------------------------------------------------------------------
# windows


def test_window_defaults_to_minutes_back_from_now() -> None:
    assert h.make_window(None, None, 30, T0) == Window(T0 - timedelta(minutes=30), T0)
    end = T0 - timedelta(hours=2)
    assert h.make_window(None, end, 10, T0) == Window(end - timedelta(minutes=10), end)
    start = T0 - timedelta(days=1)
    assert h.make_window(start, None, 10, T0) == Window(start, T0)
    with pytest.raises(errors.InvalidArgument, match="start"):
        h.make_window(T0, T0 - timedelta(seconds=1), 10, T0)


# --------------------------------------------------------------------------------------------------
# the scan, on plain records


def rec(key: int, minutes_ago: float) -> Record:
    return Record(key, T0 - timedelta(minutes=minutes_ago), {"key": key})


class History:
    """Records newest first, served page by page like ReadPrevious* (the first page is 'latest')."""

    def __init__(self, records: Sequence[Record], first: int) -> None:
        self.records = list(records)
        self.position = first
        self.asked: list[int] = []

    def latest(self) -> list[Record]:
        return self.records[: self.position]

    def older(self, n: int) -> list[Record]:
        self.asked.append(n)
        batch = self.records[self.position: self.position + n]
        self.position += len(batch)
        return batch


WINDOW = Window(T0 - timedelta(minutes=60), T0)


def run_scan(history: History, max_scan: int, page: int = 10) -> h.ScanResult:
    return h.scan(history.latest(), history.older, window=WINDOW, max_scan=max_scan, page=page)


def test_scan_stops_at_the_first_record_older_than_the_window() -> None:
    records = [rec(100 - i, minutes_ago=i * 10) for i in range(20)]  # one every 10 minutes
    history = History(records, first=3)
    result = run_scan(history, max_scan=100, page=3)
    assert [r.key for r in result.records] == [100, 99, 98, 97, 96, 95, 94]  # 0..60 minutes ago
    assert result.complete and result.scanned == 9  # stopped on the page holding the first older record


def test_scan_ends_with_the_history() -> None:
    history = History([rec(i, minutes_ago=i) for i in range(5)], first=2)
    result = run_scan(history, max_scan=100, page=2)
    assert result.complete and len(result.records) == 5 and history.asked == [2, 2, 2]


def test_scan_skips_records_after_the_window_end_but_counts_them() -> None:
    history = History([rec(3, -5), rec(2, 5), rec(1, 90)], first=3)
    result = run_scan(history, max_scan=100)
    assert [r.key for r in result.records] == [2] and result.scanned == 3 and result.complete


@pytest.mark.parametrize(("in_window", "max_scan", "complete"), [
    (10, 10, True),    # exactly max_scan records, then the history ends
    (11, 10, False),   # one more record inside the window than allowed
    (10, 9, False),
])
def test_scan_limit_is_exact(in_window: int, max_scan: int, complete: bool) -> None:
    history = History([rec(i, minutes_ago=i) for i in range(in_window)], first=3)
    result = run_scan(history, max_scan=max_scan, page=3)
    assert result.complete is complete
    assert result.scanned <= max_scan + 1
    assert all(n <= 3 for n in history.asked)


def test_scan_limit_reached_on_the_record_that_passes_the_start_is_complete() -> None:
    history = History([rec(i, minutes_ago=i * 20) for i in range(10)], first=2)  # 0,20,40,60 in; 80 out
    result = run_scan(history, max_scan=4, page=2)
    assert result.complete and len(result.records) == 4


def test_scan_counts_duplicates_once_and_ends_a_history_that_repeats_forever() -> None:
    page = [rec(2, 1), rec(1, 2)]
    repeated = h.scan(page, lambda n: page, window=WINDOW, max_scan=50, page=10)
    assert repeated.scanned == 2 and not repeated.complete  # answers forever without ending: not trusted
    again = iter([page, []])
    once = h.scan(page, lambda n: next(again), window=WINDOW, max_scan=50, page=10)
    assert once.scanned == 2 and once.complete


def test_record_filter_and_shape() -> None:
    records = [
        Record(1, T0 - timedelta(minutes=3), {"type": "VmPoweredOnEvent", "user": "alice"},
               ("web-1", "esx-a")),
        Record(2, T0 - timedelta(minutes=2), {"type": "VmPoweredOffEvent", "user": "bob"}, ("web-2",)),
        Record(3, T0 - timedelta(minutes=1), {"type": "VmPoweredOnEvent", "user": "bob"}, ("db-1",)),
    ]
    result = h.ScanResult(records=records, scanned=3)
    keep = h.RecordFilter(h.allow(type=("VmPoweredOnEvent",), user=None),
                          compile_user_regex("entity_name", "^(web|db)-1$"))
    shaped = h.shape(result, keep, WINDOW, max_results=1, key="events")
    assert shaped["events"] == [records[2].data] and shaped["matched"] == 2 and shaped["truncated"] is True
    assert h.shape(result, h.RecordFilter(h.allow(user="alice")), WINDOW, 10, "events")["count"] == 1


# --------------------------------------------------------------------------------------------------
# customization folding


def ev(kind: str, minute: int, key: int, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "created": (T0 + timedelta(minutes=minute)).isoformat(), "key": key, **extra}


START, OK, FAIL = "CustomizationStartedEvent", "CustomizationSucceeded", "CustomizationSysprepFailed"


@pytest.mark.parametrize(("guest", "events", "status", "finished", "succeeded"), [
    (None, [], "not_started", False, None),
    ({"status": "idle"}, [], "not_started", False, None),
    (None, [ev(START, 1, 1)], "running", False, None),
    ({"status": "running"}, [], "running", False, None),
    (None, [ev(START, 1, 1), ev(OK, 2, 2)], "succeeded", True, True),
    ({"status": "succeeded"}, [], "succeeded", True, True),
    (None, [ev(START, 1, 1), ev(FAIL, 2, 2, reason="sysprep exited 1")], "failed", True, False),
    ({"status": "failed", "error": "guest script failed"}, [ev(START, 1, 1)], "failed", True, False),
    # the guest block saw the failure after the events reported success: a failure anywhere wins
    ({"status": "failed"}, [ev(START, 1, 1), ev(OK, 2, 2)], "failed", True, False),
    # an old success does not answer for a newer run
    (None, [ev(START, 1, 1), ev(OK, 2, 2), ev(START, 3, 3)], "running", False, None),
    (None, [ev(START, 1, 1), ev(FAIL, 2, 2), ev(START, 3, 3), ev(OK, 4, 4)], "succeeded", True, True),
])
def test_customization_folds_both_sources(guest: dict[str, Any] | None, events: list[dict[str, Any]],
                                          status: str, finished: bool, succeeded: bool | None) -> None:
    verdict = h.fold_customization(guest, events)
    assert (verdict["status"], verdict["finished"], verdict["succeeded"]) == (status, finished, succeeded)


def test_customization_failure_carries_the_reason_and_times() -> None:
    verdict = h.fold_customization(None, [ev(START, 1, 1), ev(FAIL, 2, 2, reason="sysprep exited 1")])
    assert verdict["error"] == "sysprep exited 1"
    assert verdict["started_at"] == ev(START, 1, 1)["created"]
    assert verdict["finished_at"] == ev(FAIL, 2, 2)["created"]
    assert h.fold_customization(None, [ev(FAIL, 2, 2)])["error"] == FAIL  # no text at all: name the failure


# --------------------------------------------------------------------------------------------------
# against the simulator


@pytest.fixture
def vc(make_simulator: MakeSimulator) -> Iterator[SessionPool]:
    pool = open_pool("vc", make_simulator(vms=2))
    yield pool
    pool.close()


def post(session: VSphereSession, vm_name: str, kind: Any, **fields: Any) -> None:
    """Post one event about ``vm_name`` (the simulator stamps key, time and user)."""
    vm = resolve.resolve_vm(session, vm_name)
    argument = vim.event.VmEventArgument(vm=vm.managed_object(session), name=vm.name)
    event = kind(key=0, chainId=0, createdTime=datetime.now(UTC), userName="", vm=argument, **fields)
    session.content.eventManager.PostEvent(event)


def methods_of(pool: SessionPool, fn: Callable[[VSphereSession], Any]) -> tuple[Any, list[str]]:
    def run(session: VSphereSession) -> tuple[Any, list[str]]:
        sent: list[str] = []

        def log(request: bytes) -> bytes:
            match = re.search(rb"<soapenv:Body>\s*<(\w+)", request)
            sent.append(match.group(1).decode() if match else "?")
            return request

        session.si._stub.requestModifierList.append(log)
        try:
            return fn(session), sent
        finally:
            session.si._stub.requestModifierList.remove(log)
    result: tuple[Any, list[str]] = pool.run(run)
    return result


def all_events(pool: SessionPool, **filters: Any) -> dict[str, Any]:
    query = h.EventQuery(window=Window(datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC)), **filters)
    result: dict[str, Any] = pool.run(lambda s: h.get_events(s, query))
    return result


def test_events_scroll_the_window_and_always_destroy_the_collector(vc: SessionPool) -> None:
    result, methods = methods_of(vc, lambda s: h.get_events(s, h.EventQuery(
        window=Window(datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC)))))
    assert result["count"] == result["matched"] > 0 and result["scanned"] >= result["count"]
    assert methods[0] == "CreateCollectorForEvents" and methods[-1] == "DestroyCollector"
    assert "SetCollectorPageSize" in methods and "ReadPreviousEvents" in methods
    types = {e["type"] for e in result["events"]}
    assert {"VmCreatedEvent", "VmPoweredOnEvent"} <= types
    created = [e["created"] for e in result["events"]]
    assert created == sorted(created, reverse=True)


def test_event_window_entity_name_type_and_user(vc: SessionPool, make_simulator: MakeSimulator) -> None:
    vc.run(lambda s: post(s, "DC0_C0_RP0_VM0", vim.event.VmMessageEvent, message="batch A"))
    first = all_events(vc, entity_name=compile_user_regex("entity_name", "^DC0_C0_RP0_VM0$"),
                       event_types=("VmMessageEvent",))
    [a] = first["events"]
    a_time = datetime.fromisoformat(a["created"])
    vc.run(lambda s: post(s, "DC0_C0_RP0_VM1", vim.event.VmMessageEvent, message="batch B"))
    vc.run(lambda s: post(s, "DC0_C0_RP0_VM0", vim.event.VmMessageEvent, message="batch C"))

    everything = all_events(vc, event_types=("VmMessageEvent",))
    assert [e["vm"] for e in everything["events"]] == ["DC0_C0_RP0_VM0", "DC0_C0_RP0_VM1", "DC0_C0_RP0_VM0"]
    just_vm0 = all_events(vc, entity_name=compile_user_regex("entity_name", "RP0_VM0"),
                          event_types=("VmMessageEvent",))
    assert [e["key"] for e in just_vm0["events"]] == [everything["events"][0]["key"], a["key"]]

    window = Window(a_time, a_time)  # exactly the first event's instant
    only_a = vc.run(lambda s: h.get_events(s, h.EventQuery(window=window, event_types=("VmMessageEvent",))))
    assert [e["key"] for e in only_a["events"]] == [a["key"]]
    assert only_a["window"] == {"start": a["created"], "end": a["created"]}

    mine = all_events(vc, user=a["user"], event_types=("VmMessageEvent",))
    assert mine["count"] == 3
    assert all_events(vc, user="someone-else@local", event_types=("VmMessageEvent",))["count"] == 0


def test_a_window_busier_than_max_scan_raises_rather_than_truncating(vc: SessionPool) -> None:
    for i in range(12):
        vc.run(lambda s, i=i: post(s, "DC0_C0_RP0_VM0", vim.event.VmMessageEvent, message=f"m{i}"))

    def too_busy(session: VSphereSession) -> errors.ScanLimitReached:
        window = Window(datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC))
        with pytest.raises(errors.ScanLimitReached) as caught:
            h.get_events(session, h.EventQuery(window=window, max_scan=10))
        return caught.value

    error, methods = methods_of(vc, too_busy)
    assert error.code == "scan_limit_reached"
    assert "'vc'" in error.message and "max_scan=10" in error.message
    assert error.details["scanned"] == 11
    assert methods[-1] == "DestroyCollector"
    complete = all_events(vc, max_scan=1000)
    assert complete["scanned"] > 12


def _run_task(session: VSphereSession, vm_name: str, method: str, *args: Any) -> str:
    """Run one VM task and wait for it through the PropertyCollector; returns the task's key."""
    vm = resolve.resolve_vm(session, vm_name).managed_object(session)
    task = getattr(vm, method)(*args)
    spec = vmodl.query.PropertyCollector.FilterSpec(
        objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=task)],
        propSet=[vmodl.query.PropertyCollector.PropertySpec(type=vim.Task, pathSet=["info.state"])])

    def state() -> str | None:
        [content] = session.content.propertyCollector.RetrieveContents([spec])
        value: str = content.propSet[0].val
        return value if value in ("success", "error") else None

    wait_until(state, timeout=20, what=f"{method} finished")
    key: str = task._moId
    return key


def all_tasks(pool: SessionPool, **filters: Any) -> dict[str, Any]:
    window = filters.pop("window", None) or Window(datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC))
    result: dict[str, Any] = pool.run(lambda s: h.get_tasks(s, h.TaskQuery(window=window, **filters)))
    return result


def test_tasks_are_read_from_a_task_history_collector_on_real_tasks(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=2)
    pool = open_pool("vc", sim)
    try:
        off = pool.run(lambda s: _run_task(s, "DC0_C0_RP0_VM0", "PowerOffVM_Task"))
        renamed = pool.run(lambda s: _run_task(s, "DC0_C0_RP0_VM1", "Rename_Task", "renamed-1"))
        sim.control("/fail-next", {"method": "PowerOnVM_Task", "fault": "InvalidState", "message": "no"})
        failed = pool.run(lambda s: _run_task(s, "DC0_C0_RP0_VM0", "PowerOnVM_Task"))

        result, methods = methods_of(pool, lambda s: h.get_tasks(s, h.TaskQuery(
            window=Window(datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC)))))
        assert methods[0] == "CreateCollectorForTasks" and methods[-1] == "DestroyCollector"
        by_key = {t["key"]: t for t in result["tasks"]}
        assert {off, renamed, failed} <= set(by_key)
        assert by_key[off]["entity"] == "DC0_C0_RP0_VM0" and by_key[off]["state"] == "success"
        assert by_key[failed]["state"] == "error" and by_key[failed]["error"]
        queued = [t["queued"] for t in result["tasks"]]
        assert queued == sorted(queued, reverse=True)

        assert [t["key"] for t in all_tasks(pool, states=("error",))["tasks"]] == [failed]
        assert [t["key"] for t in all_tasks(pool, task_id=renamed)["tasks"]] == [renamed]
        vm0 = all_tasks(pool, entity_name=re.compile("^DC0_C0_RP0_VM0$"))["tasks"]
        assert {t["key"] for t in vm0} == {off, failed}
        after_off = Window(datetime.fromisoformat(by_key[renamed]["queued"]), datetime.now(UTC))
        assert off not in {t["key"] for t in all_tasks(pool, window=after_off)["tasks"]}
        user = by_key[off]["user"]
        assert all_tasks(pool, user=user)["count"] == result["count"]
        assert all_tasks(pool, user="someone-else@local")["count"] == 0
    finally:
        pool.close()


def test_a_busy_task_window_raises_rather_than_truncating(make_simulator: MakeSimulator) -> None:
    pool = open_pool("vc", make_simulator(vms=1))
    try:
        moid = pool.run(lambda s: resolve.resolve_vm(s, "DC0_C0_RP0_VM0").moid)
        for i in range(12):
            pool.run(lambda s, i=i: _run_task(s, moid, "Rename_Task", f"n{i}"))
        with pytest.raises(errors.ScanLimitReached):
            all_tasks(pool, max_scan=10)
        assert all_tasks(pool, max_scan=100)["count"] == 12
    finally:
        pool.close()


def test_a_target_without_task_history_is_a_clear_not_supported(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=1)
    pool = open_pool("vc", sim)
    try:
        # The launcher keeps task history; a server without it answers NotSupported (injected here).
        sim.control("/fail-next", {"method": "CreateCollectorForTasks", "fault": "NotSupported"})
        query = h.TaskQuery(window=Window(datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC)))
        with pytest.raises(errors.NotSupported) as caught:
            pool.run(lambda s: h.get_tasks(s, query))
    finally:
        pool.close()
    assert caught.value.code == "not_supported"
    assert "CreateCollectorForTasks" in caught.value.message and "'vc'" in caught.value.message


def test_customization_status_from_posted_events(vc: SessionPool) -> None:
    def status() -> dict[str, Any]:
        result: dict[str, Any] = vc.run(lambda s: h.get_customization_status(s, "DC0_C0_RP0_VM0"))
        return result

    before = status()
    assert (before["status"], before["finished"], before["succeeded"]) == ("not_started", False, None)
    assert before["guest_customization_info"] == "not reported by this target"

    vc.run(lambda s: post(s, "DC0_C0_RP0_VM0", vim.event.CustomizationStartedEvent, template=False))
    vc.run(lambda s: post(s, "DC0_C0_RP0_VM1", vim.event.CustomizationSucceeded, template=False))
    running = status()
    assert (running["status"], running["finished"]) == ("running", False)
    assert [e["type"] for e in running["events"]] == ["CustomizationStartedEvent"]  # VM1's event is not ours

    vc.run(lambda s: post(s, "DC0_C0_RP0_VM0", vim.event.CustomizationNetworkSetupFailed, template=False))
    failed = status()
    assert (failed["status"], failed["finished"], failed["succeeded"]) == ("failed", True, False)
    assert failed["error"] == "CustomizationNetworkSetupFailed"  # API 6.5 events carry no reason text

    vc.run(lambda s: post(s, "DC0_C0_RP0_VM0", vim.event.CustomizationStartedEvent, template=False))
    vc.run(lambda s: post(s, "DC0_C0_RP0_VM0", vim.event.CustomizationSucceeded, template=False))
    rerun = status()
    assert (rerun["status"], rerun["finished"], rerun["succeeded"]) == ("succeeded", True, True)
    assert len(rerun["events"]) == 4


def test_events_on_esx(sim_esx: Simulator) -> None:
    pool = open_pool("esx", sim_esx)
    try:
        result = all_events(pool)
        assert result["count"] > 0
        assert pool.run(lambda s: h.get_customization_status(s, "ha-host_VM0"))["status"] == "not_started"
    finally:
        pool.close()
