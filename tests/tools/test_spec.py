"""ToolSpec: schemas, annotations and argument validation follow from the declaration."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidArgument
from gateway.tools.spec import TARGET, TARGETS, Param, ToolSpec
from gateway.vocabulary import Category, Risk

SPEC = ToolSpec(
    name="resize",
    description="d",
    category=Category.WRITE,
    risk=Risk.MEDIUM,
    params=(
        TARGET,
        Param("cpus", "integer", "n", required=True, minimum=1, maximum=64),
        Param("mode", "string", "m", enum=("hot", "cold"), default="cold"),
        Param("tags", "array", "t"),
    ),
)


def test_validate_fills_defaults() -> None:
    assert SPEC.validate({"target": "a", "cpus": 2}) == {"target": "a", "cpus": 2, "mode": "cold"}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"cpus": 2}, "target"),
        ({"target": "a"}, "cpus"),
        ({"target": "a", "cpus": 0}, "cpus"),
        ({"target": "a", "cpus": 65}, "cpus"),
        ({"target": "a", "cpus": True}, "cpus"),
        ({"target": "a", "cpus": "2"}, "cpus"),
        ({"target": "a", "cpus": 2, "mode": "warm"}, "mode"),
        ({"target": "a", "cpus": 2, "tags": [1]}, "tags"),
        ({"target": "a", "cpus": 2, "spec": {}}, "spec"),
        ({"target": "", "cpus": 2}, "target"),
    ],
)
def test_bad_arguments_name_the_field(args: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        SPEC.validate(args)
    assert info.value.details["field"] == field
    assert info.value.code == "invalid_argument"


def test_targets_param_accepts_name_list_or_all() -> None:
    spec = ToolSpec(name="r", description="d", category=Category.READ, risk=Risk.LOW, params=(TARGETS,))
    assert spec.validate({"target": "all"})["target"] == "all"
    assert spec.validate({"target": ["a", "b", "a"]})["target"] == ["a", "b"]
    with pytest.raises(InvalidArgument):
        spec.validate({"target": []})


def test_schema_and_annotations_follow_category() -> None:
    schema = SPEC.input_schema()
    assert schema["required"] == ["target", "cpus"] and schema["additionalProperties"] is False
    assert schema["properties"]["cpus"]["minimum"] == 1
    assert SPEC.annotations()["readOnlyHint"] is False
    read = ToolSpec(name="r", description="d", category=Category.READ, risk=Risk.LOW)
    assert read.annotations()["readOnlyHint"] is True


def test_unclassified_tool_counts_as_destructive() -> None:
    spec = ToolSpec(name="mystery", description="d")
    assert spec.kind is Category.DESTRUCTIVE and spec.risk is Risk.CRITICAL
    assert spec.annotations()["destructiveHint"] is True


#: (tool, arguments, refused argument or None): a proposal never keeps a secret; calls that keep nothing do
CREDENTIAL_CASES: list[tuple[str, dict[str, object], str | None]] = [
    ("bulk_vm_action", {"target": "vc1", "action": "delete_vm", "name_regex": "(?:password is Hunter2)?web"},
     "name_regex"),
    ("delete_snapshot", {"target": "vc1", "vm": "web-1", "snapshot": "AKIAIOSFODNN7EXAMPLE"}, "snapshot"),
    ("remove_disk", {"target": "vc1", "vm": "token=abcdef0123456789abcdef0123456789", "disk": "Hard disk 2"},
     "vm"),
    ("delete_snapshot", {"target": "vc1", "vm": "web-1", "snapshot": "before-upgrade"}, None),
    ("bulk_vm_action", {"target": "vc1", "action": "delete_vm", "name_regex": "^pass-.*"}, None),
    ("list_vms", {"target": "vc1", "name": "password is Hunter2"}, None),  # a read keeps no argument
    ("confirm_action", {"token": "gwc_abcdefghijklmnopqrstuvwxyz012345"}, None),  # nor does a confirm
]


@pytest.mark.parametrize(("tool", "args", "refused"), CREDENTIAL_CASES)
def test_a_tool_whose_calls_become_proposals_refuses_credential_shaped_arguments(
    tool: str, args: dict[str, object], refused: str | None
) -> None:
    from gateway.tools.registry import all_tools

    (spec,) = [t for t in all_tools(destructive=True) if t.name == tool]
    if refused is None:
        spec.validate(args)
        return
    with pytest.raises(InvalidArgument) as caught:
        spec.validate(args)
    assert caught.value.details["field"] == refused
    secrets = ("Hunter2", "AKIAIOSFODNN7EXAMPLE", "abcdef0123")
    assert all(secret not in str(caught.value) for secret in secrets)
