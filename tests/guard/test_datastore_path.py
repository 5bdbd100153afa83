"""Datastore paths in one canonical form, or refused (``gateway.guard.datastore_path``), and ``mount_iso``
using only that form end to end (issue 24)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pyVmomi import vim
from support.answers import answer_of
from support.httpserver import Served, audit_rows, build_gateway, mcp_client, serve
from support.simulator import MakeSimulator, Simulator, find_vm, pyvmomi_connect, read_properties

from gateway.errors import InvalidArgument
from gateway.guard.datastore_path import canonical_iso_path, normalize

VM = "DC0_C0_RP0_VM0"


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("[LocalDS_0] isos/ubuntu.iso", "[LocalDS_0] isos/ubuntu.iso"),
        ("  [LocalDS_0]isos/ubuntu.iso  ", "[LocalDS_0] isos/ubuntu.iso"),
        ("[LocalDS_0] isos//./ubuntu.iso", "[LocalDS_0] isos/ubuntu.iso"),
        ("[LocalDS_0] /isos/ubuntu.iso", "[LocalDS_0] isos/ubuntu.iso"),
        ("[LocalDS_0] isos/old/../ubuntu.iso", "[LocalDS_0] isos/ubuntu.iso"),
        ("[LocalDS_0] isos\\win\\setup.iso", "[LocalDS_0] isos/win/setup.iso"),
        ("[LocalDS_0] isos/%75buntu.iso", "[LocalDS_0] isos/ubuntu.iso"),
        ("[LocalDS_0] isos/a%2f..%2fb.iso", "[LocalDS_0] isos/b.iso"),
        ("[LocalDS_0] isos/my image (1).iso", "[LocalDS_0] isos/my image (1).iso"),
        ("[Local DS] ...iso", "[Local DS] ...iso"),
    ],
)
def test_paths_inside_the_datastore_become_canonical(text: str, canonical: str) -> None:
    assert canonical_iso_path(text) == canonical


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[LocalDS_0] isos/../../x.iso", "walks out of datastore 'LocalDS_0'"),
        ("[LocalDS_0] ../LocalDS_1/x.iso", "walks out"),
        ("[LocalDS_0] isos/..\\..\\x.iso", "walks out"),
        ("[LocalDS_0] isos/%2e%2e/%2E%2E/x.iso", "walks out"),
        ("[LocalDS_0] isos/..%2f..%2fx.iso", "walks out"),
        ("[LocalDS_0] isos/..%5c..%5cx.iso", "walks out"),
        ("[LocalDS_0] isos/%252e%252e/x.iso", "encoded twice"),
        ("[LocalDS_0] isos/%ff.iso", "not UTF-8"),
        ("[LocalDS_0] isos/%00.iso", "control characters"),
        ("[LocalDS_0] isos/x\n.iso", "control characters"),
        ("[LocalDS_0] isos/..", "names no file"),
        ("[LocalDS_0] ./", "names no file"),
        ("isos/x.iso", "expected a datastore path"),
        ("[ ] x.iso", "expected a datastore path"),
        ("[LocalDS_0] isos/x.img", "ISO image"),
        ("[LocalDS_0] isos/x.iso/..", "ISO image"),
    ],
)
def test_paths_that_leave_the_datastore_or_hide_their_shape_are_refused(text: str, why: str) -> None:
    with pytest.raises(InvalidArgument, match=why) as caught:
        canonical_iso_path(text)
    assert caught.value.details["field"] == "iso_path"


def test_normalize_names_the_field_it_checks() -> None:
    with pytest.raises(InvalidArgument) as caught:
        normalize("[ds] ../x", "path")
    assert caught.value.details["field"] == "path"
    assert str(normalize("[ds] a/./b")) == "[ds] a/b"


@pytest.fixture
def rig(make_simulator: MakeSimulator, tmp_path: Path) -> Iterator[tuple[Served, Simulator]]:
    sim = make_simulator()
    running = serve(tmp_path, build_gateway(tmp_path, sim))
    yield running, sim
    running.stop()
    anyio.run(running.gateway.close)


def _mount(served: Served, iso_path: str) -> tuple[bool, dict[str, Any]]:
    async def call() -> tuple[bool, dict[str, Any]]:
        async with mcp_client(served, served.tokens["alice"], "2026-07-28") as client:
            result = await client.call_tool("mount_iso", {"target": "vc1", "vm": VM, "iso_path": iso_path})
        return bool(result.is_error), answer_of(result)

    return anyio.run(call)


def _isos(sim: Simulator) -> list[str]:
    si = pyvmomi_connect(sim)
    devices = read_properties(si, find_vm(si, VM), "config.hardware.device")["config.hardware.device"]
    return [d.backing.fileName for d in devices if isinstance(d, vim.vm.device.VirtualCdrom)
            and isinstance(d.backing, vim.vm.device.VirtualCdrom.IsoBackingInfo)]


def test_mount_iso_refuses_a_path_out_of_the_datastore_and_mounts_the_canonical_one(
    rig: tuple[Served, Simulator]
) -> None:
    served, sim = rig
    failed, answer = _mount(served, "[LocalDS_0] isos/../../x.iso")
    assert failed and answer["error"]["code"] == "invalid_argument", answer
    assert "walks out of datastore 'LocalDS_0'" in answer["error"]["message"]
    assert _isos(sim) == [], "nothing was mounted"

    failed, answer = _mount(served, "[LocalDS_0] isos/old/..//%75buntu.iso")
    assert not failed, answer
    assert answer["iso_path"] == "[LocalDS_0] isos/ubuntu.iso"
    assert _isos(sim) == ["[LocalDS_0] isos/ubuntu.iso"]
    (row,) = [r for r in audit_rows(served.gateway) if r["tool"] == "mount_iso" and r["phase"] == "executed"]
    assert row["args"]["iso_path"] == "[LocalDS_0] isos/ubuntu.iso"
