"""gateway.vsphere.actions.execution: what a failed mutation is reported as, before and after a change.

The failing "methods" here are fault fakes: plain callables raising the exception a target or the
transport would raise."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest
from pyVmomi import vim

from gateway import errors
from gateway.config import Target
from gateway.vocabulary import Plan
from gateway.vsphere.actions.execution import Execution, _executor, split_progress
from gateway.vsphere.actions.planning import DEFAULT_TIMEOUT_SECONDS

SESSION = SimpleNamespace(target=Target("vc1", "vc1.example", "VC1"))


def execution(**params: Any) -> Execution:
    return Execution(SESSION, Plan("s", (), {"vm": "vm-1", **params}), lambda _f, _m: None)


def raising(exc: BaseException) -> Any:
    def fault_fake(*_args: Any, **_kwargs: Any) -> Any:
        raise exc
    return fault_fake


def test_an_execution_knows_its_target_timeout_and_stamp() -> None:
    call = execution()
    assert call.target == "vc1"
    assert call.timeout == DEFAULT_TIMEOUT_SECONDS == 600.0
    assert call.mutated is False
    assert re.fullmatch(r"\d{8}T\d{6}Z", call.stamp)
    assert execution(timeout_seconds=30).timeout == 30.0


def test_result_names_the_target() -> None:
    assert execution().result(vm="web", done=True) == {"target": "vc1", "vm": "web", "done": True}


@pytest.mark.parametrize(("index", "count", "fraction", "reported"), [
    (0, 2, 0.0, 0.0), (0, 2, 1.0, 0.5), (1, 2, 0.5, 0.75), (2, 4, 0.0, 0.5), (0, 1, 0.3, 0.3),
])
def test_split_progress(index: int, count: int, fraction: float, reported: float) -> None:
    seen: list[tuple[float, str]] = []
    split_progress(lambda f, m: seen.append((f, m)), index, count)(fraction, "msg")
    assert seen == [(pytest.approx(reported), "msg")]


def test_share_splits_the_calls_progress() -> None:
    seen: list[float] = []
    call = Execution(SESSION, Plan("s", ()), lambda f, _m: seen.append(f))
    call.share(1, 4)(1.0, "done")
    assert seen == [0.5]


# --------------------------------------------------------------------------- invoke


def test_invoke_returns_the_answer_and_marks_a_change() -> None:
    call = execution()
    assert call.invoke(lambda a, b=0: a + b, 1, b=2, destructive=False, what="adding") == 3
    assert call.mutated


def test_a_first_session_expiry_propagates_untranslated_so_the_pool_can_retry() -> None:
    call = execution()
    with pytest.raises(vim.fault.NotAuthenticated):
        call.invoke(raising(vim.fault.NotAuthenticated()), destructive=False, what="x")
    assert call.mutated is False


def test_a_session_expiry_after_a_change_is_translated() -> None:
    call = execution()
    call.invoke(lambda: None, destructive=False, what="first")
    with pytest.raises(errors.NotAuthenticated):
        call.invoke(raising(vim.fault.NotAuthenticated()), destructive=False, what="second")
    assert call.mutated


def test_a_vsphere_fault_is_an_answer_and_translated() -> None:
    call = execution()
    with pytest.raises(errors.InvalidState) as raised:
        call.invoke(raising(vim.fault.InvalidPowerState()), destructive=True, what="powering off")
    assert raised.value.details["target"] == "vc1"
    assert call.mutated  # the request arrived: the change may have been made


def test_a_connection_never_set_up_on_a_write_stays_unreachable() -> None:
    call = execution()
    with pytest.raises(errors.Unreachable):
        call.invoke(raising(ConnectionRefusedError()), destructive=False, what="powering on")
    assert call.mutated is False


def test_a_connection_never_set_up_on_a_destructive_call_is_unknown() -> None:
    call = execution()
    with pytest.raises(errors.OutcomeUnknown) as raised:
        call.invoke(raising(ConnectionRefusedError()), destructive=True, what="deleting VM 'web'")
    assert raised.value.message == ("target 'vc1': the answer to deleting VM 'web' was lost (unreachable); "
                                    "it may have taken effect. Do not retry: read the affected objects again "
                                    "(or get_tasks) to see what happened")
    assert raised.value.details == {"target": "vc1", "cause": "unreachable"}


@pytest.mark.parametrize(("exc", "cause"), [
    (ConnectionResetError(), "unreachable"), (TimeoutError(), "timeout"), (BrokenPipeError(), "unreachable"),
])
def test_a_lost_answer_is_unknown_even_for_a_write(exc: BaseException, cause: str) -> None:
    call = execution()
    with pytest.raises(errors.OutcomeUnknown) as raised:
        call.invoke(raising(exc), destructive=False, what="x")
    assert raised.value.details["cause"] == cause
    assert call.mutated


def test_exceptions_that_are_not_foreign_pass_through() -> None:
    call = execution()
    with pytest.raises(KeyError):
        call.invoke(raising(KeyError("bug")), destructive=False, what="x")


# --------------------------------------------------------------------------- the executor


def executor_of(body: Any) -> Any:
    return _executor(body)(SESSION, Plan("s", (), {"vm": "vm-1"}), lambda _f, _m: None)


def test_the_executor_runs_the_body_with_an_execution() -> None:
    assert executor_of(lambda call: call.result(moid=call.params["vm"])) == {"target": "vc1", "moid": "vm-1"}


def test_a_lost_connection_before_any_change_stays_as_it_is() -> None:
    def body(_call: Execution) -> dict[str, Any]:
        raise errors.Unreachable("down", target="vc1")

    with pytest.raises(errors.Unreachable):
        executor_of(body)


@pytest.mark.parametrize("error", [errors.Unreachable("down"), errors.Timeout("slow")])
def test_a_lost_connection_after_a_change_is_unknown(error: errors.GatewayError) -> None:
    def body(call: Execution) -> dict[str, Any]:
        call.invoke(lambda: None, destructive=False, what="change")
        raise error

    with pytest.raises(errors.OutcomeUnknown) as raised:
        executor_of(body)
    assert raised.value.details == {"target": "vc1", "cause": error.code}
    assert raised.value.message.startswith(f"target 'vc1': the connection was lost after the change was sent "
                                           f"({error.code}); it may have taken effect.")


def test_a_task_wait_keeps_its_own_verdict() -> None:
    def body(call: Execution) -> dict[str, Any]:
        call.invoke(lambda: None, destructive=False, what="change")
        raise errors.Timeout("task still running", task="task-1")

    with pytest.raises(errors.Timeout):
        executor_of(body)


def test_a_session_expiry_inside_the_body() -> None:
    def before(_call: Execution) -> dict[str, Any]:
        raise vim.fault.NotAuthenticated()

    def after(call: Execution) -> dict[str, Any]:
        call.invoke(lambda: None, destructive=False, what="change")
        raise vim.fault.NotAuthenticated()

    with pytest.raises(vim.fault.NotAuthenticated):
        executor_of(before)
    with pytest.raises(errors.NotAuthenticated):
        executor_of(after)
