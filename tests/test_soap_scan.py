"""The reply decoder's refusals (gateway/vsphere/soap_scan.py): document types and entities, cut and
malformed replies, large replies (decoded the same by the scanner and ElementTree) and replies over
the size limit, read or inflated (collector.MAX_REPLY_BYTES).

The decoder's agreement table and its pyVmomi comparison live in tests/test_inventory.py; here the
hostile replies. A simulator sends none of them, so the sweep test swaps ``collector.soap_call`` for a
fake that answers a real session's request with one (named as such): the pool's translation is real.
"""

from __future__ import annotations

import gzip
import zlib
from http.client import HTTPException
from typing import Any

import pytest

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
    real_call = collector.soap_call

    def fake_hostile_target(stub: Any, mo: Any, method: str, args: Any) -> bytes:
        """A fake target: the real request is sent, the reply replaced by one declaring entities."""
        real_call(stub, mo, method, args)
        sent.append(method)
        return _HOSTILE["billion laughs"]

    monkeypatch.setattr(collector, "soap_call", fake_hostile_target)
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
