"""The audit row's size bounds (``gateway.audit.bounds.bounded``): long strings cut to prefix, size and
digest; containers to their first items and levels; one budget of text per row; redaction first."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gateway.audit.bounds import (
    CUT_KEEP_CHARS,
    MAX_BOUNDED_DEPTH,
    MAX_ITEMS,
    MAX_ROW_CHARS,
    MAX_STRING_CHARS,
    bounded,
)
from gateway.audit.redact import MASK, MORE_ITEMS, TOO_DEEP


@pytest.mark.parametrize("value", [None, True, False, 0, -7, 2**70, 1.5, "", "web1", "x" * MAX_STRING_CHARS])
def test_small_plain_values_are_kept_as_they_are(value: Any) -> None:
    assert bounded(value) == value


@pytest.mark.parametrize("length", [MAX_STRING_CHARS + 1, 5000, 100_000])
def test_a_long_string_becomes_its_prefix_size_and_digest(length: int) -> None:
    text = "a" * length
    assert bounded(text) == {"cut": "a" * CUT_KEEP_CHARS, "size": length,
                             "sha256": hashlib.sha256(text.encode()).hexdigest()}


def test_the_size_of_a_cut_string_counts_utf8_bytes() -> None:
    text = "é" * (MAX_STRING_CHARS + 1)
    cut = bounded(text)
    assert cut["size"] == 2 * len(text)
    assert cut["cut"] == "é" * CUT_KEEP_CHARS


def test_secrets_are_masked_before_anything_is_kept() -> None:
    assert bounded({"password": "hunter2", "vm": "web1"}) == {"password": MASK, "vm": "web1"}


def test_the_digest_of_a_cut_string_is_of_the_redacted_text() -> None:
    text = "password=hunter2 " + "x" * MAX_STRING_CHARS
    cut = bounded(text)
    assert "hunter2" not in cut["cut"]
    assert cut["sha256"] != hashlib.sha256(text.encode()).hexdigest()


def test_a_list_keeps_its_first_items_and_says_how_many_more() -> None:
    value = list(range(MAX_ITEMS + 25))
    assert bounded(value) == [*range(MAX_ITEMS), {MORE_ITEMS: 25}]


def test_a_list_of_exactly_max_items_is_whole() -> None:
    assert bounded(list(range(MAX_ITEMS))) == list(range(MAX_ITEMS))


def test_a_mapping_keeps_its_first_items_and_a_more_items_key() -> None:
    value = {f"k{i}": i for i in range(MAX_ITEMS + 3)}
    out = bounded(value)
    assert len(out) == MAX_ITEMS + 1
    assert out[MORE_ITEMS] == 3
    assert list(out)[:MAX_ITEMS] == [f"k{i}" for i in range(MAX_ITEMS)]


def _nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


def test_nesting_up_to_the_depth_limit_is_kept() -> None:
    assert bounded(_nested(MAX_BOUNDED_DEPTH)) == _nested(MAX_BOUNDED_DEPTH)


def test_nesting_past_the_depth_limit_becomes_a_marker() -> None:
    out = bounded(_nested(MAX_BOUNDED_DEPTH + 3))
    for _ in range(MAX_BOUNDED_DEPTH):
        out = out[0]
    assert out == TOO_DEEP


def test_one_row_keeps_at_most_the_row_budget_of_text() -> None:
    strings = ["s" * MAX_STRING_CHARS for _ in range(40)]
    out = bounded(strings)
    kept = [s for s in out if isinstance(s, str)]
    cut = [s for s in out if isinstance(s, dict)]
    assert sum(len(s) for s in kept) <= MAX_ROW_CHARS
    assert len(kept) == MAX_ROW_CHARS // MAX_STRING_CHARS
    assert cut and all(c["size"] == MAX_STRING_CHARS for c in cut)


def test_once_the_budget_is_spent_strings_keep_only_size_and_digest() -> None:
    strings = ["s" * MAX_STRING_CHARS for _ in range(40)] + ["tail"]
    last = bounded(strings)[-1]
    assert last == {"cut": "", "size": 4, "sha256": hashlib.sha256(b"tail").hexdigest()}


def test_a_short_key_is_kept() -> None:
    key = "k" * CUT_KEEP_CHARS
    assert list(bounded({key: 1})) == [key]


def test_a_long_key_keeps_its_start_and_a_digest() -> None:
    key = "k" * 300
    (out,) = bounded({key: 1})
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    assert out == f"{'k' * CUT_KEEP_CHARS}...sha256:{digest}"


def test_two_long_keys_with_one_prefix_stay_distinct() -> None:
    out = bounded({"k" * 200 + "a": 1, "k" * 200 + "b": 2})
    assert len(out) == 2


@pytest.mark.parametrize(("text", "stored"), [("a\x00b", "a\\u0000b"), ("x\ud800y", "x\\ud800y")])
def test_nul_and_lone_surrogates_are_escaped(text: str, stored: str) -> None:
    assert bounded(text) == stored
    assert bounded({text: 1}) == {stored: 1}


def test_tuples_and_sets_become_lists() -> None:
    assert bounded((1, 2)) == [1, 2]
    assert bounded({"a": frozenset({3})}) == {"a": [3]}


def test_non_finite_floats_become_text() -> None:
    assert bounded([float("inf"), float("nan")]) == ["inf", "nan"]
