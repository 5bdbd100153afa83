"""gateway.vsphere.actions.snapshots: the snapshots a delete with children reaches, and how each is shown."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.vocabulary import AffectedObject
from gateway.vsphere.actions.snapshots import _descendants, _snapshot_affected


def row(moid: str, parent: str | None, name: str | None = None) -> dict[str, Any]:
    return {"moid": moid, "name": name or moid, "parent": parent}


#: s1 -> (s2 -> s3, s4), s5 (a second root)
ROWS = [row("s1", None), row("s2", "s1"), row("s3", "s2"), row("s4", "s1"), row("s5", None)]


@pytest.mark.parametrize(("moid", "below"), [
    ("s1", ["s2", "s3", "s4"]),
    ("s2", ["s3"]),
    ("s3", []),
    ("s5", []),
    ("missing", []),
])
def test_descendants_depth_first(moid: str, below: list[str]) -> None:
    assert [r["moid"] for r in _descendants(ROWS, moid)] == below


def test_no_rows_no_descendants() -> None:
    assert _descendants([], "s1") == []


def test_a_snapshot_is_affected_by_name_and_moid() -> None:
    assert _snapshot_affected(row("snapshot-7", None, "before upgrade")) == AffectedObject(
        "snapshot", "before upgrade", "snapshot-7")
