"""The exception tree: stable wire codes, wire form, and raising a wire error again (``error_of``)."""

from __future__ import annotations

import pytest

from gateway import errors
from gateway.errors import (
    Busy,
    GatewayError,
    InvalidArgument,
    NotFound,
    RateLimited,
    VSphereError,
    error_of,
)

CODES = [
    (errors.GatewayError, "internal"),
    (errors.InvalidArgument, "invalid_argument"),
    (errors.NotFound, "not_found"),
    (errors.Ambiguous, "ambiguous"),
    (errors.ConfigError, "config_error"),
    (errors.VSphereError, "vsphere_error"),
    (errors.Unreachable, "unreachable"),
    (errors.Timeout, "timeout"),
    (errors.QueueTimeout, "queue_timeout"),
    (errors.Busy, "busy"),
    (errors.AuthFailed, "auth_failed"),
    (errors.NotAuthenticated, "not_authenticated"),
    (errors.InvalidState, "invalid_state"),
    (errors.PermissionDenied, "permission_denied"),
    (errors.TaskFailed, "task_failed"),
    (errors.OutcomeUnknown, "outcome_unknown"),
    (errors.NotSupported, "not_supported"),
    (errors.PolicyDenied, "policy_denied"),
    (errors.RateLimited, "rate_limited"),
    (errors.ConfirmationExpired, "confirmation_expired"),
    (errors.ConfirmationInvalid, "confirmation_invalid"),
    (errors.Stale, "stale"),
    (errors.ApprovalRequired, "approval_required"),
    (errors.ReasonRequired, "reason_required"),
    (errors.AuditUnavailable, "audit_unavailable"),
    (errors.StateUnavailable, "state_unavailable"),
    (errors.Unauthorized, "unauthorized"),
    (errors.Forbidden, "forbidden"),
    (errors.ScanLimitReached, "scan_limit_reached"),
    (errors.IdempotencyConflict, "idempotency_conflict"),
    (errors.IdempotencyInProgress, "idempotency_in_progress"),
    (errors.TaskNotFound, "task_not_found"),
]
VSPHERE = {"unreachable", "timeout", "queue_timeout", "busy", "auth_failed", "not_authenticated",
           "invalid_state", "permission_denied", "task_failed", "outcome_unknown", "not_supported"}


@pytest.mark.parametrize(("cls", "code"), CODES, ids=[code for _, code in CODES])
def test_each_error_class_has_its_stable_wire_code(cls: type[GatewayError], code: str) -> None:
    assert cls.code == code
    assert issubclass(cls, GatewayError)


@pytest.mark.parametrize(("cls", "code"), CODES, ids=[code for _, code in CODES])
def test_vsphere_errors_are_exactly_the_vsphere_branch(cls: type[GatewayError], code: str) -> None:
    assert issubclass(cls, VSphereError) == (code in VSPHERE or code == "vsphere_error")


def test_wire_codes_are_unique_across_the_tree() -> None:
    codes = [code for _, code in CODES]
    assert len(codes) == len(set(codes))


def test_to_wire_carries_code_message_and_details() -> None:
    exc = NotFound("no VM named web1", target="vc1", hint="list_vms")
    assert exc.to_wire() == {"code": "not_found", "message": "no VM named web1", "target": "vc1",
                             "hint": "list_vms"}


def test_to_wire_leaves_out_details_that_are_none() -> None:
    assert NotFound("gone", target=None, moid="vm-1").to_wire() == {
        "code": "not_found", "message": "gone", "moid": "vm-1"}


def test_message_is_the_exception_text() -> None:
    exc = GatewayError("something broke")
    assert str(exc) == "something broke"
    assert exc.message == "something broke"
    assert exc.details == {}


def test_invalid_argument_names_the_field_in_message_and_details() -> None:
    exc = InvalidArgument("vm", "must be a name")
    assert exc.message == "vm: must be a name"
    assert exc.to_wire() == {"code": "invalid_argument", "message": "vm: must be a name", "field": "vm"}


@pytest.mark.parametrize(("given", "shown"), [(2.04, 2.0), (0.05, 0.1), (12.0, 12.0), (1.26, 1.3)])
def test_rate_limited_rounds_retry_after_to_a_tenth_on_the_wire(given: float, shown: float) -> None:
    exc = RateLimited("slow down", given)
    assert exc.retry_after == given
    assert exc.to_wire()["retry_after_seconds"] == shown


def test_busy_names_its_target_and_rounded_retry_after() -> None:
    exc = Busy("queue full", target="vc1", retry_after=3.14159)
    assert exc.retry_after == 3.14159
    assert exc.to_wire() == {"code": "busy", "message": "queue full", "target": "vc1",
                             "retry_after_seconds": 3.1}


@pytest.mark.parametrize(("cls", "code"), CODES, ids=[code for _, code in CODES])
def test_error_of_raises_the_class_of_the_wire_code(cls: type[GatewayError], code: str) -> None:
    exc = error_of({"code": code, "message": "again"})
    assert type(exc) is cls
    assert exc.code == code
    assert exc.message == "again"


def test_error_of_keeps_details_and_round_trips_to_wire() -> None:
    wire = Busy("queue full", target="vc1", retry_after=2.0).to_wire()
    again = error_of(wire)
    assert isinstance(again, Busy)
    assert again.to_wire() == wire


def test_error_of_invalid_argument_keeps_the_message_as_sent() -> None:
    wire = InvalidArgument("vm", "must be a name").to_wire()
    again = error_of(wire)
    assert isinstance(again, InvalidArgument)
    assert again.message == "vm: must be a name"
    assert again.to_wire() == wire


@pytest.mark.parametrize("wire", [{"code": "no_such_code", "message": "x"}, {"message": "x"}, {}])
def test_error_of_an_unknown_or_missing_code_is_a_plain_gateway_error(wire: dict[str, str]) -> None:
    exc = error_of(wire)
    assert type(exc) is GatewayError
    assert exc.code == "internal"
    assert exc.message == wire.get("message", "")


def test_error_of_is_raisable() -> None:
    with pytest.raises(NotFound, match="no such task"):
        raise error_of({"code": "not_found", "message": "no such task"})
