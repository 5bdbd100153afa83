"""gateway.guard.idempotency_rules: what a call with a used key does, which errors keep a key, key shape."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidArgument
from gateway.guard.idempotency_rules import (
    DEFAULT_WINDOW_SECONDS,
    KEPT_ERRORS,
    KEY_FIELD,
    Seen,
    Step,
    checked_key,
    decide,
    keeps_error,
)

WINDOW = 100.0


def seen(tool: str = "power_on_vm", digest: str = "d1", *, running: bool = False, created_at: float = 0.0,
         owner_alive: bool = True) -> Seen:
    return Seen(tool, digest, running, created_at, owner_alive)


def test_no_record_runs() -> None:
    assert decide(None, tool="power_on_vm", digest="d1", now=5.0, window=WINDOW) is Step.RUN


@pytest.mark.parametrize(("record", "tool", "digest", "now", "step"), [
    (seen(), "power_on_vm", "d1", 10.0, Step.REPLAY),
    (seen(running=True), "power_on_vm", "d1", 10.0, Step.WAIT),
    (seen(running=True, owner_alive=False), "power_on_vm", "d1", 10.0, Step.ORPHANED),
    (seen(), "power_off_vm", "d1", 10.0, Step.CONFLICT),
    (seen(), "power_on_vm", "d2", 10.0, Step.CONFLICT),
    (seen(running=True), "power_on_vm", "other", 10.0, Step.CONFLICT),
    (seen(), "power_on_vm", "d1", WINDOW, Step.TAKE_OVER),
    (seen(), "power_on_vm", "d1", WINDOW + 1, Step.TAKE_OVER),
    (seen(), "power_on_vm", "d1", WINDOW - 0.5, Step.REPLAY),
    (seen(running=True), "power_on_vm", "d1", WINDOW + 1, Step.TAKE_OVER),
    (seen(running=True, owner_alive=False), "power_on_vm", "d1", WINDOW, Step.TAKE_OVER),
    (seen(tool="other"), "power_on_vm", "d1", WINDOW * 2, Step.TAKE_OVER),
])
def test_decide_steps(record: Seen, tool: str, digest: str, now: float, step: Step) -> None:
    assert decide(record, tool=tool, digest=digest, now=now, window=WINDOW) is step


def test_a_finished_record_replays_whatever_its_owner() -> None:
    record = seen(running=False, owner_alive=False)
    assert decide(record, tool="power_on_vm", digest="d1", now=1.0, window=WINDOW) is Step.REPLAY


def test_window_is_measured_from_creation() -> None:
    record = seen(created_at=1000.0)
    assert decide(record, tool="power_on_vm", digest="d1", now=1099.0, window=WINDOW) is Step.REPLAY
    assert decide(record, tool="power_on_vm", digest="d1", now=1100.0, window=WINDOW) is Step.TAKE_OVER


def test_default_window_is_a_day() -> None:
    assert DEFAULT_WINDOW_SECONDS == 86400.0


@pytest.mark.parametrize("code", sorted(KEPT_ERRORS))
def test_errors_after_which_the_change_may_have_happened_keep_the_key(code: str) -> None:
    assert keeps_error(code)


@pytest.mark.parametrize("code", ["policy_denied", "rate_limited", "unreachable", "invalid_argument",
                                  "busy", "not_found", "invalid_state", ""])
def test_errors_saying_nothing_changed_release_the_key(code: str) -> None:
    assert not keeps_error(code)


def test_kept_errors_are_the_three_uncertain_outcomes() -> None:
    assert {"outcome_unknown", "timeout", "task_failed"} == KEPT_ERRORS


@pytest.mark.parametrize("key", [
    "a", "0f8fa1e4-3c1d-4bb5-9d84-52a0d6c3f0aa", "01HZY3C2G0M7Q1Z8N7X5R4T2PW", "my-slug_1.2",
    "!~", "x" * 128,
])
def test_checked_key_accepts_printable_keys(key: str) -> None:
    assert checked_key(key) == key


@pytest.mark.parametrize("key", ["", " ", "with space", "x" * 129, "tab\there", "new\nline", "é", "\x7f"])
def test_checked_key_refuses_other_keys(key: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        checked_key(key)
    assert raised.value.code == "invalid_argument"
    assert raised.value.details["field"] == KEY_FIELD
    assert raised.value.message.startswith("idempotency_key: must be 1-128 printable ASCII characters")
