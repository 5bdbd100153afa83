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
