"""gateway.tools.pending: the proposal tools the pipeline serves itself (list, confirm, cancel)."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidArgument
from gateway.tools.pending import CANCEL, CONFIRM, LIST_PENDING, PENDING_TOOLS
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Category, Risk


def test_the_three_tools() -> None:
    assert [t.name for t in PENDING_TOOLS] == ["list_pending_actions", "confirm_action", "cancel_action"]


@pytest.mark.parametrize(("spec", "category", "risk"), [
    (LIST_PENDING, Category.READ, Risk.LOW),
    (CONFIRM, Category.DESTRUCTIVE, Risk.HIGH),
    (CANCEL, Category.WRITE, Risk.LOW),
])
def test_categories_and_risks(spec: ToolSpec, category: Category, risk: Risk) -> None:
    assert (spec.kind, spec.risk) == (category, risk)


@pytest.mark.parametrize("spec", PENDING_TOOLS)
def test_served_by_the_pipeline_without_a_vsphere_handler(spec: ToolSpec) -> None:
    assert spec.target_mode == "none"
    assert (spec.read, spec.plan, spec.execute) == (None, None, None)
    assert spec.annotations()["openWorldHint"] is False
    assert not spec.keeps_arguments


@pytest.mark.parametrize("spec", [CONFIRM, CANCEL])
def test_confirm_and_cancel_take_exactly_the_token(spec: ToolSpec) -> None:
    schema = spec.input_schema()
    assert schema["required"] == ["token"] and list(schema["properties"]) == ["token"]
    assert schema["additionalProperties"] is False
    assert spec.validate({"token": "abc"}) == {"token": "abc"}
    with pytest.raises(InvalidArgument, match="token: required by"):
        spec.validate({})
    with pytest.raises(InvalidArgument, match="vm: unknown parameter"):
        spec.validate({"token": "abc", "vm": "x"})


def test_listing_takes_no_arguments() -> None:
    assert LIST_PENDING.input_schema()["properties"] == {}
    assert LIST_PENDING.validate(None) == {}


def test_the_annotations_follow_the_categories() -> None:
    assert LIST_PENDING.annotations()["readOnlyHint"] is True
    assert CONFIRM.annotations()["destructiveHint"] is True
    assert CANCEL.annotations() == {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False,
                                    "openWorldHint": False}


def test_confirm_tells_the_caller_to_reread_first() -> None:
    assert "Re-read the proposal's target and affected objects first" in CONFIRM.description
