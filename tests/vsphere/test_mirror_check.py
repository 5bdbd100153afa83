"""The mirror checks itself (gateway.vsphere.mirror_check): every answer it gives is what a sweep would
say, even when its update stream lies.

Against the simulator, with changes made directly with pyVmomi (or through the gateway): a stream that
another session's filter silences, sessions the target ended, connections cut by a relay, moves the
simulator reports as an enter then a leave, reconfigurations it does not report at all. Each must show
in the very next read; what the stream alone misses is found by the background check, logged, counted
(``divergences``, ``gateway_mirror_divergence_total``) and repaired by a resync, and reads sweep until
it is. The differential test at the end does all of it at random against direct sweeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyVim.connect import Disconnect
from pyVmomi import vim, vmodl
from support.simulator import (
    MakeSimulator,
    Relay,
    Simulator,
    find_vm,
    mirror_credentials,
    mirror_synced,
    pyvmomi_connect,
    sim_target,
    wait_until,
    write_targets,
)

from gateway.auth.tokens import Principal
from gateway.config import ConfigProblems, Credentials, Target, parse_targets
from gateway.server.runtime import Gateway
from gateway.settings import Settings
from gateway.tools.read import MIRROR_READS
from gateway.vsphere import listings, mirror_check
from gateway.vsphere.mirror import Mirror, Mirrors, _apply_update
from gateway.vsphere.pool import SessionPool
from gateway.vsphere.soap_scan import ObjectProps

ADMIN = Principal("alice", "admin", surface="test")
FIELDS = ["moid", "name", "power_state", "memory_mb", "folder", "host"]


# ------------------------------------------------------------------------------ helpers



def answer(mirrors: Mirrors, target: str, **args: Any) -> dict[str, Any] | None:
    got = asyncio.run(mirrors.answer(target, "list_vms", {"target": target, **args}))
    return None if got is None else got.value


def mirrored(mirrors: Mirrors, target: str, **args: Any) -> dict[str, Any]:
    """A list_vms the mirror answered (asserted by its served counter)."""
    before = mirrors.stats()[target].served
    result = answer(mirrors, target, **args)
    assert result is not None, f"the mirror did not answer: {mirrors.stats()[target]}"
    assert mirrors.stats()[target].served == before + 1
    return result


def rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in result["vms"]}


def start_mirrors(sim: Simulator, name: str = "vc1", **options: Any) -> Mirrors:
    target = sim_target(name, sim, **options)
    built = Mirrors([target], mirror_credentials((target, sim)), MIRROR_READS)
    answer(built, name)  # starts it
    wait_until(lambda: mirror_synced(built, name), timeout=30, what=f"{name} mirror synced")
    return built


def wait_task(task: Any) -> None:
    wait_until(lambda: task.info.state in ("success", "error"), timeout=20, what="task done")
    assert task.info.state == "success", task.info.error


def sweep(pool: SessionPool, **args: Any) -> dict[str, Any]:
    """What list_vms says swept live, with the same arguments as the mirror's answer."""
    query = listings.VmQuery(fields=tuple(args.get("fields", listings.DEFAULT_VM_FIELDS)))
    return pool.run(lambda s: listings.list_vms(s, query))


@pytest.fixture
def sim(make_simulator: MakeSimulator) -> Simulator:
    return make_simulator(clusters=1, hosts_per_cluster=2, standalone_hosts=1, vms=2, datastores=1)


@pytest.fixture
def mirrors(sim: Simulator) -> Iterator[Mirrors]:
    built = start_mirrors(sim)
    yield built
    built.close()


def make_folder(si: Any, name: str) -> Any:
    datacenter = si.content.rootFolder.childEntity[0]
    return datacenter.vmFolder.CreateFolder(name)


# ------------------------------------------------------------------------------ pure parts


def _change(name: str, val: Any) -> Any:
    return vmodl.query.PropertyCollector.Change(name=name, op="assign", val=val)


def _object(kind: str, moid: str, *changes: Any) -> Any:
    return vmodl.query.PropertyCollector.ObjectUpdate(kind=kind, obj=vim.VirtualMachine(moid),
                                                      changeSet=list(changes))


def _set(*filter_updates: list[Any]) -> Any:
    pc = vmodl.query.PropertyCollector
    return pc.UpdateSet(version="-", filterSet=[pc.FilterUpdate(filter=pc.Filter("filter-1"), objectSet=objs)
                                                for objs in filter_updates])


@pytest.mark.parametrize(("update", "kept", "recheck"), [
    # the simulator's MoveIntoFolder: enter (in a filter update of its own) then leave, one update set
    (_set([_object("enter", "vm-1", _change("name", "a"))], [_object("leave", "vm-1")]), {}, {"vm-1"}),
    (_set([_object("leave", "vm-1"), _object("enter", "vm-1", _change("name", "b"))]), {"vm-1": "b"},
     {"vm-1"}),
    (_set([_object("leave", "vm-1")]), {}, set()),
    (_set([_object("enter", "vm-2", _change("name", "c"))]), {"vm-1": "a", "vm-2": "c"}, set()),
])
def test_an_enter_and_a_leave_in_one_update_set_are_checked_live(
    update: Any, kept: dict[str, str], recheck: set[str],
) -> None:
    objects = {"vm-1": ObjectProps("VirtualMachine", "vm-1", {"name": "a"})}
    applied = _apply_update(objects, update)
    assert {moid: o.props["name"] for moid, o in objects.items()} == kept
    assert set(applied.recheck) == recheck, "an object both entering and leaving is read live first"


def _vm(moid: str, **props: Any) -> ObjectProps:
    return ObjectProps("VirtualMachine", moid, {k.replace("_", "."): v for k, v in props.items()})


@pytest.mark.parametrize(("mirror", "live", "moids", "expected"), [
    ({"vm-1": _vm("vm-1", name="a")}, {"vm-1": _vm("vm-1", name="a")}, None, []),
    ({"vm-1": _vm("vm-1", name="a")}, {"vm-1": _vm("vm-1", name="b")}, None, ["vm-1"]),
    ({"vm-1": _vm("vm-1", name="a")}, {}, None, ["vm-1"]),  # gone live, still mirrored
    ({}, {"vm-2": _vm("vm-2", name="b")}, None, ["vm-2"]),  # live, never mirrored (full check)
    ({}, {"vm-2": _vm("vm-2", name="b")}, ["vm-1"], []),  # a slice only compares its own objects
    # only the compared paths count: memory is not in the cheap set
    ({"vm-1": _vm("vm-1", name="a", config_hardware_memoryMB=32)},
     {"vm-1": _vm("vm-1", name="a", config_hardware_memoryMB=64)}, ["vm-1"], []),
    ({"vm-1": _vm("vm-1", name="a", runtime_powerState="poweredOn")},
     {"vm-1": _vm("vm-1", name="a", runtime_powerState="poweredOff")}, ["vm-1"], ["vm-1"]),
])
def test_differences_compare_what_a_round_read(
    mirror: dict[str, ObjectProps], live: dict[str, ObjectProps], moids: list[str] | None,
    expected: list[str],
) -> None:
    paths = None if moids is None else mirror_check.CHEAP
    assert mirror_check.differences(mirror, live, paths, moids) == expected


def test_rounds_are_scheduled_and_slices_rotate() -> None:
    plan = mirror_check.Schedule(full_seconds=60.0, now=0.0)
    assert plan.round_seconds == 5.0
    assert plan.due(0.0) is None and plan.due(5.0) == "rolling"
    plan.done("rolling", 5.0)
    assert plan.due(9.9) is None and plan.due(10.0) == "rolling"
    assert plan.due(60.0) == "full", "the full comparison wins when both are due"
    plan.done("full", 60.0)
    assert plan.due(64.0) is None and plan.due(65.0) == "rolling" and plan.due(120.0) == "full"
    moids = [f"vm-{i}" for i in range(30)]
    seen = [plan.slice(moids) for _ in range(12)]
    assert all(1 <= len(part) <= 30 for part in seen)
    assert set().union(*seen) == set(moids), "rolling slices cover every object within a full interval"
    assert mirror_check.Schedule(full_seconds=2.0, now=0.0).round_seconds == 0.5


def test_the_check_interval_is_validated() -> None:
    def parse(**extra: Any) -> Target:
        [target] = parse_targets([{"name": "vc1", "host": "h", "credential_env_prefix": "VC1", **extra}],
                                 "targets.yaml")
        return target

    assert parse().mirror_check_seconds == 300.0
    assert parse(mirror_check_seconds=30).mirror_check_seconds == 30.0
    for bad, problem in ((0, "must be between 1 and 86400"), (-5, "must be between 1 and 86400"),
                         (10**6, "must be between 1 and 86400"), ("often", "must be int or float"),
                         (True, "must be int or float")):
        with pytest.raises(ConfigProblems) as caught:
            parse(mirror_check_seconds=bad)
        assert any(f"'mirror_check_seconds' {problem}" in p for p in caught.value.problems), caught.value


def test_the_live_reads_of_a_check_follow_every_page(sim: Simulator, si: Any) -> None:
    sim.control("/page-limit", {"max_objects": 1})  # vCenter's policy may cut pages short: one object each
    session = types.SimpleNamespace(si=si, content=si.content)
    view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
    try:
        read = mirror_check.read_view(session, view, {vim.VirtualMachine: ["name"]})
    finally:
        view.DestroyView()
    assert sorted(o.props["name"] for o in read.values()) == sim.vm_names()
    vms = [find_vm(si, name) for name in sim.vm_names()[:3]]
    tasks = [vm.PowerOffVM_Task() for vm in vms]
    for task in tasks:
        wait_task(task)
    touched, running = mirror_check.finished_tasks(session, [task._moId for task in tasks])
    assert touched == {vm._moId: "VirtualMachine" for vm in vms} and running == set()


# ------------------------------------------------------------------------------ the next read is true


def test_a_moved_vm_stays_listed(mirrors: Mirrors, si: Any) -> None:
    folder = make_folder(si, "moved-here")
    vm = find_vm(si, "DC0_H0_VM0")
    wait_task(folder.MoveIntoFolder_Task([vm]))
    listed = rows(mirrored(mirrors, "vc1", fields=FIELDS))
    assert "DC0_H0_VM0" in listed, "a moved VM vanished from the mirror"
    assert listed["DC0_H0_VM0"]["folder"].endswith("/moved-here")
    wait_task(vm.PowerOffVM_Task())  # and later changes of the moved VM still reach the mirror
    assert rows(mirrored(mirrors, "vc1", fields=FIELDS))["DC0_H0_VM0"]["power_state"] == "poweredOff"


def test_a_reconfigured_vm_shows_its_new_memory_in_the_next_read(mirrors: Mirrors, si: Any) -> None:
    vm = find_vm(si, "DC0_H0_VM1")
    before = rows(mirrored(mirrors, "vc1", fields=FIELDS))["DC0_H0_VM1"]["memory_mb"]
    wait_task(vm.ReconfigVM_Task(vim.vm.ConfigSpec(memoryMB=before * 2)))
    assert rows(mirrored(mirrors, "vc1", fields=FIELDS))["DC0_H0_VM1"]["memory_mb"] == before * 2


def _gateway(sim: Simulator, tmp: Path, name: str) -> Gateway:
    root = tmp / name
    root.mkdir()
    env = write_targets(root / "targets.yaml", {"vc1": sim})
    home = root / "home"
    home.mkdir(mode=0o700)
    return Gateway.build(Settings.from_env(env, home=str(home), targets=str(root / "targets.yaml")))


async def _list(gateway: Gateway) -> dict[str, dict[str, Any]]:
    return rows(await gateway.calls.call(ADMIN, "list_vms", {"target": "vc1", "fields": FIELDS}))


async def _synced(gateway: Gateway) -> None:
    await asyncio.to_thread(wait_until, lambda: mirror_synced(gateway.mirrors, "vc1"), 30, 0.02, "synced")


@pytest.mark.anyio
async def test_two_gateways_on_one_simulator_both_see_a_direct_power_off(
    sim: Simulator, si: Any, tmp_path: Path,
) -> None:
    first, second = _gateway(sim, tmp_path, "first"), _gateway(sim, tmp_path, "second")
    try:
        for gateway in (first, second):  # each session keeps its own update queue, as on vCenter
            await _list(gateway)
            await _synced(gateway)
        vm = find_vm(si, "DC0_C0_RP0_VM0")
        await asyncio.to_thread(wait_task, vm.PowerOffVM_Task())
        for gateway in (first, second):
            assert (await _list(gateway))["DC0_C0_RP0_VM0"]["power_state"] == "poweredOff"
        # and a change made through one gateway shows in the other's next read
        await second.calls.call(ADMIN, "power_on_vm", {"target": "vc1", "vm": "DC0_C0_RP0_VM0"})
        for gateway in (first, second):
            assert (await _list(gateway))["DC0_C0_RP0_VM0"]["power_state"] == "poweredOn"
        for gateway in (first, second):
            stats = gateway.mirrors.stats()["vc1"]
            assert stats.served >= 2 and stats.divergences == 0, stats  # answered by healthy mirrors
    finally:
        await first.close()
        await second.close()


@pytest.mark.anyio
async def test_while_a_stream_that_stopped_delivering_is_unrepaired_reads_sweep_and_are_true(
    sim: Simulator, si: Any, tmp_path: Path,
) -> None:
    """A target whose update stream stops without an error (the launcher's /silence-updates fault): a
    comparison round finds it, reads sweep meanwhile (so they show a change the stream never
    delivered), and the mirror answers again once a resync repaired it."""
    gateway = _gateway(sim, tmp_path, "one")
    try:
        await _list(gateway)
        await _synced(gateway)
        sim.control("/silence-updates", {"silenced": True})
        vm = find_vm(si, "DC0_H0_VM0")
        await asyncio.to_thread(wait_task, vm.PowerOffVM_Task())
        await asyncio.to_thread(wait_until, lambda: gateway.mirrors.stats()["vc1"].divergences >= 1, 30,
                                0.05, "the silent stream found")
        swept = gateway.mirrors.stats()["vc1"].swept
        assert (await _list(gateway))["DC0_H0_VM0"]["power_state"] == "poweredOff"
        assert gateway.mirrors.stats()["vc1"].swept == swept + 1, "a diverged mirror does not answer"
        assert 'gateway_mirror_divergence_total{target="vc1"}' in gateway.metrics.render()
        sim.control("/silence-updates", {"silenced": False})
        await asyncio.to_thread(wait_until, lambda: gateway.mirrors.stats()["vc1"].repairs >= 1
                                and mirror_synced(gateway.mirrors, "vc1"), 30, 0.05, "repaired")
        served = gateway.mirrors.stats()["vc1"].served
        assert (await _list(gateway))["DC0_H0_VM0"]["power_state"] == "poweredOff"
        assert gateway.mirrors.stats()["vc1"].served == served + 1, "answered by the repaired mirror"
    finally:
        sim.control("/silence-updates", {"silenced": False})
        await gateway.close()


@pytest.mark.anyio
async def test_a_change_through_the_gateway_shows_in_its_own_next_read(
    sim: Simulator, tmp_path: Path,
) -> None:
    gateway = _gateway(sim, tmp_path, "one")
    try:
        await _list(gateway)
        await _synced(gateway)
        await gateway.calls.call(ADMIN, "power_off_vm", {"target": "vc1", "vm": "DC0_H0_VM0",
                                                   "guest_timeout_seconds": 0})
        served = gateway.mirrors.stats()["vc1"].served
        assert (await _list(gateway))["DC0_H0_VM0"]["power_state"] == "poweredOff"
        assert gateway.mirrors.stats()["vc1"].served == served + 1, "answered by the mirror"
    finally:
        await gateway.close()


@pytest.mark.anyio
async def test_after_the_target_ends_every_session_a_direct_rename_shows_in_the_next_read(
    sim: Simulator, tmp_path: Path,
) -> None:
    """The demo's case: two gateways (the HTTPS one and a stdio client) on one target that ends every
    session; both log in again and resync, and each must still see the next change."""
    first, second = _gateway(sim, tmp_path, "first"), _gateway(sim, tmp_path, "second")
    try:
        for gateway in (first, second):
            await _list(gateway)
            await _synced(gateway)
        sim.control("/terminate-sessions", {})
        si = await asyncio.to_thread(pyvmomi_connect, sim)
        await asyncio.to_thread(lambda: wait_task(find_vm(si, "DC0_H0_VM1").Rename_Task("renamed-1")))
        for gateway in (first, second):
            assert "renamed-1" in await _list(gateway)
        for gateway in (first, second):
            await asyncio.to_thread(wait_until, lambda g=gateway: mirror_synced(g.mirrors, "vc1", resyncs=1),
                                    40, 0.02, "resynced")
        await asyncio.to_thread(lambda: wait_task(find_vm(si, "renamed-1").Rename_Task("renamed-2")))
        for gateway in (first, second):
            assert "renamed-2" in await _list(gateway)
        await asyncio.to_thread(Disconnect, si)
    finally:
        await first.close()
        await second.close()


def test_after_a_reconnect_a_direct_change_shows_in_the_next_read(sim: Simulator, si: Any) -> None:
    relay = Relay(sim.port)
    target = dataclasses.replace(sim_target("vc1", sim), port=relay.port)
    built = Mirrors([target], mirror_credentials((target, sim)), MIRROR_READS)
    try:
        answer(built, "vc1")
        wait_until(lambda: mirror_synced(built, "vc1"), timeout=30, what="mirror synced")
        relay.sever()
        wait_until(lambda: mirror_synced(built, "vc1", resyncs=1), timeout=40, what="mirror reconnected")
        wait_task(find_vm(si, "DC0_H0_VM0").PowerOffVM_Task())
        assert rows(mirrored(built, "vc1", fields=FIELDS))["DC0_H0_VM0"]["power_state"] == "poweredOff"
    finally:
        built.close()
        relay.close()


# ------------------------------------------------------------------------------ the background check


def test_a_frozen_stream_is_found_without_any_read_logged_counted_and_repaired(
    sim: Simulator, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.vsphere.mirror")
    watched = start_mirrors(sim, mirror_check_seconds=2)
    try:
        wait_until(lambda: mirror_synced(watched, "vc1"), timeout=30, what="the mirror synced")
        sim.control("/silence-updates", {"silenced": True})  # the stream stops delivering, silently
        wait_until(lambda: watched.stats()["vc1"].divergences >= 1, timeout=20, what="divergence found")
        sim.control("/silence-updates", {"silenced": False})
        wait_until(lambda: watched.stats()["vc1"].repairs >= 1 and mirror_synced(watched, "vc1"), timeout=30,
                   what="divergence repaired")
        assert watched.stats()["vc1"].served == 0, "found by the background check, not by a read"
        warnings = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
        assert warnings and all("target vc1" in w and "objects" in w for w in warnings), warnings
        assert not any(sim.password in w for w in warnings)
        samples = {(name, labels.get("target")): value for name, _k, _h, labels, value in watched.samples()}
        assert samples[("gateway_mirror_divergence_total", "vc1")] >= 1
    finally:
        sim.control("/silence-updates", {"silenced": False})
        watched.close()


@pytest.mark.parametrize(("path", "value", "kind"), [
    ("runtime.powerState", "suspended", "rolling"),  # in the cheap set: the rolling rounds find it
    ("config.hardware.memoryMB", 1, "full"),  # not in it: the full comparison does
])
def test_a_lost_update_is_found_counted_and_repaired_and_reads_sweep_meanwhile(
    sim: Simulator, path: str, value: Any, kind: str,
) -> None:
    built = start_mirrors(sim, mirror_check_seconds=3)
    try:
        mirror = built._mirror("vc1")
        assert isinstance(mirror, Mirror)
        truth = rows(mirrored(built, "vc1", fields=FIELDS))
        sim.control("/delay", {"method_delay": {"CreateFilter": 1500}})  # a slow repair, to watch reads
        _lose_an_update(mirror, "DC0_H0_VM0", path, value)
        wait_until(lambda: built.stats()["vc1"].divergences == 1, timeout=20, what=f"{kind} check found it")
        stats = built.stats()["vc1"]
        assert stats.checks[kind] >= 1 and stats.repairs == 0
        assert answer(built, "vc1", fields=FIELDS) is None, "a diverged mirror does not answer: reads sweep"
        sim.control("/delay", {"method_delay": {}})
        wait_until(lambda: built.stats()["vc1"].repairs == 1 and mirror_synced(built, "vc1"), timeout=30,
                   what="repaired")
        assert rows(mirrored(built, "vc1", fields=FIELDS)) == truth
    finally:
        built.close()


def _lose_an_update(mirror: Mirror, name: str, path: str, value: Any) -> None:
    """A fake for a fault no real part produces on demand: the mirror's copy of one VM's property is
    changed behind the stream's back, as if vCenter had dropped that update."""
    with mirror._lock:
        found = [o for o in mirror._objects.values() if o.props.get("name") == name]
        assert len(found) == 1
        found[0].props[path] = value
        mirror._changed()


# ------------------------------------------------------------------------------ the differential test


ROUNDS = 500
"""Rounds of the differential test (a small inventory keeps each round a few SOAP calls)."""


def test_differential_random_changes_and_cut_connections_against_direct_sweeps(
    make_simulator: MakeSimulator,
) -> None:
    """Random direct changes, connections cut at random, two mirrors (the second one's filter silences
    the first's in the simulator): every answer a mirror gives equals a direct sweep made right after,
    and every divergence found was counted and repaired."""
    rng = random.Random(23)
    sim = make_simulator(clusters=1, hosts_per_cluster=1, standalone_hosts=1, vms=2, datastores=1)
    relay = Relay(sim.port)
    # a compares everything every 10 s (rolling rounds every 0.83 s); b, the competing gateway, at the
    # default; the simulator leaves some changes unreported (a host's and a datastore's VM lists, a
    # datastore's free space), so full rounds find real divergences too
    targets = {name: dataclasses.replace(sim_target(name, sim, mirror_check_seconds=check), port=relay.port)
               for name, check in (("a", 10.0), ("b", 300.0))}
    logins = mirror_credentials(*((t, sim) for t in targets.values()))
    built = Mirrors(list(targets.values()), logins, MIRROR_READS)
    si = pyvmomi_connect(sim)
    direct = SessionPool(sim_target("direct", sim), Credentials(sim.user, sim.password))
    log: list[str] = []
    compared = 0
    try:
        for name in targets:
            answer(built, name)
            wait_until(lambda name=name: mirror_synced(built, name), timeout=30, what=f"{name} synced")
        folders = [si.content.rootFolder.childEntity[0].vmFolder, make_folder(si, "elsewhere")]
        view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
        vms = list(view.view)
        view.DestroyView()
        started = time.monotonic()
        for round_ in range(ROUNDS):
            log.append(_random_change(rng, si, folders, vms, round_))
            if rng.random() < 0.01:
                relay.sever()
                log.append("cut")
            name = "a" if rng.random() < 0.97 else "b"
            got = answer(built, name, fields=FIELDS)
            if got is None:  # swept (as the gateway would); let the mirror recover before the next round
                with contextlib.suppress(TimeoutError):
                    wait_until(lambda name=name: mirror_synced(built, name), timeout=3, what="mirror back")
                continue
            truth = sweep(direct, fields=FIELDS)
            assert got == truth, f"round {round_} ({name}) after {log[-6:]}: {_diff(got, truth)}"
            compared += 1
        elapsed = time.monotonic() - started
        stats = built.stats()
        print(f"{ROUNDS} rounds in {elapsed:.1f}s, {compared} mirror answers compared, {relay.cuts} cuts; "
              f"a: {stats['a']}; b: {stats['b']}")
        for name in targets:  # at most one divergence at a time is waiting for its repair
            assert stats[name].repairs <= stats[name].divergences <= stats[name].repairs + 1, stats[name]
        assert compared >= ROUNDS // 2, f"only {compared} of {ROUNDS} reads came from a mirror"
        assert relay.cuts >= 5
        # with the competing mirror gone, every divergence found has been repaired
        b = built._mirror("b")
        assert b is not None
        b.close()
        wait_until(lambda: mirror_synced(built, "a") and built.stats()["a"].divergences == built.stats()[
            "a"].repairs, timeout=40, what="a mirror_synced, its divergences all repaired")
        assert answer(built, "a", fields=FIELDS) == sweep(direct, fields=FIELDS)
    finally:
        built.close()
        direct.close()
        Disconnect(si)
        relay.close()


def _diff(mirror: dict[str, Any], swept: dict[str, Any]) -> dict[str, Any]:
    held = {row["moid"]: row for row in mirror["vms"]}
    live = {row["moid"]: row for row in swept["vms"]}
    return {m: (held.get(m), live.get(m)) for m in sorted(set(held) | set(live))
            if held.get(m) != live.get(m)}


def _random_change(rng: random.Random, si: Any, folders: list[Any], vms: list[Any], round_: int) -> str:
    """One random direct change of one of ``vms`` (kept up to date: clones added, destroyed removed)."""
    vm = rng.choice(vms)
    kinds = ["power", "rename", "move", "reconfigure"]
    kinds += ["destroy"] if len(vms) > 2 else []
    kinds += ["clone"] if len(vms) < 8 else []
    kind = rng.choice(kinds)
    props = {p.name: p.val for p in _props(si, vm, "runtime.powerState", "parent")}
    if kind == "power":
        on = props["runtime.powerState"] == "poweredOn"
        task = vm.PowerOffVM_Task() if on else vm.PowerOnVM_Task()
    elif kind == "rename":
        task = vm.Rename_Task(f"vm-r{round_}")
    elif kind == "move":
        current = props["parent"]._moId
        task = next(f for f in folders if f._moId != current).MoveIntoFolder_Task([vm])
    elif kind == "reconfigure":
        task = vm.ReconfigVM_Task(vim.vm.ConfigSpec(memoryMB=rng.choice([32, 64, 128, 256])))
    elif kind == "destroy" and props["runtime.powerState"] == "poweredOn":
        # powered off first, in a round of its own: govmomi's simulator crashes the handler of a
        # WaitForUpdatesEx when a VM it holds an update of is destroyed before its next tick
        task = vm.PowerOffVM_Task()
    elif kind == "destroy":
        task = vm.Destroy_Task()
        vms.remove(vm)
    else:
        spec = vim.vm.CloneSpec(location=vim.vm.RelocateSpec(), powerOn=False, template=False)
        task = vm.CloneVM_Task(folder=props["parent"], name=f"vm-c{round_}", spec=spec)
    wait_task(task)
    if kind == "clone":
        vms.append(task.info.result)
    return f"{kind} {vm._moId}"


def _props(si: Any, obj: Any, *paths: str) -> list[Any]:
    pc: Any = vmodl.query.PropertyCollector
    spec = pc.FilterSpec(objectSet=[pc.ObjectSpec(obj=obj, skip=False)],
                         propSet=[pc.PropertySpec(type=type(obj), pathSet=list(paths))])
    result = si.content.propertyCollector.RetrievePropertiesEx([spec], pc.RetrieveOptions())
    return list(result.objects[0].propSet)


