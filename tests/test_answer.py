"""gateway.answer: a tool's result encoded once; the text is always the encoding of the value."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import orjson
import pytest

from gateway.answer import Answer, encode_json


def _encoded(value: object) -> str:
    return encode_json(value)[0]


def test_an_answer_is_compact_utf8_json_in_the_tool_s_key_order() -> None:
    answer = Answer.cleaned({"vms": [{"name": "wéb", "cpu": 2}], "count": 1})
    assert answer.text == '{"vms":[{"name":"wéb","cpu":2}],"count":1}'
    assert answer.data == answer.text.encode("utf-8")


def test_a_value_json_cannot_hold_is_sent_as_text_and_read_back_the_same() -> None:
    answer = Answer.cleaned({"at": datetime(2026, 12, 1, tzinfo=UTC)})
    assert answer.value == {"at": "2026-12-01 00:00:00+00:00"} == json.loads(answer.text)


def test_a_string_the_model_should_not_see_raw_is_cleaned_in_value_and_text() -> None:
    answer = Answer.cleaned({"name": "vm\x1b[31m"})
    assert "\x1b" not in answer.text and json.loads(answer.text) == answer.value
    assert answer.value["name"] != "vm\x1b[31m"


@pytest.mark.parametrize("item", [0.125, 3, "two words", None])
def test_a_field_added_is_appended_to_the_text_as_its_encoding(item: object) -> None:
    base = Answer.cleaned({"vms": [{"name": "a"}], "count": 1})
    added = base.with_field("mirror_age_seconds", item)
    assert added.value == {"vms": [{"name": "a"}], "count": 1, "mirror_age_seconds": item}
    assert added.text == _encoded(added.value)
    assert "mirror_age_seconds" not in base.value, "the answer it came from is unchanged"


@pytest.mark.parametrize("value", [{}, {"mirror_age_seconds": 1.0}])
def test_a_field_on_an_empty_answer_or_over_an_existing_key_is_encoded_again(
    value: dict[str, object],
) -> None:
    added = Answer.cleaned(value).with_field("mirror_age_seconds", 2.5)
    assert added.value == {"mirror_age_seconds": 2.5} and added.text == _encoded(added.value)


def test_a_copy_shares_the_text_not_the_value() -> None:
    base = Answer.cleaned({"count": 1})
    copy = base.copy()
    copy.value["count"] = 2
    assert base.value == {"count": 1} and copy.text is base.text


def test_a_composed_answer_keeps_each_parts_text_and_its_text_is_its_values_encoding() -> None:
    part = Answer.cleaned({"vms": [{"name": "wéb-1", "n": 1}], "count": 1})
    whole = Answer.composed({"kind": "vms", "targets": part})
    assert part.text in whole.text  # the part's text as it is: not decoded, not encoded again
    assert whole.text == encode_json(whole.value)[0]
    assert whole.value == {"kind": "vms", "targets": part.value}


def _of_text(text: str) -> tuple[tuple[str, int], bytes | None]:
    """What an answer of ``text`` must give: its fingerprint (sha256 and length of its bytes) and its
    JSON string (None for text orjson cannot encode, a lone surrogate)."""
    data = text.encode("utf-8", "surrogatepass")
    try:
        encoded: bytes | None = orjson.dumps(text)
    except TypeError:
        encoded = None
    return (hashlib.sha256(data).hexdigest(), len(data)), encoded


@pytest.mark.parametrize("value", [{"vms": [{"name": "wéb"}], "count": 1}, {"name": "\ud800 lone"}])
def test_an_answers_fingerprint_and_json_string_are_of_its_text(value: dict[str, object]) -> None:
    answer = Answer.of(value)
    fingerprint, expected = _of_text(answer.text)
    assert answer.fingerprint() == fingerprint
    assert answer.json_string() == expected


@pytest.mark.parametrize("text", ["plain", "quote \" and \\ and \n", "wéb", "\ud800 lone surrogate"])
def test_a_field_added_has_the_fingerprint_and_json_string_of_its_whole_text(text: str) -> None:
    base = Answer.of({"vms": [{"name": text}], "count": 1})
    for item in (0.125, 3.5):
        added = base.copy().with_field("mirror_age_seconds", item)
        fingerprint, expected = _of_text(added.text)
        assert added.fingerprint() == fingerprint
        assert added.json_string() == expected
        assert json.loads(added.json_string() or b'""') == (added.text if expected else "")


def test_answers_made_of_a_kept_answer_hash_its_text_once() -> None:
    """A mirror's kept answer is sent with a new ``mirror_age_seconds`` each time: the kept text is hashed
    once (its digest before the closing brace, kept with it and its copies), each answer hashes only its
    own tail."""
    kept = Answer.of({"vms": [{"name": "a"}] * 100, "count": 100})
    kept.copy().with_field("mirror_age_seconds", 0.5).fingerprint()
    open_digest = kept.derived.get("open_digest")
    assert open_digest is not None, "the kept answer's digest is kept with it"
    kept.copy().with_field("mirror_age_seconds", 0.75).fingerprint()
    assert kept.derived["open_digest"] is open_digest, "and not made again"
