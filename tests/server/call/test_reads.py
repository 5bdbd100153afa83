"""A fan-out's answer is composed of each target's encoded text (gateway.server.call.reads.fan_out_answer):
plain values, no server."""

from __future__ import annotations

import json

from gateway.answer import Answer, encode_json
from gateway.server.call.reads import fan_out_answer


def test_a_fan_out_sends_a_mirrors_text_as_it_is_and_encodes_only_the_other_targets() -> None:
    # a text no second encoding would give (spaces): seen in the whole only if it was never re-encoded
    mirrored = Answer({"vms": [{"name": "a-1"}], "count": 1}, '{"vms": [{"name": "a-1"}], "count": 1}')
    swept = {"vms": [{"name": "b\u202e1"}], "count": 1}  # a bidi override: cleaned before it is sent
    refused = {"error": {"code": "policy_denied", "message": "no reads on c"}}
    whole = fan_out_answer({"a": {"ok": mirrored}, "b": {"ok": swept}, "c": refused})
    assert whole.text.startswith('{"a":{"ok":{"vms": [{"name": "a-1"}], "count": 1}},"b":{"ok":')
    assert json.loads(whole.text) == whole.value
    assert whole.value["a"] == {"ok": mirrored.value} and whole.value["c"] == refused
    assert whole.value["b"] == Answer.cleaned({"ok": swept}).value and "\u202e" not in whole.text
    assert whole.text.endswith(f',"c":{encode_json(refused)[0]}}}')
