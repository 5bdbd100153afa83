"""gateway.vsphere.collector: plain values from pyVmomi ones, paging, tokens, bounded inflation, specs."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from http.client import HTTPException
from typing import Any

import pytest
from pyVmomi import vim, vmodl

from gateway.vsphere.collector import (
    MAX_REPLY_BYTES,
    PAGE_OBJECTS,
    ReplyTooLarge,
    _decompress,
    _page_from_result,
    _plain,
    by_type,
    collect_pages,
    continuation_token,
    iso,
    object_spec,
    retrieve_options,
    traverse,
)
from gateway.vsphere.soap_scan import ComplexValueError, ObjectProps, Page

PC: Any = vmodl.query.PropertyCollector


@pytest.mark.parametrize(("value", "text"), [
    (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "2026-01-02T03:04:05+00:00"),
    (datetime(2026, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2))), "2026-01-02T03:04:05+00:00"),
    (None, None),
])
def test_iso_is_utc(value: datetime | None, text: str | None) -> None:
    assert iso(value) == text


# --------------------------------------------------------------------------- plain values


def test_a_reference_becomes_its_moid() -> None:
    assert _plain("runtime.host", vim.HostSystem("host-7")) == "host-7"


def test_a_list_of_references_becomes_moids() -> None:
    assert _plain("vm", [vim.VirtualMachine("vm-1"), vim.VirtualMachine("vm-2")]) == ["vm-1", "vm-2"]


@pytest.mark.parametrize("value", ["text", 5, 2.5, True, None, ["a", "b"]])
def test_scalars_stay_as_they_are(value: Any) -> None:
    assert _plain("p", value) == value


def test_a_naive_time_is_read_as_utc() -> None:
    assert _plain("config.createDate", datetime(2026, 1, 1, 12, 0)) == datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_an_aware_time_keeps_its_zone() -> None:
    zone = timezone(timedelta(hours=-5))
    assert _plain("t", datetime(2026, 1, 1, tzinfo=zone)).tzinfo is zone


def test_a_data_object_is_refused_when_strict() -> None:
    with pytest.raises(ComplexValueError, match="property 'config' holds a "):
        _plain("config", vim.vm.ConfigInfo())


def test_a_data_object_is_kept_when_not_strict() -> None:
    info = vim.vm.ConfigInfo()
    assert _plain("config", info, strict=False) is info
    assert _plain("configs", [info], strict=False) == [info]


def test_a_page_from_a_pyvmomi_result() -> None:
    result = PC.RetrieveResult(token="tok-1", objects=[
        PC.ObjectContent(obj=vim.VirtualMachine("vm-1"), propSet=[
            vmodl.DynamicProperty(name="name", val="web"),
            vmodl.DynamicProperty(name="runtime.host", val=vim.HostSystem("host-1")),
        ], missingSet=[PC.MissingProperty(path="guest.ipAddress", fault=vmodl.MethodFault())]),
        PC.ObjectContent(obj=vim.HostSystem("host-1"), propSet=[]),
    ])
    page = _page_from_result(result, _plain)
    assert page.token == "tok-1"
    assert page.objects == [
        ObjectProps("VirtualMachine", "vm-1", {"name": "web", "runtime.host": "host-1"},
                    ("guest.ipAddress",)),
        ObjectProps("HostSystem", "host-1", {}, ()),
    ]


def test_no_result_is_an_empty_last_page() -> None:
    assert _page_from_result(None, _plain) == Page([], None)


def test_an_empty_token_ends_the_paging() -> None:
    result = PC.RetrieveResult(token="", objects=[PC.ObjectContent(obj=vim.Folder("group-d1"))])
    page = _page_from_result(result, _plain)
    assert page.token is None and [o.moid for o in page.objects] == ["group-d1"]


# --------------------------------------------------------------------------- paging


def obj(moid: str) -> ObjectProps:
    return ObjectProps("VirtualMachine", moid, {})


class Pages:
    """Serves pages by token and records what was asked and cancelled."""

    def __init__(self, pages: dict[str, Page], fail_on: str | None = None) -> None:
        self.pages, self.fail_on = pages, fail_on
        self.asked: list[str] = []
        self.cancelled: list[str] = []

    def more(self, token: str) -> Page:
        self.asked.append(token)
        if token == self.fail_on:
            raise ConnectionResetError("the connection dropped")
        return self.pages[token]

    def cancel(self, token: str) -> None:
        self.cancelled.append(token)


def test_tokens_are_followed_to_the_end() -> None:
    pages = Pages({"t1": Page([obj("vm-2")], "t2"), "t2": Page([obj("vm-3")], None)})
    objects = collect_pages(Page([obj("vm-1")], "t1"), pages.more, pages.cancel)
    assert [o.moid for o in objects] == ["vm-1", "vm-2", "vm-3"]
    assert pages.asked == ["t1", "t2"] and pages.cancelled == []


def test_a_single_page_asks_for_nothing_more() -> None:
    pages = Pages({})
    assert [o.moid for o in collect_pages(Page([obj("vm-1")], None), pages.more, pages.cancel)] == ["vm-1"]
    assert pages.asked == []


def test_each_page_goes_to_the_sink_and_nothing_is_returned() -> None:
    seen: list[list[str]] = []
    pages = Pages({"t1": Page([obj("vm-2"), obj("vm-3")], None)})
    out = collect_pages(Page([obj("vm-1")], "t1"), pages.more, pages.cancel,
                        lambda page: seen.append([o.moid for o in page]))
    assert out == [] and seen == [["vm-1"], ["vm-2", "vm-3"]]


def test_a_failed_page_cancels_the_outstanding_token() -> None:
    pages = Pages({"t1": Page([obj("vm-2")], "t2")}, fail_on="t2")
    with pytest.raises(ConnectionResetError):
        collect_pages(Page([obj("vm-1")], "t1"), pages.more, pages.cancel)
    assert pages.cancelled == ["t2"]


def test_a_failing_sink_cancels_the_next_token() -> None:
    pages = Pages({})

    def sink(_page: list[ObjectProps]) -> None:
        raise RuntimeError("reader gave up")

    with pytest.raises(RuntimeError):
        collect_pages(Page([obj("vm-1")], "t1"), pages.more, pages.cancel, sink)
    assert pages.cancelled == ["t1"] and pages.asked == []


def test_a_failing_cancel_does_not_hide_the_error() -> None:
    def cancel(_token: str) -> None:
        raise OSError("gone too")

    pages = Pages({}, fail_on="t1")
    with pytest.raises(ConnectionResetError):
        collect_pages(Page([], "t1"), pages.more, cancel)


# --------------------------------------------------------------------------- reply bodies


@pytest.mark.parametrize(("body", "token"), [
    (b"<RetrievePropertiesExResponse><returnval><token>abc-1</token><objects/>", "abc-1"),
    (b"<returnval><objects/></returnval>", None),
    (b"<returnval><token></token>", None),
    (b"<returnval> <token>abc</token>", None),
    (b"x" * 5000 + b"<returnval><token>late</token>", None),
    (b"<returnval><token>" + b"a" * 513 + b"</token>", None),
])
def test_continuation_token(body: bytes, token: str | None) -> None:
    assert continuation_token(body) == token


def deflated(data: bytes) -> bytes:
    return zlib.compress(data)


@pytest.mark.parametrize(("encoding", "pack"), [("gzip", gzip.compress), ("deflate", deflated)])
def test_decompress_inflates(encoding: str, pack: Callable[[bytes], bytes]) -> None:
    assert _decompress(pack(b"<reply/>" * 100), encoding) == b"<reply/>" * 100


@pytest.mark.parametrize("encoding", ["", "identity", "br"])
def test_other_encodings_pass_through(encoding: str) -> None:
    assert _decompress(b"raw", encoding) == b"raw"


def test_a_bomb_stops_at_the_limit() -> None:
    with pytest.raises(ReplyTooLarge, match="the reply is larger than 1,000 bytes; list fewer objects"):
        _decompress(gzip.compress(b"\0" * 100_000), "gzip", limit=1000)


def test_exactly_the_limit_is_fine() -> None:
    assert len(_decompress(gzip.compress(b"a" * 1000), "gzip", limit=1000)) == 1000


def test_a_corrupt_body() -> None:
    with pytest.raises(HTTPException, match="the gzip reply is corrupt"):
        _decompress(b"not gzip at all", "gzip")


def test_a_body_cut_short() -> None:
    with pytest.raises(HTTPException, match="the deflate reply is cut short"):
        _decompress(deflated(b"abc" * 1000)[:20], "deflate")


def test_reply_too_large_is_an_http_failure() -> None:
    assert isinstance(ReplyTooLarge(MAX_REPLY_BYTES), HTTPException)


# --------------------------------------------------------------------------- specs


def test_retrievals_ask_for_pages_of_page_objects() -> None:
    assert retrieve_options().maxObjects == PAGE_OBJECTS == 1000


def test_by_type_groups_in_order() -> None:
    objects = [ObjectProps("A", "1", {}), ObjectProps("B", "2", {}), ObjectProps("A", "3", {})]
    groups = by_type(objects)
    assert list(groups) == ["A", "B"]
    assert [o.moid for o in groups["A"]] == ["1", "3"]
    assert by_type([]) == {}


def test_object_spec_reads_the_paths_of_each_type() -> None:
    vm = vim.VirtualMachine("vm-1")
    spec = object_spec(vm, {vim.VirtualMachine: ("name", "parent"), vim.Folder: ["name"]},
                       [traverse("up", vim.VirtualMachine, "parent", "again")])
    (start,) = spec.objectSet
    assert start.obj is vm and start.skip is False
    assert [s.name for s in start.selectSet] == ["up"]
    assert [(p.type, list(p.pathSet)) for p in spec.propSet] == [
        (vim.VirtualMachine, ["name", "parent"]), (vim.Folder, ["name"])]


def test_traverse_names_where_to_go_on() -> None:
    step = traverse("folderUp", vim.Folder, "parent", "folderUp", "dcUp")
    assert (step.name, step.type, step.path, step.skip) == ("folderUp", vim.Folder, "parent", False)
    assert [s.name for s in step.selectSet] == ["folderUp", "dcUp"]
