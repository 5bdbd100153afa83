"""gateway.vsphere.access: the endpoint's facts and the privileges a session holds, from the target's answers.

``Answers`` stands in for the target's session and authorization managers (no simulator in the fast
tier): it answers with real pyVmomi data objects or raises real pyVmomi faults, as a target does."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pyVmomi import vim, vmodl

from gateway.vsphere.access import PrivilegeCheck, about, check_privileges

AM = vim.AuthorizationManager


class Answers:
    """The target's answers: ``has`` (privilege -> granted) or a fault for HasPrivilegeOnEntities,
    ``fetched`` or a fault for FetchUserPrivilegeOnEntities."""

    def __init__(self, has: dict[str, bool] | BaseException, fetched: list[str] | BaseException = ()) -> None:
        self.has, self.fetched = has, fetched
        self.asked: list[list[str]] = []

    def HasPrivilegeOnEntities(self, entities: Any, session_key: str, wanted: list[str]) -> Any:
        self.asked.append(list(wanted))
        if isinstance(self.has, BaseException):
            raise self.has
        return [AM.EntityPrivilege(entity=entities[0], privAvailability=[
            AM.PrivilegeAvailability(privId=p, isGranted=g) for p, g in self.has.items()])]

    def FetchUserPrivilegeOnEntities(self, entities: Any, user: str) -> Any:
        if isinstance(self.fetched, BaseException):
            raise self.fetched
        return [AM.UserPrivilegeResult(entity=entities[0], privileges=list(self.fetched))]


def session(answers: Answers, current: Any = "user") -> Any:
    manager = SimpleNamespace(currentSession=(SimpleNamespace(userName="svc@vsphere.local", key="k1")
                                              if current == "user" else current))
    return SimpleNamespace(content=SimpleNamespace(sessionManager=manager, authorizationManager=answers,
                                                   rootFolder=vim.Folder("group-d1")))


def test_privileges_granted_and_not() -> None:
    answers = Answers({"System.View": True, "VirtualMachine.Inventory.Delete": False})
    check = check_privileges(session(answers), ["VirtualMachine.Inventory.Delete", "System.View",
                                                "System.View", "Datastore.Browse"])
    assert check == PrivilegeCheck("svc@vsphere.local", {"Datastore.Browse": None, "System.View": True,
                                                         "VirtualMachine.Inventory.Delete": False})
    assert answers.asked == [["Datastore.Browse", "System.View", "VirtualMachine.Inventory.Delete"]]


def test_no_privileges_asked() -> None:
    answers = Answers({})
    assert check_privileges(session(answers), []) == PrivilegeCheck("svc@vsphere.local", {})
    assert answers.asked == []


def test_the_fallback_lists_what_the_user_holds() -> None:
    answers = Answers(vmodl.fault.NotSupported(), fetched=["System.View"])
    check = check_privileges(session(answers), ["System.View", "Host.Config.Power"])
    assert check == PrivilegeCheck("svc@vsphere.local", {"Host.Config.Power": False, "System.View": True})


def test_both_lookups_failing_leave_every_privilege_undetermined() -> None:
    answers = Answers(vim.fault.NoPermission(), fetched=vmodl.fault.NotSupported())
    check = check_privileges(session(answers), ["System.View"])
    assert check.held == {"System.View": None}
    assert check.error is not None and check.error.endswith("NoPermission")


def test_no_current_session() -> None:
    check = check_privileges(session(Answers({}), current=None), ["System.View"])
    assert check == PrivilegeCheck(None, {"System.View": None}, "the target reports no current session")


def test_a_fault_reading_the_session() -> None:
    class FaultingSessionManager:
        @property
        def currentSession(self) -> Any:
            raise vim.fault.NotAuthenticated()

    fake = session(Answers({}))
    fake.content.sessionManager = FaultingSessionManager()
    check = check_privileges(fake, ["System.View"])
    assert check.user is None and check.held == {"System.View": None}
    assert check.error is not None and check.error.endswith("NotAuthenticated")


@pytest.mark.parametrize(("uuid", "shown"), [("8b1e-...", "8b1e-..."), ("", None), (None, None)])
def test_about_the_endpoint(uuid: str | None, shown: str | None) -> None:
    info = SimpleNamespace(name="VMware vCenter Server", fullName="VMware vCenter Server 8.0.2",
                           version="8.0.2", build="123", apiType="VirtualCenter", apiVersion="8.0.2.0",
                           instanceUuid=uuid)
    out = about(SimpleNamespace(content=SimpleNamespace(about=info)))
    assert out == {"product": "VMware vCenter Server", "full_name": "VMware vCenter Server 8.0.2",
                   "version": "8.0.2", "build": "123", "api_type": "VirtualCenter", "api_version": "8.0.2.0",
                   "instance_uuid": shown}


def test_about_an_esxi_host_without_an_instance_uuid() -> None:
    info = SimpleNamespace(name="VMware ESXi", fullName="VMware ESXi 8.0", version="8.0", build="1",
                           apiType="HostAgent", apiVersion="8.0")
    assert about(SimpleNamespace(content=SimpleNamespace(about=info)))["instance_uuid"] is None
