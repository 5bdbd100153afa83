"""Inventory reads and resolution: the reply decoder and filters on plain values, the rest against the
simulator over real SOAP (sweeps, request counts, resolution, list and detail reads)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pyVim.connect import Disconnect
from pyVmomi import vim
from support.decoders import assert_decoders_agree, outcome
from support.simulator import (
    MakeSimulator,
    Simulator,
    find_vm,
    logged,
    open_pool,
    pyvmomi_connect,
    wait_task,
)

from gateway import errors
from gateway.vsphere import access, collector, details, listings, resolve, soap_scan
from gateway.vsphere.listings import VmQuery
from gateway.vsphere.pool import SessionPool, VSphereSession
from gateway.vsphere.soap_scan import ObjectProps, Page

# --------------------------------------------------------------------------------------------------
# helpers


# --------------------------------------------------------------------------------------------------
# the reply decoder (plain values)

_ENVELOPE = (
    '<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/'
    'envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-'
    'instance"><soapenv:Body>{body}</soapenv:Body></soapenv:Envelope>'
)


def reply(body: str) -> bytes:
    return _ENVELOPE.format(body=body).encode()


def test_decoder_reads_scalars_references_arrays_and_missing_paths() -> None:
    body = (
        '<RetrievePropertiesExResponse xmlns="urn:vim25"><returnval><token>page-2</token><objects>'
        '<obj type="VirtualMachine">vm-7</obj>'
        '<propSet><name>name</name><val xsi:type="xsd:string">web &amp; db</val></propSet>'
        '<propSet><name>config.hardware.numCPU</name><val xsi:type="xsd:int">4</val></propSet>'
        '<propSet><name>summary.storage.committed</name><val xsi:type="xsd:long">123456789012</val></propSet>'
        '<propSet><name>config.template</name><val xsi:type="xsd:boolean">false</val></propSet>'
        '<propSet><name>config.createDate</name><val xsi:type="xsd:dateTime">2024-05-01T10:00:00.123456789Z'
        '</val></propSet>'
        '<propSet><name>runtime.powerState</name><val xsi:type="VirtualMachinePowerState">poweredOff</val>'
        '</propSet>'
        '<propSet><name>runtime.host</name><val type="HostSystem" xsi:type="ManagedObjectReference">host-9'
        '</val></propSet>'
        '<propSet><name>datastore</name><val xsi:type="ArrayOfManagedObjectReference">'
        '<ManagedObjectReference type="Datastore">datastore-1</ManagedObjectReference>'
        '<ManagedObjectReference type="Datastore">datastore-2</ManagedObjectReference></val></propSet>'
        '<propSet><name>guest.ipAddress</name><val xsi:type="xsd:string"></val></propSet>'
        '<missingSet><path>guest.customizationInfo</path><fault xsi:type="InvalidProperty"><name>x</name>'
        '</fault></missingSet></objects></returnval></RetrievePropertiesExResponse>'
    )
    page = soap_scan.parse_retrieve_result(reply(body))
    assert page.token == "page-2"
    [vm] = page.objects
    assert (vm.type, vm.moid, vm.missing) == ("VirtualMachine", "vm-7", ("guest.customizationInfo",))
    assert vm.props == {
        "name": "web & db", "config.hardware.numCPU": 4, "summary.storage.committed": 123456789012,
        "config.template": False, "config.createDate": datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC),
        "runtime.powerState": "poweredOff", "runtime.host": "host-9",
        "datastore": ["datastore-1", "datastore-2"], "guest.ipAddress": "",
    }


def test_decoder_answers_empty_replies_and_refuses_data_objects() -> None:
    empty = reply('<RetrievePropertiesExResponse xmlns="urn:vim25"/>')
    assert soap_scan.parse_retrieve_result(empty) == Page([], None)
    complex_value = (
        '<RetrievePropertiesExResponse xmlns="urn:vim25"><returnval><objects>'
        '<obj type="VirtualMachine">vm-1</obj><propSet><name>summary</name>'
        '<val xsi:type="VirtualMachineSummary"><overallStatus>green</overallStatus></val></propSet>'
        '</objects></returnval></RetrievePropertiesExResponse>'
    )
    with pytest.raises(soap_scan.ComplexValueError, match="summary"):
        soap_scan.parse_retrieve_result(reply(complex_value))


def _objects(props: dict[str, str] | None = None, moid: str = "vm-1", kind: str = "VirtualMachine",
             more: str = "") -> str:
    sets = "".join(f"<propSet><name>{name}</name>{val}</propSet>" for name, val in (props or {}).items())
    return f'<objects><obj type="{kind}">{moid}</obj>{sets}{more}</objects>'


def _returnval(inner: str, response_attrs: str = ' xmlns="urn:vim25"') -> bytes:
    return reply(f"<RetrievePropertiesExResponse{response_attrs}><returnval>{inner}</returnval>"
                 "</RetrievePropertiesExResponse>")


def _val(text: str, kind: str = "xsd:string") -> str:
    return f'<val xsi:type="{kind}">{text}</val>'


_SIM_REF = ('<val xmlns:XMLSchema-instance="http://www.w3.org/2001/XMLSchema-instance" '
            'XMLSchema-instance:type="ManagedObjectReference" type="HostSystem">host-1</val>')
_XSI_AS_X = ' xmlns="urn:vim25" xmlns:x="http://www.w3.org/2001/XMLSchema-instance"'
_ARRAY = ('<val xsi:type="ArrayOfManagedObjectReference">'
          '<ManagedObjectReference type="Datastore">d-1</ManagedObjectReference></val>')
_MISSING = '<missingSet><path>a</path><fault><fault xsi:type="NoPermission"></fault></fault></missingSet>'
_PREFIXED = ('<v:RetrievePropertiesExResponse xmlns:v="urn:vim25"><v:returnval>{}</v:returnval>'
             '</v:RetrievePropertiesExResponse>')
_SCANNED = {  # replies the scanner decodes itself
    "references": _returnval(_objects({"name": _val("a &amp; b &lt;c&gt; &#65;&#x42;&quot;"),
                                       "cr": _val("a\r\nb\rc&#13;"), "host": _SIM_REF})),
    "scalars": _returnval(_objects({
        "n": _val("4", "xsd:int"), "t": _val("1", "xsd:boolean"), "e": _val("", "ArrayOfString"),
        "d": _val("2024-05-01T10:00:00.5Z", "xsd:dateTime"), "u": "<val>7</val>",
        "q": '<val xmlns:q="urn:other" q:type="xsd:int">7</val>'})),
    "xsi declared on the response": _returnval(_objects({"n": '<val x:type="xsd:int">7</val>'}), _XSI_AS_X),
    "tokens and non-ASCII": _returnval("<token>t&amp;1</token>" + _objects({"n": _val("wéb\u202e")},
                                                                           moid="vm&amp;2")),
}
_DEFERRED = {  # replies left to ElementTree: decoded the same, or refused the same way
    "CDATA": _returnval(_objects({"n": _val("<![CDATA[x<y]]>")})),
    "comment": _returnval(_objects({"n": _val("x")}) + "<!-- c -->"),
    "whitespace": _returnval(_objects({"n": _val("x")}) + "\n"),
    "self-closing value": _returnval(_objects({"n": '<val xsi:type="xsd:string"/>'})),
    "array": _returnval(_objects({"ds": _ARRAY})),
    "missing property": _returnval(_objects({"n": _val("x")}, more=_MISSING)),
    "two tokens": _returnval("<token>a</token>" + _objects() + "<token>b</token>"),
    "prefixed response": reply(_PREFIXED.format(_objects({"n": _val("x")}))),
    "entity in a type": _returnval(_objects(kind="Virtual&amp;Machine")),
    "single quotes": _returnval(_objects({"n": "<val xsi:type='xsd:int'>1</val>"})),
    "Latin-1": _returnval(_objects()).replace(b'encoding="UTF-8"', b'encoding="ISO-8859-1"'),
    "undefined entity": _returnval(_objects({"n": _val("a &nbsp; b")})),
    "bare ampersand": _returnval(_objects({"n": _val("a & b")})),
    "unbound prefix": _returnval(_objects({"n": '<val zz:type="xsd:int">7</val>'})),
    "control character": _returnval(_objects({"n": _val("a\x01b")})),
    "NUL reference": _returnval(_objects({"n": _val("a&#0;b")})),
    "stray end tag": _returnval(_objects({"n": '<val xsi:type="xsd:string"/>x</val>'})),
    "duplicate attribute": _returnval(_objects({"n": '<val xsi:type="xsd:int" xsi:type="xsd:int">1</val>'})),
    "trailing garbage": _returnval(_objects()) + b"<x/>",
    "not a number": _returnval(_objects({"n": _val("seven", "xsd:int")})),
    "data object": _returnval(_objects({"s": _val("<a>b</a>", "VirtualMachineSummary")})),
}


@pytest.mark.parametrize("name", [*_SCANNED, *_DEFERRED])
def test_scanner_agrees_with_elementtree(name: str) -> None:
    assert_decoders_agree({**_SCANNED, **_DEFERRED}[name], scanned=name in _SCANNED)


@pytest.mark.parametrize(("name", "counted"), [(n, 0) for n in list(_SCANNED)[:3]]
                         + [(n, 1) for n in list(_DEFERRED)[:3]])
def test_replies_left_to_elementtree_are_counted(name: str, counted: int) -> None:
    body = {**_SCANNED, **_DEFERRED}[name]
    before = soap_scan.DECODER.fallbacks
    outcome(soap_scan.parse_retrieve_result, body)
    assert soap_scan.DECODER.fallbacks - before == counted


def test_scanner_reads_references_and_line_ends_as_xml_does() -> None:
    page = soap_scan.scan_retrieve_result(_SCANNED["references"])
    assert page is not None
    assert page.objects[0].props == {"name": 'a & b <c> AB"', "cr": "a\nb\nc\r", "host": "host-1"}
    tokens = soap_scan.scan_retrieve_result(_SCANNED["tokens and non-ASCII"])
    assert tokens is not None and tokens.token == "t&1" and tokens.objects[0].moid == "vm&2"


def obj(moid: str, **props: Any) -> ObjectProps:
    return ObjectProps("VirtualMachine", moid, props)


def test_collect_pages_follows_every_token() -> None:
    pages = {"t1": Page([obj("vm-2")], "t2"), "t2": Page([obj("vm-3")], None)}
    asked: list[str] = []

    def more(token: str) -> Page:
        asked.append(token)
        return pages[token]

    result = collector.collect_pages(Page([obj("vm-1")], "t1"), more,
                                     lambda _t: pytest.fail("nothing to cancel"))
    assert [o.moid for o in result] == ["vm-1", "vm-2", "vm-3"]
    assert asked == ["t1", "t2"]


def test_collect_pages_cancels_the_outstanding_token_when_a_page_fails() -> None:
    cancelled: list[str] = []

    def more(token: str) -> Page:
        raise OSError("connection dropped")

    with pytest.raises(OSError):
        collector.collect_pages(Page([obj("vm-1")], "t1"), more, cancelled.append)
    assert cancelled == ["t1"]


# --------------------------------------------------------------------------------------------------
# folder paths and list_vms filters (plain values)


def test_folder_tree_builds_paths_below_the_root() -> None:
    objects = [
        ObjectProps("Folder", "group-d1", {"name": "Datacenters"}),
        ObjectProps("Datacenter", "dc-1", {"name": "DC0", "parent": "group-d1"}),
        ObjectProps("Folder", "f-vm", {"name": "vm", "parent": "dc-1"}),
        ObjectProps("Folder", "f-prod", {"name": "prod", "parent": "f-vm"}),
    ]
    tree = resolve.FolderTree.from_objects(objects, "group-d1")
    assert tree.path("f-prod") == "/DC0/vm/prod"
    assert tree.path("f-vm") == "/DC0/vm"
    assert tree.path("vapp-1") is None
    assert tree.datacenter("f-prod", {"dc-1"}) == "DC0"


@pytest.mark.parametrize(("path", "wanted", "expected"), [
    ("/DC0/vm/prod", "/DC0/vm/prod", True),
    ("/DC0/vm/prod/web", "/DC0/vm/prod", True),
    ("/DC0/vm/production", "/DC0/vm/prod", False),
    ("/DC0/vm/prod", "DC0/vm/prod/", True),
    ("/DC0/vm/prod", "prod", True),
    ("/DC0/vm/prod/web", "prod", False),
    (None, "prod", False),
])
def test_folder_filter_takes_paths_or_names(path: str | None, wanted: str, expected: bool) -> None:
    assert resolve.folder_matches(path, wanted) is expected


def _vm(moid: str, name: str, created: datetime | None, power: str = "poweredOn") -> ObjectProps:
    props: dict[str, Any] = {"name": name, "runtime.powerState": power, "runtime.host": "host-1"}
    if created is not None:
        props["config.createDate"] = created
    return obj(moid, **props)


T0 = datetime(2025, 1, 1, tzinfo=UTC)
SWEPT = [
    _vm("vm-1", "web-1", T0),
    _vm("vm-2", "web-2", T0 + timedelta(days=10), power="poweredOff"),
    _vm("vm-3", "db-1", None),
    ObjectProps("HostSystem", "host-1", {"name": "esx-a"}),
]


@pytest.mark.parametrize(("query", "names"), [
    (VmQuery(), ["db-1", "web-1", "web-2"]),
    (VmQuery(name="web-1"), ["web-1"]),
    (VmQuery(regex=re.compile("^web")), ["web-1", "web-2"]),
    (VmQuery(power_state="poweredOff"), ["web-2"]),
    (VmQuery(created_after=T0 + timedelta(days=1)), ["web-2"]),
    (VmQuery(created_before=T0 + timedelta(days=1)), ["web-1"]),
    (VmQuery(created_after=T0 - timedelta(days=1), created_before=T0 + timedelta(days=11)),
     ["web-1", "web-2"]),
    (VmQuery(regex=re.compile("web"), power_state="poweredOn"), ["web-1"]),
])
def test_vm_filters_combine(query: VmQuery, names: list[str]) -> None:
    result = listings.vm_rows(SWEPT, query, "group-d1")
    assert [row["name"] for row in result["vms"]] == names
    assert result["count"] == len(names)


def test_vm_rows_shape_columns_limit_and_undated_vms() -> None:
    result = listings.vm_rows(SWEPT, VmQuery(fields=("name", "host", "created_at"), limit=1,
                                        created_before=T0 + timedelta(days=30)), "group-d1")
    assert result == {"count": 2, "truncated": True, "without_created_at": 1,
                      "vms": [{"name": "web-1", "host": "esx-a", "created_at": "2025-01-01T00:00:00+00:00"}]}
    with pytest.raises(errors.InvalidArgument, match="colour"):
        listings.vm_rows(SWEPT, VmQuery(fields=("name", "colour")), "group-d1")



@pytest.mark.parametrize("names", [
    (), ("moid",), ("name",), ("host", "moid"), tuple(listings.VM_COLUMNS),
    tuple(reversed(listings.VM_COLUMNS)),
])
@pytest.mark.parametrize("cut", [0, 1, 3, 4])
def test_rows_built_page_by_page_hold_each_columns_value_in_the_order_asked(
        names: tuple[str, ...], cut: int) -> None:
    """Rows shaped as each page comes (the host named on the last page) hold what each column's
    ``value`` gives once every object is known, keys in the order asked, rows by name."""
    rows = listings.VmRows(VmQuery(fields=names), "group-d1")
    rows.add(SWEPT[:cut])
    rows.add(SWEPT[cut:])
    result = rows.result()
    names_of = {"host-1": "esx-a"}
    lookups = listings.Lookups(hosts=names_of, pools=names_of,
                               folders=resolve.FolderTree.from_objects(SWEPT, "group-d1"))
    vms = sorted(SWEPT[:3], key=lambda o: o.props["name"])
    assert [list(row) for row in result["vms"]] == [list(names)] * 3
    assert result == {"count": 3, "vms": [{n: listings.VM_COLUMNS[n].value(o, lookups) for n in names}
                                          for o in vms]}


def test_a_filter_naming_other_objects_waits_for_the_last_page() -> None:
    rows = listings.VmRows(VmQuery(fields=("name",), resource_pool="pool-a"), "group-d1")
    rows.add([obj("vm-1", name="web-1", resourcePool="resgroup-1"), SWEPT[1]])
    rows.add([ObjectProps("ResourcePool", "resgroup-1", {"name": "pool-a"})])
    assert rows.result() == {"count": 1, "vms": [{"name": "web-1"}]}


# --------------------------------------------------------------------------------------------------
# sweeps against the simulator


def test_list_vms_rows_agree_with_the_simulator(vc1: SessionPool, sim_vc1: Simulator) -> None:
    result = vc1.run(lambda s: listings.list_vms(s, VmQuery()))
    truth = {vm["moid"]: vm for vm in sim_vc1.inventory()["vms"]}
    assert result["count"] == len(truth) == 4
    for row in result["vms"]:
        assert set(row) == set(listings.DEFAULT_VM_FIELDS)
        known = truth[row["moid"]]
        assert (row["name"], row["power_state"], row["connection_state"]) == (
            known["name"], known["power_state"], known["connection_state"])
        assert row["host"] in {h["name"] for h in sim_vc1.inventory()["hosts"]}
        assert row["cpu"] >= 1 and row["memory_mb"] >= 1
    assert [r["name"] for r in result["vms"]] == sorted(r["name"] for r in result["vms"])


@pytest.mark.simulator
@pytest.mark.parametrize("pool_name", ["vc1", "esx"])
def test_fast_decoder_and_pyvmomi_decoder_agree(pool_name: str, request: pytest.FixtureRequest) -> None:
    pool: SessionPool = request.getfixturevalue(pool_name)
    everything = VmQuery(fields=tuple(listings.VM_COLUMNS))
    fast = pool.run(lambda s: listings.list_vms(s, everything))
    slow = pool.run(lambda s: listings.list_vms(s, everything, fast=False))
    assert fast == slow
    assert fast["count"] == 4 if pool_name == "vc1" else 2


def test_the_simulators_replies_take_the_scanner(vc1: SessionPool, monkeypatch: pytest.MonkeyPatch) -> None:
    replies: list[bytes] = []
    decode = soap_scan.parse_retrieve_result

    def recording(body: bytes) -> Page:
        """The real decoder, keeping what it decoded."""
        replies.append(body)
        return decode(body)

    monkeypatch.setattr(collector, "parse_retrieve_result", recording)
    vc1.run(lambda s: listings.list_vms(s, VmQuery(fields=tuple(listings.VM_COLUMNS))))
    assert replies
    for body in replies:
        scanned = soap_scan.scan_retrieve_result(body)
        assert scanned is not None and scanned == soap_scan.parse_retrieve_tree(body)


def _over_vm_names(read: Callable[[VSphereSession, Any], Any]) -> Callable[[VSphereSession], Any]:
    """``read(session, spec)`` of every VM's name over a view made for it (and destroyed after)."""
    def run(session: VSphereSession) -> Any:
        content = session.content
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
        try:
            return read(session, collector._view_spec(view, [collector.Query(vim.VirtualMachine, ("name",))]))
        finally:
            view.DestroyView()
    return run


def _pipelined(decode: Callable[[bytes], Page]) -> Callable[[VSphereSession], Any]:
    """A retrieval of every VM's name, each page decoded by ``decode``."""
    return _over_vm_names(lambda session, spec: collector.retrieve_pipelined(
        session.si._stub, session.content.propertyCollector, spec, decode))


@pytest.fixture
def pages_of_one(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Retrievals in pages of one object; the list records each request the collector sends."""
    monkeypatch.setattr(collector, "PAGE_OBJECTS", 1)
    events: list[str] = []
    real_send = collector._Call.__init__

    def send(call: Any, stub: Any, mo: Any, method: str, args: Any) -> None:
        events.append(method)
        real_send(call, stub, mo, method, args)

    monkeypatch.setattr(collector._Call, "__init__", send)
    return events


def _pending_retrievals(sim: Simulator) -> int:
    return int(sim.control("/inflight")["pending_retrievals"])


def test_a_sweep_asks_for_each_next_page_before_decoding_the_one_it_has(
        vc1: SessionPool, pages_of_one: list[str]) -> None:
    def decode(body: bytes) -> Page:
        page = soap_scan.parse_retrieve_result(body)
        pages_of_one.append(f"decode {len(page.objects)}")
        return page

    objects = vc1.run(_pipelined(decode))
    more = ["ContinueRetrievePropertiesEx", "decode 1"]
    assert pages_of_one == ["RetrievePropertiesEx", *more * 3, "decode 1"]
    by_pyvmomi = vc1.run(_over_vm_names(lambda s, spec: collector._retrieve_pyvmomi(
        s.content.propertyCollector, spec, strict=True)))
    assert sorted(objects, key=lambda o: o.moid) == sorted(by_pyvmomi, key=lambda o: o.moid)
    assert len(objects) == 4


def test_a_token_written_otherwise_is_followed_after_the_decode(
        vc1: SessionPool, pages_of_one: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collector, "_TOKEN", re.compile(rb"(?!)(x)"))  # never found before the decode

    def decode(body: bytes) -> Page:
        pages_of_one.append("decode")
        return soap_scan.parse_retrieve_result(body)

    objects = vc1.run(_pipelined(decode))
    assert pages_of_one == ["RetrievePropertiesEx", *["decode", "ContinueRetrievePropertiesEx"] * 3, "decode"]
    assert len({o.moid for o in objects}) == 4


@pytest.mark.parametrize("query", [VmQuery(fields=tuple(listings.VM_COLUMNS)),
                                   VmQuery(fields=("name", "folder"), folder="vm", power_state="poweredOn")])
def test_list_vms_shapes_each_page_while_the_next_is_asked_for(
        vc1: SessionPool, pages_of_one: list[str], monkeypatch: pytest.MonkeyPatch, query: VmQuery) -> None:
    """In pages of one object, each page's rows are built after the next page was asked for, and the
    answer is the one a single page gives (hosts, pools and folders named on later pages)."""
    real_add = listings.VmRows.add

    def add(rows: listings.VmRows, objects: Any) -> None:
        pages_of_one.append(f"rows of {len(objects)}")
        real_add(rows, objects)

    monkeypatch.setattr(listings.VmRows, "add", add)
    paged = vc1.run(lambda s: listings.list_vms(s, query))
    continuations = pages_of_one.count("ContinueRetrievePropertiesEx")
    assert continuations >= 4
    each = ["ContinueRetrievePropertiesEx", "rows of 1"]
    assert pages_of_one == ["RetrievePropertiesEx", *each * continuations, "rows of 1"]
    monkeypatch.setattr(collector, "PAGE_OBJECTS", 1000)
    whole = vc1.run(lambda s: listings.list_vms(s, query))
    assert paged == whole and whole["count"] >= 1


@pytest.mark.parametrize(("failure", "raised"), [("decode fails", soap_scan.ComplexValueError),
                                                 ("token contradicted", errors.Unreachable)])
def test_a_page_that_fails_cancels_the_rest_and_leaves_the_session_usable(
        vc1: SessionPool, sim_vc1: Simulator, pages_of_one: list[str], failure: str, raised: type) -> None:
    def decode(body: bytes) -> Page:
        if failure == "decode fails":
            raise soap_scan.ComplexValueError("a fake decode failure")
        return Page(soap_scan.parse_retrieve_result(body).objects, "a token the reply does not start with")

    waiting = _pending_retrievals(sim_vc1)
    with pytest.raises(raised):  # a malformed reply is the target's failure, a data object the caller's
        vc1.run(_pipelined(decode))
    assert pages_of_one == ["RetrievePropertiesEx", "ContinueRetrievePropertiesEx"]
    assert _pending_retrievals(sim_vc1) == waiting  # the page asked for was read, the rest cancelled
    assert len(vc1.run(_pipelined(soap_scan.parse_retrieve_result))) == 4


def test_fast_path_raises_the_targets_own_fault(vc1: SessionPool) -> None:
    def read_gone_vm(session: VSphereSession, fast: bool) -> Any:
        gone = collector.managed_object(session, vim.VirtualMachine, "vm-999999")
        spec = collector.object_spec(gone, {vim.VirtualMachine: ("name",)})
        return collector.retrieve(session, spec, fast=fast)

    for fast in (True, False):
        with pytest.raises(errors.NotFound, match="ManagedObjectNotFound"):
            vc1.run(functools.partial(read_gone_vm, fast=fast))


def test_list_vms_costs_the_same_requests_for_10_and_300_vms(make_simulator: MakeSimulator) -> None:
    observed = {}
    for count in (10, 300):
        sim = make_simulator(clusters=1, hosts_per_cluster=2, standalone_hosts=0, vms=count)
        pool = open_pool(f"vc{count}", sim)
        try:
            query = VmQuery(fields=tuple(listings.VM_COLUMNS), regex=re.compile("VM"))
            calls = [logged(pool, functools.partial(listings.list_vms, query=query)) for _ in range(2)]
        finally:
            pool.close()
        assert [result["count"] for result, _methods in calls] == [count, count]
        observed[count] = [methods for _result, methods in calls]
    assert observed[10] == observed[300]
    assert observed[10] == [["CreateContainerView", "RetrievePropertiesEx"], ["RetrievePropertiesEx"]]


# --------------------------------------------------------------------------------------------------
# resolution


def test_resolve_vm_by_name_and_by_moid_gives_the_same_facts(vc1: SessionPool) -> None:
    by_name = vc1.run(lambda s: resolve.resolve_vm(s, "DC0_C0_RP0_VM0"))
    by_moid = vc1.run(lambda s: resolve.resolve_vm(s, by_name.moid))
    assert by_name == by_moid
    assert (by_name.folder, by_name.datacenter, by_name.cluster, by_name.resource_pool) == (
        "/DC0/vm", "DC0", "DC0_C0", "Resources")
    assert by_name.host in ("DC0_C0_H0", "DC0_C0_H1")
    assert (by_name.power_state, by_name.connection_state) == ("poweredOn", "connected")
    standalone = vc1.run(lambda s: resolve.resolve_vm(s, "DC0_H0_VM1"))
    assert (standalone.host, standalone.cluster) == ("DC0_H0", None)


def test_resolve_vm_costs_one_sweep_and_one_facts_read(vc1: SessionPool) -> None:
    logged(vc1, lambda s: resolve.resolve_vm(s, "DC0_H0_VM0"))  # the session's view of VMs is made
    _ref, methods = logged(vc1, lambda s: resolve.resolve_vm(s, "DC0_H0_VM0"))
    assert methods == ["RetrievePropertiesEx", "RetrievePropertiesEx"]


def test_unknown_vm_names_the_target_and_the_list_tool(vc1: SessionPool) -> None:
    with pytest.raises(errors.NotFound) as caught:
        vc1.run(lambda s: resolve.resolve_vm(s, "dc0_c0_rp0_vm0"))
    assert "'vc1'" in caught.value.message and "list_vms" in caught.value.message
    assert caught.value.code == "not_found"


def test_resolve_on_esx(esx: SessionPool) -> None:
    vm = esx.run(lambda s: resolve.resolve_vm(s, "ha-host_VM0"))
    assert (vm.folder, vm.datacenter, vm.resource_pool, vm.cluster) == (
        "/ha-datacenter/vm", "ha-datacenter", "Resources", None)
    host = esx.run(lambda s: resolve.resolve_host(s, "ha-host"))
    assert host.name == vm.host and host.cluster is None
    pool = esx.run(lambda s: resolve.resolve_pool(s, "Resources"))
    assert pool.owner_moid == "ha-compute-res"


def test_resolvers_for_hosts_datastores_networks_pools_folders(vc1: SessionPool) -> None:
    host = vc1.run(lambda s: resolve.resolve_host(s, "DC0_C0_H1"))
    assert (host.cluster, host.connection_state, host.in_maintenance) == ("DC0_C0", "connected", False)
    assert vc1.run(lambda s: resolve.resolve_host(s, host.moid)) == host
    ds = vc1.run(lambda s: resolve.resolve_datastore(s, "LocalDS_1"))
    assert ds.accessible is True and ds.capacity_bytes and ds.free_bytes
    assert vc1.run(lambda s: resolve.resolve_datastore(s, ds.moid)).name == "LocalDS_1"
    net = vc1.run(lambda s: resolve.resolve_network(s, "DC0_DVPG0"))
    assert net.type == "dvs.DistributedVirtualPortgroup"
    assert vc1.run(lambda s: resolve.resolve_network(s, "VM Network")).type == "Network"
    with pytest.raises(errors.Ambiguous) as caught:
        vc1.run(lambda s: resolve.resolve_pool(s, "Resources"))
    assert len(caught.value.details["candidates"]) == 2
    pool = vc1.run(lambda s: resolve.resolve_pool(s, "DC0_C0/Resources"))
    assert pool.owner == "DC0_C0" and pool.moid in caught.value.details["candidates"]
    folder = vc1.run(lambda s: resolve.resolve_folder(s, "/DC0/vm"))
    assert folder.name == "vm" and "VirtualMachine" in folder.child_types
    assert vc1.run(lambda s: resolve.resolve_folder(s, "DC0/vm")) == folder
    assert vc1.run(lambda s: resolve.resolve_folder(s, "vm")) == folder
    assert vc1.run(lambda s: resolve.resolve_cluster(s, "DC0_C0")).name == "DC0_C0"


def test_duplicate_names_are_ambiguous_until_named_by_moid(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=1)
    si = pyvmomi_connect(sim)
    try:
        vm = find_vm(si, "DC0_C0_RP0_VM0")
        spec = vim.vm.CloneSpec(location=vim.vm.RelocateSpec())  # type: ignore[no-untyped-call]
        wait_task(si, vm.CloneVM_Task(folder=vm.parent, name="DC0_C0_RP0_VM0", spec=spec))
    finally:
        Disconnect(si)  # type: ignore[no-untyped-call]
    pool = open_pool("dup", sim)
    try:
        moids = pool.run(lambda s: resolve.find_vm_by_name(s, "DC0_C0_RP0_VM0"))
        assert len(moids) == 2
        with pytest.raises(errors.Ambiguous) as caught:
            pool.run(lambda s: resolve.resolve_vm(s, "DC0_C0_RP0_VM0"))
        assert caught.value.details["candidates"] == moids
        assert all(m in caught.value.message for m in moids)
        assert pool.run(lambda s: resolve.resolve_vm(s, moids[1])).moid == moids[1]
        listed = pool.run(lambda s: listings.list_vms(s, VmQuery(name="DC0_C0_RP0_VM0")))
        assert [r["moid"] for r in listed["vms"]] == moids
    finally:
        pool.close()


# --------------------------------------------------------------------------------------------------
# list_vms filters against the simulator


def test_connection_state_filter_finds_orphaned_vms(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=2)
    sim.control("/vm/connection-state", {"vm": "DC0_C0_RP0_VM1", "state": "orphaned"})
    pool = open_pool("orph", sim)
    try:
        orphaned = pool.run(lambda s: listings.list_vms(s, VmQuery(connection_state="orphaned")))
        assert [(r["name"], r["connection_state"]) for r in orphaned["vms"]] == [
            ("DC0_C0_RP0_VM1", "orphaned")]
        connected = pool.run(lambda s: listings.list_vms(s, VmQuery(connection_state="connected")))
        assert [r["name"] for r in connected["vms"]] == ["DC0_C0_RP0_VM0"]
        assert pool.run(lambda s: resolve.resolve_vm(s, "DC0_C0_RP0_VM1")).connection_state == "orphaned"
    finally:
        pool.close()


def test_creation_date_filters_judge_only_dated_vms(vc1: SessionPool) -> None:
    # The simulator sets no config.createDate: every VM is undated, so no date filter may match one.
    after = vc1.run(lambda s: listings.list_vms(s, VmQuery(created_after=datetime(2000, 1, 1, tzinfo=UTC))))
    before = vc1.run(lambda s: listings.list_vms(s, VmQuery(created_before=datetime(2100, 1, 1, tzinfo=UTC))))
    assert after == before == {"count": 0, "vms": [], "without_created_at": 4}
    rows = vc1.run(lambda s: listings.list_vms(s, VmQuery()))["vms"]
    assert {r["created_at"] for r in rows} == {None}


def test_folder_and_pool_filters(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=2, standalone_hosts=1)
    si = pyvmomi_connect(sim)
    try:
        vm = find_vm(si, "DC0_H0_VM0")
        prod = vm.parent.CreateFolder("prod")
        wait_task(si, prod.MoveIntoFolder_Task([vm]))
    finally:
        Disconnect(si)  # type: ignore[no-untyped-call]
    pool = open_pool("folders", sim)
    try:
        def names(query: VmQuery) -> list[str]:
            return [r["name"] for r in pool.run(lambda s: listings.list_vms(s, query))["vms"]]

        assert names(VmQuery(folder="/DC0/vm/prod")) == ["DC0_H0_VM0"]
        assert names(VmQuery(folder="prod")) == ["DC0_H0_VM0"]
        assert len(names(VmQuery(folder="/DC0/vm"))) == 4
        assert "DC0_H0_VM0" not in names(VmQuery(folder="vm"))
        assert pool.run(lambda s: resolve.resolve_vm(s, "DC0_H0_VM0")).folder == "/DC0/vm/prod"
        cluster_pool = pool.run(lambda s: resolve.resolve_pool(s, "DC0_C0/Resources"))
        assert names(VmQuery(resource_pool=cluster_pool.moid)) == ["DC0_C0_RP0_VM0", "DC0_C0_RP0_VM1"]
        assert len(names(VmQuery(resource_pool="Resources"))) == 4
        query = VmQuery(name="DC0_H0_VM0", fields=("folder", "resource_pool"))
        row = pool.run(lambda s: listings.list_vms(s, query))
        assert row["vms"] == [{"folder": "/DC0/vm/prod", "resource_pool": "Resources"}]
    finally:
        pool.close()


# --------------------------------------------------------------------------------------------------
# hosts, clusters, datastores, details, snapshots


def test_list_hosts_clusters_datastores(vc1: SessionPool, sim_vc1: Simulator) -> None:
    hosts = vc1.run(lambda s: listings.list_hosts(s))
    known = sorted(h["name"] for h in sim_vc1.inventory()["hosts"])
    assert sorted(h["name"] for h in hosts["hosts"]) == known
    assert sum(h["vm_count"] for h in hosts["hosts"]) == 4
    in_cluster = vc1.run(lambda s: listings.list_hosts(s, "DC0_C0"))
    assert {h["cluster"] for h in in_cluster["hosts"]} == {"DC0_C0"} and in_cluster["count"] == 2
    with pytest.raises(errors.NotFound, match="list_clusters"):
        vc1.run(lambda s: listings.list_hosts(s, "nope"))
    clusters = vc1.run(lambda s: listings.list_clusters(s))
    [cluster] = clusters["clusters"]
    assert (cluster["name"], cluster["datacenter"], cluster["host_count"]) == ("DC0_C0", "DC0", 2)
    assert cluster["drs_enabled"] is True
    datastores = vc1.run(lambda s: listings.list_datastores(s))
    assert [d["name"] for d in datastores["datastores"]] == ["LocalDS_0", "LocalDS_1"]
    assert all(d["accessible"] and d["capacity_mb"] > d["free_mb"] > 0 for d in datastores["datastores"])


def test_details_of_vm_host_cluster_datastore(vc1: SessionPool) -> None:
    vm = vc1.run(lambda s: details.get_vm_details(s, "DC0_C0_RP0_VM0"))
    assert (vm["name"], vm["cluster"], vm["folder"]) == ("DC0_C0_RP0_VM0", "DC0_C0", "/DC0/vm")
    assert vm["disks"] and vm["disks"][0]["file"].startswith("[LocalDS_0]")
    assert vm["nics"] and vm["nics"][0]["network"] == "DC0_DVPG0"
    assert vm["datastores"] == ["LocalDS_0"] and vm["current_snapshot"] is None
    host = vc1.run(lambda s: details.get_host_details(s, "DC0_H0"))
    assert host["vms"] == ["DC0_H0_VM0", "DC0_H0_VM1"] and host["cluster"] is None
    assert "LocalDS_0" in host["datastores"] and host["product"].startswith("VMware ESXi")
    cluster = vc1.run(lambda s: details.get_cluster_details(s, "DC0_C0"))
    assert [h["name"] for h in cluster["hosts"]] == ["DC0_C0_H0", "DC0_C0_H1"]
    assert [p["name"] for p in cluster["resource_pools"]] == ["Resources"]
    ds = vc1.run(lambda s: details.get_datastore_details(s, "LocalDS_0"))
    assert ds["vms"] == ["DC0_C0_RP0_VM0", "DC0_C0_RP0_VM1", "DC0_H0_VM0", "DC0_H0_VM1"]
    assert ds["hosts"] and all(m["mounted"] for m in ds["hosts"])


def test_details_on_esx(esx: SessionPool) -> None:
    vm = esx.run(lambda s: details.get_vm_details(s, "ha-host_VM1"))
    assert vm["host"] == esx.run(lambda s: listings.list_hosts(s))["hosts"][0]["name"]
    assert esx.run(lambda s: listings.list_clusters(s)) == {"clusters": [], "count": 0}
    assert esx.run(lambda s: details.get_host_details(s, "ha-host"))["vms"] == ["ha-host_VM0", "ha-host_VM1"]


def test_snapshot_tree_is_flattened_with_parents_and_current(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(vms=2)
    si = pyvmomi_connect(sim)
    try:
        vm = find_vm(si, "DC0_C0_RP0_VM0")
        wait_task(si, vm.CreateSnapshot_Task("base", "before patching", False, False))
        wait_task(si, vm.CreateSnapshot_Task("patched", "", False, False))
    finally:
        Disconnect(si)  # type: ignore[no-untyped-call]
    pool = open_pool("snaps", sim)
    try:
        result = pool.run(lambda s: details.list_snapshots(s, "DC0_C0_RP0_VM0"))
        without = pool.run(lambda s: details.list_snapshots(s, "DC0_C0_RP0_VM1"))
    finally:
        pool.close()
    base, patched = result["snapshots"]
    assert (base["name"], base["description"], base["parent"], base["depth"]) == (
        "base", "before patching", None, 0)
    assert (patched["parent"], patched["depth"], patched["current"]) == (base["moid"], 1, True)
    assert base["current"] is False and result["current"] == patched["moid"]
    assert datetime.fromisoformat(base["created"]) <= datetime.fromisoformat(patched["created"])
    assert without == {"vm": "DC0_C0_RP0_VM1", "vm_moid": without["vm_moid"], "snapshots": [], "count": 0,
                       "current": None}


# --------------------------------------------------------------------------------------------------
# endpoint facts and privileges


def test_about_and_privileges(vc1: SessionPool, esx: SessionPool, sim_vc1: Simulator) -> None:
    about = vc1.run(access.about)
    assert about["instance_uuid"] == sim_vc1.instance_uuid and about["api_type"] == "VirtualCenter"
    assert esx.run(access.about)["instance_uuid"] is None
    check = vc1.run(lambda s: access.check_privileges(s, ["System.View", "VirtualMachine.Interact.PowerOn"]))
    assert check == access.PrivilegeCheck(
        sim_vc1.user, {"System.View": True, "VirtualMachine.Interact.PowerOn": True})


def test_sweep_reads_only_scalar_paths(vc1: SessionPool) -> None:
    with pytest.raises(soap_scan.ComplexValueError):
        vc1.run(lambda s: collector.sweep(s, [collector.Query(vim.VirtualMachine, ("summary",))]))
    with pytest.raises(soap_scan.ComplexValueError):
        vc1.run(lambda s: collector.sweep(s, [collector.Query(vim.VirtualMachine, ("summary",))], fast=False))
