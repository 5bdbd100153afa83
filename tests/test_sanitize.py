"""Text from vSphere made safe for a model: hidden characters escaped visibly, length bounded."""

from __future__ import annotations

import random
import sys
import unicodedata
from datetime import UTC, datetime
from typing import Any

import pytest
from support.gateway_env import HUMAN, VM0, Env

from gateway.sanitize import _long_run, _may_hold_long_run, clean, clean_text

HIDDEN = {"Cc", "Cf", "Cs", "Zl", "Zp"}

CASES = [
    # id, input, expected
    ("plain", "web-01 (prod)", "web-01 (prod)"),
    ("newline-and-tab-kept", "line 1\n\tline 2", "line 1\n\tline 2"),
    ("crlf-to-lf", "a\r\nb", "a\nb"),
    ("lone-cr", "ok\rEVIL", "ok\\u000dEVIL"),
    ("nul", "a\x00b", "a\\u0000b"),
    ("ansi-escape", "\x1b[31mred", "\\u001b[31mred"),
    ("del", "a\x7f", "a\\u007f"),
    ("c1-control", "a\x85b", "a\\u0085b"),
    ("bidi-override", "invoice\u202egnp.exe", "invoice\\u202egnp.exe"),
    ("bidi-isolate", "\u2066x\u2069", "\\u2066x\\u2069"),
    ("zero-width-space", "web\u200b1", "web\\u200b1"),
    ("zero-width-joiner", "a\u200db", "a\\u200db"),
    ("bom", "\ufeffname", "\\ufeffname"),
    ("soft-hyphen", "pass\u00adword", "pass\\u00adword"),
    ("tag-characters", "hi\U000e0041\U000e0042", "hi\\U000e0041\\U000e0042"),
    ("line-separator", "a\u2028b\u2029c", "a\\u2028b\\u2029c"),
    ("lone-surrogate", "a\ud800b", "a\\ud800b"),
    ("single-variation-selector-kept", "\u2764\ufe0f", "\u2764\ufe0f"),
    ("variation-selector-run", "a\ufe00\ufe01\ufe02", "a\ufe00\\ufe01\\ufe02"),
    ("variation-selector-supplement", "a\U000e0100", "a\\U000e0100"),
    ("unicode-kept-unnormalised", "Ü-日本-\uff57\uff45\uff42-\ufb01", "Ü-日本-\uff57\uff45\uff42-\ufb01"),
    ("decomposed-kept", "e\u0301", "e\u0301"),
    ("nbsp-kept", "a\u00a0b", "a\u00a0b"),
]


@pytest.mark.parametrize(("value", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_clean_text(value: str, expected: str) -> None:
    assert clean_text(value) == expected


def test_distinct_names_stay_distinct() -> None:
    assert clean_text("web\u200b1") != clean_text("web1")


def test_printable_ascii_is_returned_as_is() -> None:
    value = "".join(chr(c) for c in range(0x20, 0x7F)) * 3
    assert clean_text(value) is value


def test_no_hidden_character_survives() -> None:
    every = "".join(chr(c) for c in range(sys.maxunicode + 1))
    out = clean_text(every, max_len=20 * len(every))
    assert not out.endswith("chars]")
    survivors = {unicodedata.category(ch) for ch in out if ch not in "\n\t"}
    assert not survivors & HIDDEN


@pytest.mark.parametrize(("value", "max_len", "expected"), [
    ("a" * 1024, 1024, "a" * 1024),
    ("a" * 2000, 1024, "a" * (1024 - 24) + "…[truncated, 2000 chars]"),
    ("abcdefghij", 4, "abc…"),
    ("abcdefghij", 0, ""),
    ("\x00" * 10, 20, "\\u0000\\u0000\\u0000\\…"),  # the escaped text is what is bounded
])
def test_length_is_bounded(value: str, max_len: int, expected: str) -> None:
    out = clean_text(value, max_len)
    assert out == expected and len(out) <= max_len


def test_default_bound() -> None:
    assert len(clean_text("x" * 100_000)) == 1024
    assert clean_text("x" * 100_000).endswith("…[truncated, 100000 chars]")


def test_clean_nested_structures() -> None:
    value: Any = {
        "name\u202e": ["web\u200b1", ("a\x00", 3), {"deep": "\U000e0041"}],
        "count": 7, "on": True, "none": None, "ratio": 0.5,
    }
    assert clean(value) == {
        "name\\u202e": ["web\\u200b1", ("a\\u0000", 3), {"deep": "\\U000e0041"}],
        "count": 7, "on": True, "none": None, "ratio": 0.5,
    }


def test_clean_bounds_every_string() -> None:
    out = clean({"k" * 50: ["v" * 50]}, max_len=10)
    ((key, values),) = out.items()
    assert len(key) == 10 and len(values[0]) == 10


def test_clean_leaves_plain_rows_equal() -> None:
    rows = [{"name": f"vm-{i}", "power_state": "poweredOn", "cpu": 2, "tags": ["a"]} for i in range(1000)]
    assert clean(rows) == rows


def _string_by_string(value: Any, max_len: int) -> Any:
    """What clean means, spelled out: clean_text on every string, containers rebuilt."""
    if isinstance(value, str):
        return clean_text(value, max_len)
    if isinstance(value, dict):
        return {_string_by_string(k, max_len): _string_by_string(v, max_len) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_string_by_string(v, max_len) for v in value)
    return value


_WHEN = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize("needle", [
    pytest.param(s, id=name) for name, s, _ in CASES
] + [
    pytest.param("x" * 16, id="exactly-max-len"), pytest.param("x" * 17, id="one-over-max-len"),
    pytest.param('say "hi"', id="quote"), pytest.param("back\\slash", id="backslash"),
])
@pytest.mark.parametrize("place", ["value", "key", "deep-in-tuple"])
def test_one_string_deep_in_plain_rows_is_cleaned_like_any_other(needle: str, place: str) -> None:
    rows: list[Any] = [{"name": f"vm-{i}", "n": i, "on": None, "at": _WHEN, "set": {"a"}} for i in range(50)]
    target = rows[37]
    if place == "value":
        target["name"] = needle
    elif place == "key":
        target[needle] = 1
    else:
        target["pair"] = ("plain", [needle])
    value = {"vms": rows, "count": 50}
    assert clean(value, max_len=16) == _string_by_string(value, 16)


def test_plain_rows_come_back_as_they_are() -> None:
    rows = [{"name": f"vm-{i}", "power_state": "poweredOn", "at": _WHEN, 7: [1.5, None]} for i in range(100)]
    assert clean(rows) is rows
    tricky: Any = {"k": ({"a": "b"},), ("tuple", "key"): "v"}  # a key JSON cannot encode: the slow path
    assert clean(tricky) == tricky and clean(tricky) is not tricky


def _texts_with_runs() -> list[tuple[str, int]]:
    """Texts of quotes and letters whose quote-free runs fall on every side of a tile's edges."""
    rng = random.Random(7)
    cases = [("", 4), ('"', 4), ("x" * 5, 4), ("x" * 4, 4), ('"' + "x" * 5, 4), ("x" * 9 + '"', 8)]
    for _ in range(400):
        max_len = rng.choice([1, 2, 3, 8, 16, 31])
        runs = range(rng.randrange(12))
        pieces = [rng.choice(['"', "x" * rng.randrange(0, 2 * max_len + 3)]) for _ in runs]
        cases.append(("".join(pieces), max_len))
    return cases


def test_the_tile_check_agrees_with_the_long_run_expression() -> None:
    """``encoded_is_clean`` looks for strings over ``max_len`` tile by tile before it uses the regular
    expression: the two answers are always the same."""
    for text, max_len in _texts_with_runs():
        expected = _long_run(max_len).search(text) is not None
        assert _may_hold_long_run(text, max_len) is expected, (text, max_len)


# ---------------------------------------------------------------- proposals and pending lists


@pytest.mark.anyio
async def test_proposals_and_pending_lists_carry_no_hidden_characters(env: Env) -> None:
    from support.simulator import find_vm, pyvmomi_connect, read_properties, wait_until

    from gateway.server.proposals.views import proposal_view

    sneaky = "DC0_C0_RP0_VM0\u202etxt.exe\u200b"
    si = pyvmomi_connect(env.sim)
    task = find_vm(si, VM0).Rename_Task(newName=sneaky)
    wait_until(lambda: read_properties(si, task, "info.state")["info.state"] in ("success", "error"))
    gw = env.build()
    proposal = await gw.calls.call(HUMAN, "delete_vm",
                                   {"target": "vc1", "vm": sneaky, "force_power_off": True})
    listed = (await gw.calls.call(HUMAN, "list_pending_actions", {}))["pending"]
    stored = gw.store.get_proposal(proposal["proposal_id"])
    assert stored is not None
    shown = [proposal["summary"], proposal["affected"], listed, proposal_view(stored, gw.clock())]
    for text in map(str, shown):
        assert "\u202e" not in text and "\u200b" not in text
    assert "txt.exe" in proposal["summary"], "the name is still there, its hidden characters made visible"
