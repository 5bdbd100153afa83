"""Read-only checks against the lab's own vCenters (``LAB_TARGETS_FILE``; ideally two, for the fan-out):
each target listed and reachable, VMs and events fanned out over "all", one VM's details per target, and
``gateway doctor`` on the same files. The gateway is started read-only and the client refuses to send
any tool that is not annotated read-only."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from lab.lab_client import Lab, WriteRefused
from support.httpserver import GATEWAY_MAIN, REPO


def per_target(lab: Lab, answer: dict[str, Any]) -> dict[str, Any]:
    """A fan-out answer's value per target; every target answered without an error."""
    assert set(answer) == set(lab.targets), answer
    failed = {name: part["error"] for name, part in answer.items() if "error" in part}
    assert not failed, failed
    return {name: part["ok"] for name, part in answer.items()}


def test_the_gateway_offers_no_write(lab: Lab) -> None:
    tools = lab.tools()
    assert tools and all(tools.values()), [name for name, read in tools.items() if not read]


def test_the_suite_refuses_to_send_a_write(lab: Lab) -> None:
    with pytest.raises(WriteRefused):
        lab.read("power_off_vm", {"target": lab.targets[0], "vm": "any"})


def test_list_targets_names_every_lab_target_reachable(lab: Lab) -> None:
    answer = lab.read("list_targets", {})
    rows = {row["name"]: row for row in answer["targets"]}
    assert sorted(rows) == sorted(lab.targets), answer
    assert all(row["connectivity"] == "ok" for row in rows.values()), answer


def test_list_vms_fans_out_over_all(lab: Lab) -> None:
    for name, value in per_target(lab, lab.read("list_vms", {"target": "all"})).items():
        assert isinstance(value.get("vms"), list), (name, value)


def test_get_events_fans_out_over_all(lab: Lab) -> None:
    for name, value in per_target(lab, lab.read("get_events", {"target": "all"})).items():
        assert isinstance(value, dict), (name, value)


def test_get_vm_details_of_one_vm_per_target(lab: Lab) -> None:
    listed = per_target(lab, lab.read("list_vms", {"target": "all"}))
    with_vms = {name: value["vms"] for name, value in listed.items() if value["vms"]}
    assert with_vms, "no lab target holds a VM"
    for name, vms in with_vms.items():
        vm = vms[0]
        details = lab.read("get_vm_details", {"target": name, "vm": vm.get("moid") or vm["name"]})
        assert details.get("name") == vm["name"] or details.get("moid") == vm.get("moid"), details


def test_gateway_doctor_passes_on_the_lab_files(lab: Lab) -> None:
    done = subprocess.run([sys.executable, "-c", GATEWAY_MAIN, "doctor"], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**lab.env, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
