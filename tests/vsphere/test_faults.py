"""faults.translate: a table of pyVmomi faults and transport errors -> gateway errors with stable codes.

Pure cases use fault objects built locally; the last test has the simulator send real faults over SOAP.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Callable
from typing import Any
from xml.parsers.expat import ExpatError

import pytest
from pyVmomi import vim, vmodl
from support.simulator import Simulator, credential_prefix

from gateway import errors
from gateway.config import Credentials, Target
from gateway.vsphere import faults
from gateway.vsphere.pool import SessionPool


def fault(cls: Any, **fields: Any) -> Any:
    """A pyVmomi fault (or data object) built locally; pyVmomi's constructors are untyped."""
    return cls(**fields)


CASES: list[tuple[BaseException, str]] = [
    (ConnectionRefusedError(111, "Connection refused"), "unreachable"),
    (socket.gaierror(-2, "Name or service not known"), "unreachable"),
    (ConnectionResetError(104, "Connection reset by peer"), "unreachable"),
    (http.client.RemoteDisconnected("Remote end closed connection without response"), "unreachable"),
    (BrokenPipeError(32, "Broken pipe"), "unreachable"),
    (OSError(113, "No route to host"), "unreachable"),
    (http.client.HTTPException("503 Service Unavailable"), "unreachable"),
    (ExpatError("not well-formed"), "unreachable"),
    (ssl.SSLError(1, "wrong version number"), "unreachable"),
    (TimeoutError("timed out"), "timeout"),
    (TimeoutError("_ssl.c:990: The handshake operation timed out"), "timeout"),
    (fault(vim.fault.InvalidLogin, msg="Cannot complete login"), "auth_failed"),
    (fault(vim.fault.NotAuthenticated), "not_authenticated"),
    (fault(vmodl.fault.ManagedObjectNotFound, msg="The object has already been deleted"), "not_found"),
    (fault(vim.fault.NotFound), "not_found"),
    (fault(vim.fault.InvalidState), "invalid_state"),
    (fault(vim.fault.InvalidPowerState, msg="The attempted operation cannot be performed"), "invalid_state"),
    (fault(vim.fault.TaskInProgress), "invalid_state"),
    (fault(vim.fault.InvalidHostState), "invalid_state"),
    (fault(vim.fault.NoPermission, privilegeId="VirtualMachine.Interact.PowerOff"), "permission_denied"),
    (fault(vmodl.fault.InvalidArgument, invalidProperty="spec.numCPUs"), "invalid_argument"),
    (fault(vim.fault.InvalidName, name="a/b"), "invalid_argument"),
    (fault(vim.fault.DuplicateName, name="web01"), "invalid_argument"),
    (fault(vmodl.fault.NotSupported), "not_supported"),
    (fault(vmodl.fault.NotImplemented), "not_supported"),
    (fault(vim.fault.GenericVmConfigFault, msg="something vSphere-specific"), "vsphere_error"),
]


@pytest.mark.parametrize(("exc", "code"), CASES, ids=[type(e).__name__ for e, _ in CASES])
def test_translate_gives_stable_code_naming_target(exc: BaseException, code: str) -> None:
    error = faults.translate(exc, "vc-east")
    assert error.code == code
    assert "target 'vc-east'" in error.message
    assert error.details["target"] == "vc-east"
    assert error.details["fault"] == type(exc).__name__
    assert faults.is_foreign(exc)


def test_subclass_row_wins_over_parent_row() -> None:
    power = faults.translate(fault(vim.fault.InvalidPowerState), "vc")
    state = faults.translate(fault(vim.fault.InvalidState), "vc")
    assert power.code == state.code == "invalid_state"
    assert "power state" in power.message and "power state" not in state.message
    # NotAuthenticated derives from NoPermission on the wire; it must not read as a permission problem.
    assert faults.translate(fault(vim.fault.NotAuthenticated), "vc").code == "not_authenticated"


def test_ssl_verification_failure_names_both_remedies() -> None:
    exc = ssl.SSLCertVerificationError(1, "certificate verify failed")
    exc.verify_message = "self-signed certificate"
    error = faults.translate(exc, "lab")
    assert error.code == "unreachable"
    assert "ca_file" in error.message and "insecure" in error.message
    assert "self-signed certificate" in error.message


def test_invalid_login_names_where_credentials_come_from() -> None:
    error = faults.translate(fault(vim.fault.InvalidLogin, msg="Cannot complete login"), "vc")
    assert isinstance(error, errors.AuthFailed)
    assert "credential_env_prefix" in error.message


def test_invalid_argument_carries_the_property_as_field() -> None:
    error = faults.translate(fault(vmodl.fault.InvalidArgument, invalidProperty="spec.numCPUs"), "vc")
    assert isinstance(error, errors.InvalidArgument)
    assert error.details["field"] == "spec.numCPUs"
    duplicate = faults.translate(fault(vim.fault.DuplicateName, name="web01"), "vc")
    assert duplicate.details["field"] == "name" and "'web01'" in duplicate.message


def test_target_text_is_sanitized_and_bounded() -> None:
    hostile = "line one\r\nline two\x1b[31m red\x1b[0m\x00\u202eevil\t" + "x" * 5000
    error = faults.translate(fault(vim.fault.InvalidState, msg=hostile), "vc")
    assert all(ch.isprintable() for ch in error.message)
    assert "line one line two red evil" in error.message
    assert "[31m" not in error.message
    assert len(error.message) < faults.MAX_DETAIL_CHARS + 300


def test_fault_message_list_used_when_msg_empty() -> None:
    message = fault(vmodl.LocalizableMessage, key="k", message="VM is busy")
    busy = fault(vim.fault.InvalidState, faultMessage=[message])
    assert "VM is busy" in faults.translate(busy, "vc").message


def test_gateway_errors_pass_through_unchanged() -> None:
    original = errors.NotFound("no VM called 'x'")
    assert faults.translate(original, "vc") is original
    assert not faults.is_foreign(original)


def test_programming_errors_are_not_foreign_and_do_not_leak_text() -> None:
    exc = KeyError("secret-looking internal detail")
    assert not faults.is_foreign(exc)
    error = faults.translate(exc, "vc")
    assert error.code == "vsphere_error"
    assert "secret-looking" not in error.message and "log" in error.message


def test_task_error_keeps_reason_task_and_fault() -> None:
    error = faults.task_error(fault(vim.fault.InvalidPowerState, msg="powered off"), "vc", "task-42")
    assert isinstance(error, errors.TaskFailed)
    wire = error.to_wire()
    assert wire["code"] == "task_failed"
    assert wire["reason"] == "invalid_state"
    assert wire["task"] == "task-42" and wire["target"] == "vc"
    assert wire["fault"] == "vim.fault.InvalidPowerState"
    assert "task-42" in error.message and "powered off" in error.message
    assert error.message.count("target 'vc'") == 1


def test_task_error_without_fault() -> None:
    error = faults.task_error(None, "vc", "task-7")
    assert error.code == "task_failed" and "task-7" in error.message


# InvalidPowerState and TaskInProgress are left out: the launcher injects them with empty enum fields
# or a reference of the wrong type, which pyVmomi refuses to deserialize.
WIRE_FAULTS: list[tuple[str, type[errors.GatewayError]]] = [
    ("NoPermission", errors.PermissionDenied),
    ("InvalidState", errors.InvalidState),
    ("ManagedObjectNotFound", errors.NotFound),
    ("InvalidArgument", errors.InvalidArgument),
    ("DuplicateName", errors.InvalidArgument),
    ("NotSupported", errors.NotSupported),
    ("InvalidLogin", errors.AuthFailed),
]


def test_faults_sent_by_the_simulator_translate(make_simulator: Callable[..., Simulator]) -> None:
    sim = make_simulator()
    target = Target(name="vc-wire", host=sim.host, port=sim.port,
                    credential_env_prefix=credential_prefix("vc-wire"), insecure=True)
    pool = SessionPool(target, Credentials(sim.user, sim.password))

    def now(session: Any) -> Any:
        return session.si.CurrentTime()

    try:
        pool.run(now)
        for name, error_type in WIRE_FAULTS:
            sim.control("/fail-next", {"method": "CurrentTime", "fault": name,
                                       "message": "injected\u202e\n\tfault text"})
            with pytest.raises(error_type) as caught:
                pool.run(now)
            error = caught.value
            assert isinstance(error, errors.GatewayError)
            assert error.details["fault"].endswith(name)
            assert "target 'vc-wire'" in error.message
            assert "injected fault text" in error.message
        assert pool.run(now) is not None  # no rule left: the pool still works
    finally:
        pool.close()


@pytest.mark.parametrize(("exc", "may_have_arrived"), [
    (ConnectionRefusedError(111, "Connection refused"), False),
    (socket.gaierror(-2, "Name or service not known"), False),
    (ssl.SSLCertVerificationError(1, "certificate verify failed"), False),
    (OSError(113, "No route to host"), False),
    (OSError(101, "Network is unreachable"), False),
    (ConnectionResetError(104, "Connection reset by peer"), True),
    (http.client.RemoteDisconnected("Remote end closed connection without response"), True),
    (BrokenPipeError(32, "Broken pipe"), True),
    (TimeoutError("The read operation timed out"), True),
    (http.client.HTTPException("504 Gateway Timeout"), True),
    (ExpatError("not well-formed"), True),
    (ssl.SSLError(1, "bad record mac"), True),
    (fault(vim.fault.InvalidPowerState, msg="off"), True),
])
def test_request_may_have_arrived_unless_the_connection_was_never_set_up(
        exc: BaseException, may_have_arrived: bool) -> None:
    assert faults.request_may_have_arrived(exc) is may_have_arrived
