"""The reply decoder's refusals (gateway/vsphere/soap_scan.py): document types and entities, cut and
malformed replies, large replies (decoded the same by the scanner and ElementTree) and replies over
the size limit, read or inflated (collector.MAX_REPLY_BYTES).

The decoder's agreement table and its pyVmomi comparison live in tests/vsphere/test_inventory.py; here the
hostile replies. A simulator sends none of them, so the sweep test swaps the reply of a real session's
request for one (a fake target, named as such): the pool's translation is real.
"""

from __future__ import annotations

import gzip
import zlib
from datetime import UTC, datetime
from http.client import HTTPException
from typing import Any

import pytest
from support.decoders import assert_decoders_agree

from gateway import errors
from gateway.vsphere import collector, faults, listings, soap_scan
from gateway.vsphere.pool import SessionPool
from gateway.vsphere.soap_scan import MalformedReply, ObjectProps

_HEAD = ('<?xml version="1.0" encoding="UTF-8"?>{doctype}<soapenv:Envelope '
         'xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" '
         'xmlns:xsd="http://www.w3.org/2001/XMLSchema" '
         'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body>'
         '<RetrievePropertiesExResponse xmlns="urn:vim25"><returnval>')
_TAIL = '</returnval></RetrievePropertiesExResponse></soapenv:Body></soapenv:Envelope>'


def _vm(moid: str, name: str, cpus: int = 1) -> str:
    return (f'<objects><obj type="VirtualMachine">{moid}</obj>'
            f'<propSet><name>name</name><val xsi:type="xsd:string">{name}</val></propSet>'
            f'<propSet><name>config.hardware.numCPU</name><val xsi:type="xsd:int">{cpus}</val></propSet>'
            '</objects>')


def _reply(objects: str, doctype: str = "") -> bytes:
    return (_HEAD.format(doctype=doctype) + objects + _TAIL).encode()


_LAUGHS = ('<!DOCTYPE soapenv:Envelope [<!ENTITY a "ha">'  # i expands to 2 * 10**8 characters
           + "".join(f'<!ENTITY {chr(ord(a) + 1)} "{("&" + a + ";") * 10}">' for a in "abcdefgh") + "]>")
_HOSTILE = {
    "billion laughs": _reply(_vm("vm-1", "&i;"), _LAUGHS),
    "external entity": _reply(_vm("vm-1", "&x;"), '<!DOCTYPE e [<!ENTITY x SYSTEM "file:///etc/passwd">]>'),
    "parameter entity": _reply(_vm("vm-1", "a"), '<!DOCTYPE e [<!ENTITY % p SYSTEM "http://127.0.0.1:9/x">%p;]>'),
    "document type alone": _reply(_vm("vm-1", "a"), "<!DOCTYPE soapenv:Envelope>"),
}


@pytest.mark.parametrize("name", list(_HOSTILE))
def test_document_types_are_refused_before_any_entity_is_expanded(name: str) -> None:
    with pytest.raises(MalformedReply, match="document type"):
        soap_scan.parse_retrieve_result(_HOSTILE[name])
    with pytest.raises(MalformedReply, match="document type"):
        soap_scan.parse_retrieve_tree(_HOSTILE[name])


def test_a_reply_cut_anywhere_is_malformed_never_a_shorter_page() -> None:
    body = _reply(_vm("vm-1", "a") + _vm("vm-2", "b") + _vm("vm-3", "c"))
    assert len(soap_scan.parse_retrieve_result(body).objects) == 3
    for cut in range(len(body) - 1, 0, -7):
        with pytest.raises(MalformedReply, match="not well-formed"):
            soap_scan.parse_retrieve_result(body[:cut])


@pytest.mark.parametrize("body", [b"", b"<html>502 Bad Gateway</html", b"\xff\xfe<x/>", b"not xml at all"])
def test_garbage_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedReply):
        soap_scan.parse_retrieve_result(body)


def test_malformed_replies_become_a_typed_unreachable_error() -> None:
    for body in (_HOSTILE["billion laughs"], _reply(_vm("vm-1", "a"))[:-20]):
        try:
            soap_scan.parse_retrieve_result(body)
        except MalformedReply as exc:
            error = faults.translate(exc, "vc1")
        assert isinstance(error, errors.Unreachable)
        assert error.code == "unreachable" and "malformed XML" in error.message and "vc1" in error.message


def test_a_large_reply_is_decoded_by_the_scanner_as_elementtree_does() -> None:
    body = _reply("".join(_vm(f"vm-{i}", f"web-{i:05d}", i % 64) for i in range(30_000)))
    before = soap_scan.DECODER.fallbacks
    scanned = soap_scan.parse_retrieve_result(body)
    assert soap_scan.DECODER.fallbacks == before  # the fast path took it
    assert scanned == soap_scan.parse_retrieve_tree(body)
    assert len(scanned.objects) == 30_000
    assert scanned.objects[-1] == ObjectProps("VirtualMachine", "vm-29999",
                                              {"name": "web-29999", "config.hardware.numCPU": 29999 % 64})


def test_a_sweep_answered_with_entities_fails_closed_as_unreachable(
        vc1: SessionPool, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    real_reply = collector._Call.reply

    def fake_hostile_target(call: Any, limit: int = collector.MAX_REPLY_BYTES) -> bytes:
        """A fake target: the real request is sent and its real reply read, then replaced by one
        declaring entities."""
        real_reply(call, limit)
        sent.append(call.info.wsdlName)
        return _HOSTILE["billion laughs"]

    monkeypatch.setattr(collector._Call, "reply", fake_hostile_target)
    with pytest.raises(errors.Unreachable, match="malformed XML"):
        vc1.run(lambda s: listings.list_vms(s, listings.VmQuery()))
    assert sent == ["RetrievePropertiesEx"]
    monkeypatch.undo()
    assert vc1.run(lambda s: listings.list_vms(s, listings.VmQuery()))["count"] == 4  # the session is fine


def test_a_gzip_bomb_stops_at_the_limit_and_a_cut_or_corrupt_one_is_an_http_failure() -> None:
    bomb = gzip.compress(b"\0" * 5_000_000)
    assert len(bomb) < 10_000
    with pytest.raises(collector.ReplyTooLarge, match="larger than 1,000,000 bytes"):
        collector._decompress(bomb, "gzip", limit=1_000_000)
    assert collector._decompress(bomb, "gzip", limit=5_000_000) == b"\0" * 5_000_000
    assert collector._decompress(zlib.compress(b"abc"), "deflate") == b"abc"
    for broken in (bomb[: len(bomb) // 2], b"not gzip at all"):
        with pytest.raises(HTTPException):
            collector._decompress(broken, "gzip")
    translated = faults.translate(collector.ReplyTooLarge(10), "vc1")
    assert isinstance(translated, errors.Unreachable) and "larger than 10 bytes" in translated.message


def test_a_reply_over_the_limit_fails_the_sweep_and_leaves_the_session_usable(
        vc1: SessionPool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collector, "MAX_REPLY_BYTES", 2_000)
    with pytest.raises(errors.Unreachable, match="larger than 2,000 bytes"):
        vc1.run(lambda s: listings.list_vms(s, listings.VmQuery()))
    monkeypatch.undo()
    assert vc1.run(lambda s: listings.list_vms(s, listings.VmQuery()))["count"] == 4


# Replies of many objects: after the first object of a shape, the scanner reads objects of that shape
# with a pattern compiled for it (soap_scan._Shape). Each must decode exactly as ElementTree does, or be
# left to it / refused alike, whatever changes from one object to the next.
def _prop(name: str, value: str, kind: str = "xsd:string") -> str:
    return f'<propSet><name>{name}</name><val xsi:type="{kind}">{value}</val></propSet>'


def _obj(moid: str, props: str, kind: str = "VirtualMachine") -> str:
    return f'<objects><obj type="{kind}">{moid}</obj>{props}</objects>'


def _later(name: str, value: str, kind: str = "xsd:string") -> str:
    """Five objects of one shape, then one whose name is ``value`` (of ``kind``)."""
    return _same_shape(5) + _obj("vm-x", _prop("name", value, kind) + _prop("n", "1", "xsd:int"))


def _same_shape(count: int, value: Any = "1") -> str:
    return "".join(_obj(f"vm-{i}", _prop("name", f"web-{i}") + _prop("n", str(value), "xsd:int"))
                   for i in range(count))


_MANY = {
    "one shape": _reply(_same_shape(50)),
    "shapes alternating": _reply("".join(
        _obj(f"vm-{i}", _prop("name", f"v{i}")) + _obj(f"host-{i}", _prop("name", f"h{i}"), "HostSystem")
        for i in range(20))),
    "a property missing on some objects": _reply("".join(
        _obj(f"vm-{i}", _prop("name", f"v{i}") + (_prop("ip", "10.0.0.1") if i % 3 else ""))
        for i in range(20))),
    "the same name with another type": _reply(_same_shape(3)
                                              + _obj("vm-9", _prop("name", "x") + _prop("n", "7"))),
    "more shapes than compiled": _reply("".join(
        _obj(f"vm-{i}", _prop(f"p{i // 2}", str(i), "xsd:int")) for i in range(80))),  # 40 shapes, in pairs
    "a repeated property name": _reply("".join(
        _obj(f"vm-{i}", _prop("n", str(i), "xsd:int") + _prop("n", f"s{i}")) for i in range(5))),
    "empty arrays and dates": _reply("".join(
        _obj(f"vm-{i}", _prop("e", "", "ArrayOfString") + _prop("d", "2024-05-01T10:00:00Z", "xsd:dateTime")
             + _prop("b", "true", "xsd:boolean")) for i in range(5))),
    "objects without properties": _reply("".join(_obj(f"vm-{i}", "") for i in range(5))),
    # a shape's reader is generated code: what a reply names its properties stays data
    "names that read as code": _reply("".join(
        _obj(f"vm-{i}", _prop('n0}); __import__("os")._exit(3) #', str(i), "xsd:int") + _prop("n0", "x'"))
        for i in range(5))),
    "a later value that is not a number": _reply(_same_shape(5) + _same_shape(1, "seven")),
    "a later control character": _reply(_later("name", "a\x01b")),
    "a later control character, not ASCII": _reply(_later("name", "wé\x1fb")),
    "not ASCII": _reply(_later("name", "wéb\u202e")),
    "a later reference": _reply(_later("name", "a &amp; b")),
    "a later CDATA section": _reply(_later("name", "<![CDATA[x]]>")),
    "a later object with a data object": _reply(_later("name", "<a>b</a>", "VirtualMachineSummary")),
    "a document type": _reply(_same_shape(5), "<!DOCTYPE soapenv:Envelope>"),
    "garbage after the objects": _reply(_same_shape(5) + "<x/>"),
}
_MANY_SCANNED = {"one shape", "shapes alternating", "a property missing on some objects",
                 "the same name with another type", "more shapes than compiled", "a repeated property name",
                 "empty arrays and dates", "objects without properties", "a later reference", "not ASCII",
                 "names that read as code"}


@pytest.mark.parametrize("name", list(_MANY))
def test_objects_of_a_seen_shape_decode_as_elementtree_does(name: str) -> None:
    body = _MANY[name]
    assert_decoders_agree(body, scanned=name in _MANY_SCANNED)
    for cut in range(len(body) - 1, len(body) // 2, -13):  # cut inside later objects: refused, never shorter
        with pytest.raises(MalformedReply):
            soap_scan.parse_retrieve_result(body[:cut])


def test_a_seen_shape_reads_typed_values_and_keeps_every_object() -> None:
    page = soap_scan.scan_retrieve_result(_MANY["empty arrays and dates"])
    assert page is not None and len(page.objects) == 5
    assert page.objects[4] == ObjectProps("VirtualMachine", "vm-4", {
        "e": [], "d": datetime(2024, 5, 1, 10, tzinfo=UTC), "b": True})
    repeated = soap_scan.scan_retrieve_result(_MANY["a repeated property name"])
    assert repeated is not None and [o.props for o in repeated.objects][3] == {"n": "s3"}
