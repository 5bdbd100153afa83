"""The live inventory mirror (gateway.vsphere.mirror) against the simulator, and its update arithmetic.

Changes are made directly with pyVmomi (not through the gateway) and must show in the very next read
answered by the mirror; ``stats().served`` proves the mirror answered rather than a sweep.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pyVmomi import vim, vmodl
from support.answers import answer_of
from support.httpserver import audit_rows, mcp_client, serve
from support.simulator import (
    MakeSimulator,
    Relay,
    Simulator,
    find_vm,
    mirror_credentials,
    mirror_synced,
    open_pool,
    pyvmomi_connect,
    sim_target,
    wait_until,
    write_targets,
)

from gateway import errors
from gateway.answer import Answer
from gateway.auth.tokens import Principal
from gateway.config import ConfigProblems, Credentials, parse_targets
from gateway.server.edge.mcp import SPLICE_MIN_CHARS
from gateway.server.runtime import Gateway
from gateway.settings import Settings
from gateway.tools.read import MIRROR_READS, READ_TOOLS
from gateway.vsphere import details, listings, resolve
from gateway.vsphere.mirror import MIRRORED, Mirrors, _apply_update
from gateway.vsphere.pool import SessionPool
from gateway.vsphere.soap_scan import ObjectProps

ALL_VM_FIELDS = list(listings.VM_COLUMNS)



def answer(mirrors: Mirrors, target: str, tool: str, **args: Any) -> dict[str, Any] | None:
    got = asyncio.run(mirrors.answer(target, tool, {"target": target, **args}))
    if got is not None:
        assert json.loads(got.text) == got.value, "the text sent is the value the gateway holds"
    return None if got is None else got.value


def mirrored(mirrors: Mirrors, target: str, tool: str, **args: Any) -> dict[str, Any]:
    """An answer the mirror gave (asserted by its served counter)."""
    before = mirrors.stats()[target].served
    result = answer(mirrors, target, tool, **args)
    assert result is not None, f"the mirror did not answer: {mirrors.stats()[target]}"
    assert mirrors.stats()[target].served == before + 1
    return result


@pytest.fixture
def sim(make_simulator: MakeSimulator) -> Simulator:
    return make_simulator(clusters=1, hosts_per_cluster=2, standalone_hosts=1, vms=2, datastores=2)


@pytest.fixture
def mirrors(sim: Simulator) -> Iterator[Mirrors]:
    target = sim_target("vc1", sim)
    built = Mirrors([target], mirror_credentials((target, sim)), MIRROR_READS)
    assert answer(built, "vc1", "list_vms") is None, "a cold mirror must not answer"
    wait_until(lambda: mirror_synced(built, "vc1"), timeout=30, what="mirror synced")
    yield built
    built.close()


def names(result: dict[str, Any]) -> list[str]:
    return [row["name"] for row in result["vms"]]


# ------------------------------------------------------------------------------ pure update arithmetic


def _change(name: str, val: Any, op: str = "assign") -> Any:
    return vmodl.query.PropertyCollector.Change(name=name, op=op, val=val)


def _update(kind: str, moid: str, *changes: Any) -> Any:
    pc = vmodl.query.PropertyCollector
    return pc.UpdateSet(version="2", filterSet=[pc.FilterUpdate(
        filter=pc.Filter("filter-1"),
        objectSet=[pc.ObjectUpdate(kind=kind, obj=vim.VirtualMachine(moid), changeSet=list(changes))])])


@pytest.mark.parametrize(("updates", "expected"), [
    ([_update("enter", "vm-1", _change("name", "a"), _change("runtime.host", vim.HostSystem("host-1")))],
     {"vm-1": {"name": "a", "runtime.host": "host-1"}}),
    ([_update("enter", "vm-1", _change("name", "a")), _update("modify", "vm-1", _change("name", "b"))],
     {"vm-1": {"name": "b"}}),
    ([_update("enter", "vm-1", _change("name", "a"), _change("guest.ipAddress", "10.0.0.1")),
      _update("modify", "vm-1", _change("guest.ipAddress", None, op="remove"))],
     {"vm-1": {"name": "a"}}),
    ([_update("enter", "vm-1", _change("name", "a")), _update("leave", "vm-1")], {}),
    ([_update("modify", "vm-9", _change("name", "late"))], {"vm-9": {"name": "late"}}),
])
def test_updates_apply_enter_modify_remove_and_leave(updates: list[Any], expected: dict[str, Any]) -> None:
    objects: dict[str, ObjectProps] = {}
    for update in updates:
        _apply_update(objects, update)
    assert {moid: o.props for moid, o in objects.items()} == expected
    assert all(o.type == "VirtualMachine" for o in objects.values())


def test_the_mirror_keeps_only_what_the_list_tools_read() -> None:
    vm_paths = set(MIRRORED[vim.VirtualMachine])
    assert vm_paths == {"name"} | {p for c in listings.VM_COLUMNS.values() for p in c.paths} | {
        p for f in listings.VM_FILTERS.values() for p in f.paths}
    assert "config.hardware.device" not in vm_paths
    assert set(MIRROR_READS) <= {spec.name for spec in READ_TOOLS}


# ------------------------------------------------------------------------------ against the simulator


def test_mirror_answers_equal_sweeps(sim: Simulator, mirrors: Mirrors) -> None:
    pool = SessionPool(sim_target("vc1", sim), Credentials(sim.user, sim.password))
    try:
        swept_vms = pool.run(lambda s: listings.list_vms(s, listings.VmQuery(fields=tuple(ALL_VM_FIELDS))))
        swept_hosts = pool.run(lambda s: listings.list_hosts(s))
        swept_cluster_hosts = pool.run(lambda s: listings.list_hosts(s, "DC0_C0"))
        swept_datastores = pool.run(lambda s: listings.list_datastores(s))
        swept_clusters = pool.run(lambda s: listings.list_clusters(s))
    finally:
        pool.close()
    assert mirrored(mirrors, "vc1", "list_vms", fields=ALL_VM_FIELDS) == swept_vms
    assert mirrored(mirrors, "vc1", "list_hosts") == swept_hosts
    assert mirrored(mirrors, "vc1", "list_hosts", cluster="DC0_C0") == swept_cluster_hosts
    assert mirrored(mirrors, "vc1", "list_datastores") == swept_datastores
    assert mirrored(mirrors, "vc1", "list_clusters") == swept_clusters
    assert swept_clusters["count"] == 1 and swept_clusters["clusters"][0]["datacenter"] == "DC0"
    assert swept_vms["count"] == 4 and swept_hosts["count"] == 3


def _wait_task(task: Any) -> None:
    wait_until(lambda: task.info.state in ("success", "error"), timeout=20, what="task done")
    assert task.info.state == "success", task.info.error


def test_power_and_rename_show_in_the_next_read(mirrors: Mirrors, si: Any) -> None:
    vm = find_vm(si, "DC0_H0_VM0")
    _wait_task(vm.PowerOffVM_Task())
    rows = {r["name"]: r for r in mirrored(mirrors, "vc1", "list_vms")["vms"]}
    assert rows["DC0_H0_VM0"]["power_state"] == "poweredOff"
    _wait_task(vm.Rename_Task("renamed-vm"))
    after = mirrored(mirrors, "vc1", "list_vms")
    assert "renamed-vm" in names(after) and "DC0_H0_VM0" not in names(after)
    assert mirrored(mirrors, "vc1", "list_vms", power_state="poweredOff")["vms"][0]["name"] == "renamed-vm"


def test_reads_close_together_poll_without_interrupting_a_long_wait(mirrors: Mirrors, si: Any) -> None:
    """After a read's poll the mirror waits for the next read (``LINGER_SECONDS``) rather than in a long
    wait, so a read soon after is one zero-wait poll, no cancel; and what vSphere changed meanwhile
    still shows in that read."""
    mirrored(mirrors, "vc1", "list_vms")  # may interrupt a long wait: the mirror was idle
    before = mirrors.stats()["vc1"].interrupts
    for _ in range(10):
        mirrored(mirrors, "vc1", "list_vms")
    # at most one: a comparison round that happened to outlast the linger
    assert mirrors.stats()["vc1"].interrupts - before <= 1
    _wait_task(find_vm(si, "DC0_H0_VM0").PowerOffVM_Task())
    rows = {r["name"]: r for r in mirrored(mirrors, "vc1", "list_vms")["vms"]}
    assert rows["DC0_H0_VM0"]["power_state"] == "poweredOff"


def test_a_listing_is_shaped_once_per_change_of_the_inventory(sim: Simulator, si: Any) -> None:
    shaped: list[dict[str, Any]] = []

    def counting(view: Any, args: Any) -> dict[str, Any]:
        shaped.append(dict(args))
        return MIRROR_READS["list_vms"](view, args)

    target = sim_target("vc1", sim)
    built = Mirrors([target], mirror_credentials((target, sim)), {"list_vms": counting})
    try:
        assert answer(built, "vc1", "list_vms") is None
        wait_until(lambda: mirror_synced(built, "vc1"), timeout=30, what="mirror synced")
        first = mirrored(built, "vc1", "list_vms")
        first["added_by_a_caller"] = True  # a caller's copy: the kept answer does not change
        second = mirrored(built, "vc1", "list_vms")
        assert len(shaped) == 1, "an unchanged inventory is not shaped again"
        assert "added_by_a_caller" not in second and names(second) == names(first)
        texts = [asyncio.run(built.answer("vc1", "list_vms", {"target": "vc1"})) for _ in range(2)]
        assert texts[0] is not None and texts[1] is not None
        assert texts[0].text is texts[1].text, "an unchanged inventory's answer is encoded once"
        assert texts[0].value is not texts[1].value, "each caller gets its own copy of the value"
        mirrored(built, "vc1", "list_vms", power_state="poweredOff")
        assert len(shaped) == 2, "other arguments are another answer"
        _wait_task(find_vm(si, "DC0_H0_VM0").PowerOffVM_Task())
        rows = {r["name"]: r for r in mirrored(built, "vc1", "list_vms")["vms"]}
        assert len(shaped) == 3, "a change in vSphere makes the next read shape the listing again"
        assert rows["DC0_H0_VM0"]["power_state"] == "poweredOff"
    finally:
        built.close()


def test_new_and_destroyed_vms_show_in_the_next_read(mirrors: Mirrors, si: Any) -> None:
    source = find_vm(si, "DC0_H0_VM1")
    spec = vim.vm.CloneSpec(location=vim.vm.RelocateSpec(), powerOn=False, template=False)
    _wait_task(source.CloneVM_Task(folder=source.parent, name="clone-1", spec=spec))
    assert "clone-1" in names(mirrored(mirrors, "vc1", "list_vms"))
    clone = find_vm(si, "clone-1")
    if clone.runtime.powerState == "poweredOn":
        _wait_task(clone.PowerOffVM_Task())
    _wait_task(clone.Destroy_Task())
    assert "clone-1" not in names(mirrored(mirrors, "vc1", "list_vms"))


def test_host_maintenance_shows_in_the_next_read(mirrors: Mirrors, si: Any) -> None:
    view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.HostSystem], True)
    host = next(h for h in view.view if h.name == "DC0_C0_H0")
    view.DestroyView()
    _wait_task(host.EnterMaintenanceMode_Task(timeout=0))
    rows = {r["name"]: r for r in mirrored(mirrors, "vc1", "list_hosts")["hosts"]}
    assert rows["DC0_C0_H0"]["maintenance_mode"] is True
    assert rows["DC0_C0_H1"]["maintenance_mode"] is False


def test_terminated_sessions_resync(sim: Simulator, mirrors: Mirrors, si: Any) -> None:
    sim.control("/terminate-sessions", {})
    # Until the mirror notices, reads sweep; once it has logged in again it resyncs from scratch.
    wait_until(lambda: mirror_synced(mirrors, "vc1", resyncs=1), timeout=40, what="mirror resynced")
    vm = find_vm(pyvmomi_connect(sim), "DC0_C0_RP0_VM0")
    _wait_task(vm.PowerOffVM_Task())
    rows = {r["name"]: r for r in mirrored(mirrors, "vc1", "list_vms")["vms"]}
    assert rows["DC0_C0_RP0_VM0"]["power_state"] == "poweredOff"


def test_staleness_allowed_answers_say_how_old(sim: Simulator) -> None:
    target = sim_target("vc1", sim, max_staleness_seconds=3600.0)
    built = Mirrors([target], mirror_credentials((target, sim)), MIRROR_READS)
    try:
        assert answer(built, "vc1", "list_vms") is None
        wait_until(lambda: mirror_synced(built, "vc1"), timeout=30, what="mirror synced")
        result = mirrored(built, "vc1", "list_vms")
        assert 0 <= result["mirror_age_seconds"] < 3600
    finally:
        built.close()


def test_an_opted_out_target_always_sweeps(sim: Simulator) -> None:
    target = sim_target("vc1", sim, mirror="off")
    built = Mirrors([target], mirror_credentials((target, sim)), MIRROR_READS)
    try:
        assert answer(built, "vc1", "list_vms") is None
        assert built.stats() == {}
    finally:
        built.close()


def test_a_slowed_target_does_not_delay_another(make_simulator: MakeSimulator) -> None:
    slow_sim, fast_sim = make_simulator(vms=1), make_simulator(vms=1)
    slow, fast = sim_target("slow", slow_sim), sim_target("fast", fast_sim)
    built = Mirrors([slow, fast], mirror_credentials((slow, slow_sim), (fast, fast_sim)), MIRROR_READS)
    try:
        for name in ("slow", "fast"):
            answer(built, name, "list_vms")
        wait_until(lambda: mirror_synced(built, "slow") and mirror_synced(built, "fast"), timeout=30,
                   what="both synced")
        slow_sim.control("/delay", {"method_delay": {"WaitForUpdatesEx": 60_000}})

        async def both() -> tuple[bool, Answer | None]:
            slow_read = asyncio.ensure_future(built.answer("slow", "list_vms", {"target": "slow"}))
            fast_result = await built.answer("fast", "list_vms", {"target": "fast"})
            slow_pending = not slow_read.done()
            slow_sim.control("/delay", {"method_delay": {}})
            await slow_read
            return slow_pending, fast_result

        slow_pending, fast_result = asyncio.run(both())
        assert fast_result is not None and fast_result.value["count"] >= 1
        assert slow_pending, "the fast target's answer came only after the slow target's"
    finally:
        built.close()


# ------------------------------------------------------------------------------ through the gateway


def _gateway(sim: Simulator, tmp: Path) -> Gateway:
    env = write_targets(tmp / "targets.yaml", {"vc1": sim})
    home = tmp / "home"
    home.mkdir(mode=0o700)
    return Gateway.build(Settings.from_env(env, home=str(home), targets=str(tmp / "targets.yaml")))


@pytest.mark.anyio
async def test_a_change_made_in_vsphere_shows_in_the_next_list_vms_over_https(
    sim: Simulator, si: Any, tmp_path: Path,
) -> None:
    served = serve(tmp_path, _gateway(sim, tmp_path))
    gateway = served.gateway
    try:
        async with mcp_client(served, served.tokens["alice"], "legacy") as client:
            first = await client.call_tool("list_vms", {"target": "vc1"})  # swept; starts the mirror
            assert not first.is_error
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: mirror_synced(gateway.mirrors, "vc1"), timeout=30, what="synced"))
            vm = find_vm(si, "DC0_H0_VM1")
            await anyio.to_thread.run_sync(lambda: _wait_task(vm.Rename_Task("renamed-over-https")))
            result = await client.call_tool("list_vms", {"target": "vc1", "fields": ["name"]})
        assert not result.is_error, result.content
        listed = [row["name"] for row in answer_of(result)["vms"]]
        assert "renamed-over-https" in listed and "DC0_H0_VM1" not in listed
        stats = gateway.mirrors.stats()["vc1"]
        assert (stats.served, stats.swept) == (1, 1)
        async with served.http(served.tokens["alice"]) as http:
            text = (await http.get("/metrics")).text
        assert 'gateway_mirror_reads_total{source="mirror",target="vc1"} 1.0' in text
        assert 'gateway_mirror_reads_total{source="sweep",target="vc1"} 1.0' in text
        assert 'gateway_mirror_synced{target="vc1"} 1.0' in text
        assert 'gateway_mirror_resyncs_total{target="vc1"} 0.0' in text
        assert "# TYPE gateway_soap_decoder_fallbacks_total counter" in text
    finally:
        served.stop()


# ------------------------------------------------------------------------------ names resolved by the mirror


@pytest.mark.anyio
async def test_answers_made_of_a_kept_answer_are_the_bytes_the_audit_fingerprints_over_https(
    make_simulator: MakeSimulator, tmp_path: Path,
) -> None:
    """With ``max_staleness_seconds`` each answer is the kept one plus its own ``mirror_age_seconds``: its
    fingerprint and its JSON string are derived from the kept one's (hashed and encoded once). Over HTTPS
    on 2026-07-28, large enough to be spliced into the body, each text received is the one the audit
    row fingerprints, and the same listing but for its age."""
    sim = make_simulator(clusters=1, hosts_per_cluster=2, standalone_hosts=1, vms=40)
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim}, {"vc1": {"max_staleness_seconds": 3600}})
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    served = serve(tmp_path, Gateway.build(Settings.from_env(env, home=str(home),
                                                             targets=str(tmp_path / "targets.yaml"))))
    gateway = served.gateway
    listing = {"target": "vc1", "fields": ALL_VM_FIELDS}
    try:
        async with mcp_client(served, served.tokens["alice"], "auto") as client:
            assert not (await client.call_tool("list_vms", listing)).is_error  # swept; starts the mirror
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: mirror_synced(gateway.mirrors, "vc1"), timeout=30, what="synced"))
            results = [await client.call_tool("list_vms", listing) for _ in range(3)]
    finally:
        served.stop()
        await gateway.close()
    received = [r.content[0].text.encode() for r in results]  # type: ignore[union-attr]
    assert len(received[0]) >= SPLICE_MIN_CHARS, "large enough to be spliced into the body"
    rows = [r for r in audit_rows(gateway) if r.get("tool") == "list_vms" and r.get("phase") == "call"]
    assert [(r["result_digest"], r["result_size"]) for r in rows[-3:]] == [
        (hashlib.sha256(data).hexdigest(), len(data)) for data in received]
    answers = [json.loads(data) for data in received]
    assert all(a.pop("mirror_age_seconds") >= 0 for a in answers)
    assert answers[0] == answers[1] == answers[2] and answers[0]["count"] == len(answers[0]["vms"])


def test_a_name_hint_is_checked_live_and_a_wrong_one_falls_back_to_the_search(
    sim: Simulator, si: Any,
) -> None:
    """get_vm_details trusts a lookup hint only when the VM read live still is ``ref``."""
    renamed = find_vm(si, "DC0_H0_VM0")
    other = find_vm(si, "DC0_H0_VM1")._moId
    _wait_task(renamed.Rename_Task("renamed-behind-the-hint"))
    pool = open_pool("vc1", sim)
    searched: list[str] = []
    real_find = resolve._find

    def counting_find(session: Any, kind: Any, ref: str) -> str:
        searched.append(ref)
        return real_find(session, kind, ref)

    def hinted(moid: str) -> details.Lookup:
        return lambda vim_type, ref: moid

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(details, "_find", counting_find)
            right = pool.run(lambda s: details.get_vm_details(s, "DC0_H0_VM1", hinted(other)))
            assert (right["moid"], right["name"]) == (other, "DC0_H0_VM1")
            assert searched == [], "a right hint: no search"
            by_moid = pool.run(lambda s: details.get_vm_details(s, other, hinted(other)))
            assert by_moid["name"] == "DC0_H0_VM1" and searched == []
            # a stale hint: the VM it names was renamed since; the search says what a sweep would
            with pytest.raises(errors.NotFound):
                pool.run(lambda s: details.get_vm_details(s, "DC0_H0_VM0", hinted(renamed._moId)))
            assert searched == ["DC0_H0_VM0"]
            # a hint naming another VM, or one that no longer exists: searched, right answer
            wrong = pool.run(lambda s: details.get_vm_details(s, "renamed-behind-the-hint", hinted(other)))
            gone = pool.run(lambda s: details.get_vm_details(s, "DC0_H0_VM1", hinted("vm-999999")))
            assert (wrong["moid"], gone["moid"]) == (renamed._moId, other)
            assert searched == ["DC0_H0_VM0", "renamed-behind-the-hint", "DC0_H0_VM1"]
    finally:
        pool.close()


@pytest.mark.anyio
async def test_get_vm_details_takes_the_vm_from_the_mirror_without_a_name_search(
    sim: Simulator, si: Any, tmp_path: Path,
) -> None:
    gateway = _gateway(sim, tmp_path)
    caller = Principal("alice", "admin", surface="test")
    searched: list[str] = []
    real_find = resolve._find

    def counting_find(session: Any, kind: Any, ref: str) -> str:
        searched.append(ref)
        return real_find(session, kind, ref)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(details, "_find", counting_find)
            cold = await gateway.calls.call(caller, "get_vm_details", {"target": "vc1", "vm": "DC0_H0_VM0"})
            assert searched == ["DC0_H0_VM0"], "no mirror yet: the name is searched"
            await gateway.calls.call(caller, "list_vms", {"target": "vc1"})  # starts the mirror
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: mirror_synced(gateway.mirrors, "vc1"), timeout=30, what="synced"))
            warm = await gateway.calls.call(caller, "get_vm_details", {"target": "vc1", "vm": "DC0_H0_VM0"})
            assert searched == ["DC0_H0_VM0"], "a synced mirror names the VM: no search"
            assert warm == cold
            assert gateway.mirrors.stats()["vc1"].lookups == 1
            assert 'gateway_mirror_lookups_total{target="vc1"} 1.0' in gateway.metrics.render()
            vm = find_vm(si, "DC0_H0_VM0")
            await anyio.to_thread.run_sync(lambda: _wait_task(vm.Rename_Task("renamed-live")))
            with pytest.raises(errors.NotFound):  # whether or not the mirror has heard of the rename yet
                await gateway.calls.call(caller, "get_vm_details", {"target": "vc1", "vm": "DC0_H0_VM0"})
            renamed = await gateway.calls.call(caller, "get_vm_details",
                                               {"target": "vc1", "vm": "renamed-live"})
            assert renamed["moid"] == vm._moId and renamed["power_state"] == cold["power_state"]
    finally:
        await gateway.close()


# ------------------------------------------------------------------------------ a vCenter restart


def test_a_restarted_vcenter_is_resynced(make_simulator: MakeSimulator) -> None:
    first = make_simulator(vms=1, user=None)
    relay = Relay(first.port)
    target = dataclasses.replace(sim_target("vc1", first), port=relay.port)
    env = {f"{target.credential_env_prefix}_USER": "u", f"{target.credential_env_prefix}_PASSWORD": "p"}
    built = Mirrors([target], env, MIRROR_READS)
    try:
        answer(built, "vc1", "list_vms")
        wait_until(lambda: mirror_synced(built, "vc1"), timeout=30, what="mirror synced")
        assert mirrored(built, "vc1", "list_vms")["count"] == 1
        second = make_simulator(vms=3, user=None)  # the "restarted" vCenter has other VMs
        first.stop()
        relay.switch(second.port)
        wait_until(lambda: mirror_synced(built, "vc1", resyncs=1), timeout=40, what="mirror resynced")
        assert mirrored(built, "vc1", "list_vms")["count"] == 3
    finally:
        built.close()
        relay.close()


def test_a_fan_out_takes_each_target_wholly_from_one_source(make_simulator: MakeSimulator) -> None:
    sim_a, sim_b = make_simulator(vms=1), make_simulator(vms=2)
    a, b = sim_target("a", sim_a), sim_target("b", sim_b, mirror="off")
    built = Mirrors([a, b], mirror_credentials((a, sim_a), (b, sim_b)), MIRROR_READS)
    pool_b = SessionPool(b, Credentials(sim_b.user, sim_b.password))
    swept: list[list[str]] = []

    async def no_sweep(rest: list[str]) -> dict[str, dict[str, Any]]:
        raise AssertionError(f"swept {rest}: the mirror's answer (an error) is the whole answer")

    try:
        answer(built, "a", "list_vms")
        wait_until(lambda: mirror_synced(built, "a"), timeout=30, what="mirror synced")
        vms = asyncio.run(built.fan_out(["a", "b"], "list_vms", {"target": "all"},
                                        lambda rest: _sweep_vms(pool_b, rest, swept)))
        assert list(vms) == ["a", "b"]
        assert vms["a"]["ok"].value["count"] == 1 and vms["b"]["ok"]["count"] == 2
        assert swept == [["b"]] and built.stats()["a"].served == 1
        kept = asyncio.run(built.answer("a", "list_vms", {"target": "all"}))
        assert kept is not None and isinstance(vms["a"]["ok"], Answer)
        assert vms["a"]["ok"].text is kept.text, "the mirror's text, not re-encoded"
        hosts = asyncio.run(built.fan_out(["a"], "list_hosts", {"target": "all", "cluster": "nope"},
                                          no_sweep))
        assert hosts["a"]["error"]["code"] == "not_found"
    finally:
        built.close()
        pool_b.close()


async def _sweep_vms(pool: SessionPool, rest: list[str], swept: list[list[str]]) -> dict[str, dict[str, Any]]:
    swept.append(rest)
    rows = await asyncio.to_thread(pool.run, lambda s: listings.list_vms(s, listings.VmQuery()))
    return {name: {"ok": rows} for name in rest}


@pytest.mark.parametrize(("extra", "problem"), [
    ({"mirror": "sometimes"}, "'mirror' must be one of off, lazy, eager"),
    ({"mirror": True}, "'mirror' must be str"),
    ({"max_staleness_seconds": -1}, "'max_staleness_seconds' must be zero or positive"),
    ({"max_staleness_seconds": "soon"}, "'max_staleness_seconds' must be int or float"),
])
def test_mirror_settings_are_validated(extra: dict[str, Any], problem: str) -> None:
    entry = {"name": "vc1", "host": "vc.example.com", "credential_env_prefix": "VC1", **extra}
    with pytest.raises(ConfigProblems) as caught:
        parse_targets([entry], "targets.yaml")
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_mirror_settings_parse() -> None:
    [target] = parse_targets([{"name": "vc1", "host": "h", "credential_env_prefix": "VC1", "mirror": "eager",
                               "max_staleness_seconds": 30}], "targets.yaml")
    assert (target.mirror, target.max_staleness_seconds) == ("eager", 30.0)
    [default] = parse_targets([{"name": "vc1", "host": "h", "credential_env_prefix": "VC1"}], "targets.yaml")
    assert (default.mirror, default.max_staleness_seconds) == ("lazy", None)


def test_an_eager_mirror_syncs_before_any_read(sim: Simulator) -> None:
    target = sim_target("vc1", sim, mirror="eager")
    built = Mirrors([target], mirror_credentials((target, sim)), MIRROR_READS)
    try:
        assert built.stats() == {}
        built.start_eager()
        wait_until(lambda: mirror_synced(built, "vc1"), timeout=30, what="eager mirror synced")
        assert built.stats()["vc1"].served == built.stats()["vc1"].swept == 0
        assert mirrored(built, "vc1", "list_vms")["count"] == 4  # the first read is already mirrored
    finally:
        built.close()



# ------------------------------------------------------------------------------ memory of a sync


class _Enum(str):
    """Stands in for a pyVmomi enum value (a str subclass)."""


@pytest.mark.parametrize(("parts", "enum"), [(["vm-", "1234"], False), (["powered", "On"], False),
                                           (["powered", "Off"], True), (["x"] * 300, False)])
def test_a_kept_string_is_a_plain_shared_copy_never_the_decoders_object(parts: list[str], enum: bool) -> None:
    from gateway.vsphere.mirror_check import kept

    value = "".join(parts)  # made at run time, as a decoder makes it (a literal is interned already)
    value = _Enum(value) if enum else value
    copy = kept(value)
    assert copy == value and type(copy) is str
    assert copy is not value, "the decoder's own object would pin its reply's memory"
    assert kept("".join(parts)) is copy, "one object per distinct value"


def test_a_synced_mirror_leaves_no_decoded_update_alive(sim: Simulator) -> None:
    import gc

    target = sim_target("vc1", sim)
    ours = {id(o) for o in gc.get_objects() if isinstance(o, vmodl.query.PropertyCollector.ObjectUpdate)}
    gc.disable()  # only the mirror's own collection may free the sync's reply cycles
    try:
        built = Mirrors([target], mirror_credentials((target, sim)), MIRROR_READS)
        try:
            answer(built, "vc1", "list_vms")
            wait_until(lambda: mirror_synced(built, "vc1"), timeout=30, what="mirror synced")
            left = [o for o in gc.get_objects()
                    if isinstance(o, vmodl.query.PropertyCollector.ObjectUpdate) and id(o) not in ours]
        finally:
            built.close()
    finally:
        gc.enable()
    assert left == [], f"{len(left)} decoded object updates of the first sync still alive"


# ------------------------------------------------------------------------------ a sync in parts


def _parts_waiting(sim: Simulator) -> bool:
    return int(sim.control("/inflight")["pending_update_parts"]) > 0


def test_a_mirror_over_more_vms_than_one_part_answers_only_after_its_last_part(
        sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.vsphere import mirror

    monkeypatch.setattr(mirror, "MAX_OBJECT_UPDATES", 1)  # every object update its own part
    target = sim_target("vc1", sim)
    built = Mirrors([target], mirror_credentials((target, sim)), MIRROR_READS)
    try:
        sim.control("/delay", {"method_delay": {"WaitForUpdatesEx": 200}})
        assert answer(built, "vc1", "list_vms") is None  # starts the mirror
        wait_until(lambda: _parts_waiting(sim), timeout=30, what="the first sync in parts")
        assert answer(built, "vc1", "list_vms") is None, "answered between the first sync's parts"
        assert built.lookup("vc1") is None and built.stats()["vc1"].state != "synced"
        sim.control("/delay", {"method_delay": {}})
        # one WaitForUpdatesEx round per object update: a loaded machine needs more than the usual 30 s
        wait_until(lambda: mirror_synced(built, "vc1"), timeout=120,
                   what="mirror synced")
        pool = open_pool("vc1", sim)
        try:
            swept = pool.run(lambda s: listings.list_vms(s, listings.VmQuery(fields=tuple(ALL_VM_FIELDS))))
        finally:
            pool.close()
        assert mirrored(built, "vc1", "list_vms", fields=ALL_VM_FIELDS) == swept
        assert swept["count"] == 4
    finally:
        built.close()


def test_a_mirror_synced_in_parts_keeps_following_changes(
        sim: Simulator, si: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.vsphere import mirror

    monkeypatch.setattr(mirror, "MAX_OBJECT_UPDATES", 1)
    target = sim_target("vc1", sim)
    built = Mirrors([target], mirror_credentials((target, sim)), MIRROR_READS)
    try:
        answer(built, "vc1", "list_vms")
        wait_until(lambda: mirror_synced(built, "vc1"), timeout=30, what="mirror synced")
        vms = [find_vm(si, n) for n in ("DC0_H0_VM0", "DC0_H0_VM1", "DC0_C0_RP0_VM0")]
        folder = vms[0].parent.CreateFolder("moved-in-one-call")
        _wait_task(folder.MoveIntoFolder_Task(vms))  # one batch of several object updates
        rows = {r["name"]: r for r in mirrored(built, "vc1", "list_vms", fields=["name", "folder"])["vms"]}
        assert [rows[vm.name]["folder"].rsplit("/", 1)[-1] for vm in vms] == ["moved-in-one-call"] * 3
        _wait_task(vms[0].Rename_Task("renamed-after-parts"))
        assert "renamed-after-parts" in names(mirrored(built, "vc1", "list_vms"))
    finally:
        built.close()


def test_a_read_between_the_parts_of_a_batch_waits_for_its_last_part(
        sim: Simulator, si: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.vsphere import mirror

    monkeypatch.setattr(mirror, "MAX_OBJECT_UPDATES", 1)
    target = sim_target("vc1", sim, max_staleness_seconds=3600.0)  # reads answer without a poll
    built = Mirrors([target], mirror_credentials((target, sim)), MIRROR_READS)
    try:
        answer(built, "vc1", "list_vms")
        wait_until(lambda: mirror_synced(built, "vc1"), timeout=30, what="mirror synced")
        vms = [find_vm(si, n) for n in ("DC0_H0_VM0", "DC0_H0_VM1", "DC0_C0_RP0_VM0")]
        folder = vms[0].parent.CreateFolder("moved-between-parts")
        sim.control("/delay", {"method_delay": {"WaitForUpdatesEx": 1000}})  # each further part waits
        _wait_task(folder.MoveIntoFolder_Task(vms))
        wait_until(lambda: _parts_waiting(sim), timeout=30, what="the batch's first part applied")
        rows = {r["name"]: r for r in mirrored(built, "vc1", "list_vms", fields=["name", "folder"])["vms"]}
        sim.control("/delay", {"method_delay": {}})
        assert [rows[vm.name]["folder"].rsplit("/", 1)[-1] for vm in vms] == ["moved-between-parts"] * 3
    finally:
        built.close()
