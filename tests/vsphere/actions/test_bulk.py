"""gateway.vsphere.actions.bulk: the tools a bulk call reaches, whole-name patterns, broken VMs, stops."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gateway import errors
from gateway.config import Target
from gateway.vocabulary import Plan
from gateway.vsphere.actions.bulk import (
    _BULK_WORDS,
    BULK_ACTIONS,
    BULK_REACH,
    _bulk_stopped,
    _refuse_broken,
    bulk_reach,
    compile_name_regex,
)
from gateway.vsphere.actions.execution import Execution
from gateway.vsphere.resolve import VmRef

SESSION = SimpleNamespace(target=Target("vc1", "vc1.example", "VC1"))


def vm(moid: str, name: str, state: str = "connected") -> VmRef:
    return VmRef(moid, name, "/DC0/vm", None, None, state, "poweredOff")


@pytest.mark.parametrize(("action", "reach"), [
    ("delete_vm", ("delete_vm",)),
    ("delete_all_snapshots", ("delete_snapshot",)),
    ("revert_to_current_snapshot", ("revert_snapshot",)),
])
def test_each_action_reaches_its_single_vm_tool(action: str, reach: tuple[str, ...]) -> None:
    assert bulk_reach({"action": action}) == reach


@pytest.mark.parametrize("args", [{}, {"action": "format_disk"}, {"action": None}])
def test_an_action_not_known_reaches_every_tool(args: dict[str, Any]) -> None:
    assert bulk_reach(args) == ("delete_snapshot", "delete_vm", "revert_snapshot")


def test_every_action_has_a_reach_and_words() -> None:
    assert set(BULK_ACTIONS) == set(BULK_REACH) == set(_BULK_WORDS)
    assert _BULK_WORDS["delete_vm"].format(n=3) == "PERMANENTLY DELETE 3 VM(s) and their files"


@pytest.mark.parametrize(("pattern", "name", "matches"), [
    (r"web-\d+", "web-1", True),
    (r"web-\d+", "old-web-1", False),
    (r"web-\d+", "web-1-old", False),
    ("web", "web", True),
    ("web", "webserver", False),
    ("test-.*", "test-", True),
    ("(a|b)-vm", "b-vm", True),
])
def test_the_pattern_must_match_the_whole_name(pattern: str, name: str, matches: bool) -> None:
    assert compile_name_regex(pattern).fullmatch(name) is matches


@pytest.mark.parametrize("pattern", ["(", r"(a)\1", "(?=x)"])
def test_a_bad_pattern_names_the_field(pattern: str) -> None:
    with pytest.raises(errors.InvalidArgument) as raised:
        compile_name_regex(pattern)
    assert raised.value.details["field"] == "name_regex"


def test_usable_vms_pass() -> None:
    assert _refuse_broken(SESSION, [vm("vm-1", "a"), vm("vm-2", "b", "disconnected")], "delete_vm") is None


def test_broken_vms_are_refused_together() -> None:
    vms = [vm("vm-1", "a"), vm("vm-2", "b", "orphaned"), vm("vm-3", "c", "inaccessible")]
    with pytest.raises(errors.InvalidState) as raised:
        _refuse_broken(SESSION, vms, "delete_vm")
    assert raised.value.message == (
        "on target 'vc1': VM 'b' (vm-2) is orphaned, VM 'c' (vm-3) is inaccessible; vSphere does not allow "
        "delete_vm on such VMs. Narrow name_regex to leave them out, and remove leftover records with "
        "unregister_vm")
    assert raised.value.details == {"target": "vc1", "vms": ["b", "c"]}


def call() -> Execution:
    return Execution(SESSION, Plan("s", ()), lambda _f, _m: None)


DONE = [{"vm": "a", "moid": "vm-1"}]
FAILED = {"name": "b", "moid": "vm-2"}
REST = [{"name": "c", "moid": "vm-3"}, {"name": "d", "moid": "vm-4"}]


def test_a_failure_stops_the_run_and_says_what_was_done() -> None:
    error = _bulk_stopped(call(), errors.InvalidState("powered on"), FAILED, DONE, REST, [])
    assert isinstance(error, errors.TaskFailed)
    assert error.message == ("bulk action stopped at VM 'b' (vm-2): powered on. 1 VM(s) done (a), 2 not "
                             "attempted")
    assert error.details == {"target": "vc1", "failed_vm": "b", "failed_moid": "vm-2",
                             "cause": "invalid_state", "completed": DONE, "not_attempted": ["c", "d"],
                             "safety_snapshots": []}


def test_an_unknown_outcome_stays_unknown() -> None:
    cause = errors.OutcomeUnknown("lost track of task-1", task="task-1")
    error = _bulk_stopped(call(), cause, FAILED, [], REST, [{"name": "s"}])
    assert isinstance(error, errors.OutcomeUnknown)
    assert error.message == ("lost track of task-1. Bulk action stopped at VM 'b': 0 VM(s) done (none), "
                             "2 not attempted")
    assert error.details["task"] == "task-1" and error.details["cause"] == "outcome_unknown"
    assert error.details["safety_snapshots"] == [{"name": "s"}]
