"""Inventory reads through the PropertyCollector, and name/moid resolution.

Sweeps
    ``sweep(session, queries)`` reads the given properties of every object of the given types: one
    ContainerView over the types, one ``RetrievePropertiesEx`` (plus one
    ``ContinueRetrievePropertiesEx`` per further page the server hands back), then the view is
    destroyed. The number of requests does not grow with the number of objects except through the
    server's own paging. Values come back plain (``Props``): ``str``, ``int``, ``float``, ``bool``,
    aware ``datetime``, a moid ``str`` for an object reference, or a list of those; unset or
    unreadable properties are absent. Only such scalar paths may be swept.

    On a ``SoapStubAdapter`` the reply is decoded by a small ElementTree reader instead of pyVmomi's
    object deserializer, which costs several times more than the request itself on large inventories.
    The request is still built, sent (same connection pool, cookie, request modifiers) and, when it
    fails, decoded into a fault by pyVmomi, so faults surface exactly as from any other call.

Resolution
    Objects are named by exact name or by moid. ``resolve_vm`` and its siblings answer one object
    with the facts policy needs, or raise ``errors.NotFound`` (naming the target and the list tool
    to call) or ``errors.Ambiguous`` (listing the candidates' moids). The actions module builds on
    these.

Every function takes a session with ``target``, ``si`` and ``content`` (``pool.VSphereSession``)
and must run in that target's worker thread. pyVmomi faults propagate untranslated; the session
pool turns them into gateway errors.
"""

from __future__ import annotations

import re
import threading
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.client import HTTPException
from typing import Any, NamedTuple, Protocol

from pyVmomi import VmomiSupport, vim, vmodl
from pyVmomi.SoapAdapter import SoapResponseDeserializer, SoapStubAdapter

from gateway import errors
from gateway.config import Target
from gateway.guard.patterns import UserRegex

Props = dict[str, Any]
PC: Any = vmodl.query.PropertyCollector
_Deserializer: Any = SoapResponseDeserializer


class HasTarget(Protocol):
    """Anything naming the target it reads (a session, a mirror): enough to word NotFound/Ambiguous."""

    @property
    def target(self) -> Target: ...


class Session(HasTarget, Protocol):
    """What reads need of a session (``pool.VSphereSession`` satisfies it)."""

    @property
    def si(self) -> Any: ...

    @property
    def content(self) -> Any: ...


# --------------------------------------------------------------------------------------------------
# Retrieval


@dataclass(frozen=True, slots=True)
class ObjectProps:
    """One object of a retrieval: its type (``VirtualMachine``), moid and plain property values."""

    type: str
    moid: str
    props: Props
    missing: tuple[str, ...] = ()


class Page(NamedTuple):
    objects: list[ObjectProps]
    token: str | None


@dataclass(frozen=True)
class Query:
    """The properties to read of every object of ``type`` (a pyVmomi managed object class)."""

    type: Any
    paths: tuple[str, ...]


class ComplexValueError(ValueError):
    """A swept path returned a data object; sweeps take only scalar paths (a programming error)."""


def iso(value: datetime | None) -> str | None:
    """An aware datetime as ISO-8601 in UTC (``...+00:00``); ``None`` stays ``None``."""
    return value.astimezone(UTC).isoformat() if value is not None else None


def _parse_datetime(text: str) -> datetime:
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _parse_bool(text: str) -> bool:
    return text in ("true", "1")


_SCALARS: dict[str, Callable[[str], Any]] = {
    "string": str, "int": int, "long": int, "short": int, "byte": int, "boolean": _parse_bool,
    "double": float, "float": float, "dateTime": _parse_datetime, "ManagedObjectReference": str,
}
"""Converters by XML schema type (prefix stripped); any other type (enums, moid types) reads as text."""

_XSI_TYPE = "{http://www.w3.org/2001/XMLSchema-instance}type"


def _xml_value(path: str, val: ET.Element) -> Any:
    kind = (val.get(_XSI_TYPE) or "string").rpartition(":")[2]
    if len(val) == 0 and not kind.startswith("ArrayOf"):
        return _SCALARS.get(kind, str)(val.text or "")
    if not kind.startswith("ArrayOf") or any(len(item) for item in val):
        raise ComplexValueError(f"property '{path}' holds a {kind}; sweeps read scalar paths only")
    convert = _SCALARS.get(kind[len("ArrayOf"):], str)
    return [convert(item.text or "") for item in val]


def parse_retrieve_result(body: bytes) -> Page:
    """Decode a ``RetrievePropertiesEx``/``ContinueRetrievePropertiesEx`` SOAP reply into plain objects.

    Replies in the plain shape vSphere sends for scalar sweeps are decoded by ``scan_retrieve_result``;
    anything else (arrays, missing properties, comments, unusual prefixes) by ElementTree. Both give
    the same objects. Raises ``ComplexValueError`` for a data-object value and ``ET.ParseError`` for
    malformed XML.
    """
    page = scan_retrieve_result(body)
    if page is not None:
        return page
    DECODER.fell_back()
    return parse_retrieve_tree(body)


class DecoderCounters:
    """How many replies the fast scanner decoded and how many fell back to ElementTree (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fallbacks = 0

    def fell_back(self) -> None:
        with self._lock:
            self.fallbacks += 1


DECODER = DecoderCounters()
"""Process-wide counters of ``parse_retrieve_result`` (exposed with the mirrors' statistics)."""


def parse_retrieve_tree(body: bytes) -> Page:
    """``parse_retrieve_result`` through ElementTree, whatever the reply's shape."""
    envelope = ET.fromstring(body)
    response = next(iter(next(iter(envelope))), None)  # Envelope > Body > *Response
    if response is None:
        return Page([], None)
    ns = response.tag[: response.tag.index("}") + 1] if response.tag.startswith("{") else ""
    objects: list[ObjectProps] = []
    token: str | None = None
    for returnval in response:
        for child in returnval:
            if child.tag == ns + "objects":
                objects.append(_xml_object(child, ns))
            elif child.tag == ns + "token":
                token = child.text or None
    return Page(objects, token)


# The scanner: ElementTree builds ~20 elements per VM and costs several times what the simulator needs
# to answer; matching the known shape with a few regular expressions costs a fifth of that. It accepts
# only compact replies whose every byte it accounts for and otherwise answers None, so whatever it does
# not recognise is left to ElementTree (which also reports malformed XML).
_XSI = "http://www.w3.org/2001/XMLSchema-instance"
_QNAME = r"[A-Za-z_][\w.\-]*"
_PROLOGUE = re.compile(
    rf'(?:<\?xml(?P<decl>[^<>?]*)\?>)?\s*<(?P<p>(?:{_QNAME}:)?)Envelope(?P<env>(?:\s[^<>]*)?)>\s*'
    rf'<(?P=p)Body(?P<body>(?:\s[^<>]*)?)>\s*<(?P<resp>{_QNAME})(?P<resp_attrs>(?:\s[^<>]*)?)><returnval>')
_DECLARATION = re.compile(r'\s+version=(["\'])1\.0\1(?:\s+encoding=(["\'])(?i:utf-8)\2)?'
                          r'(?:\s+standalone=(["\'])(?:yes|no)\3)?\s*')
_ATTRIBUTE = re.compile(rf'\s+((?:{_QNAME}:)?{_QNAME})\s*=\s*"([^"<&\t\n\r]*)"')
_TOKEN = re.compile(r"<token>([^<]*)</token>")
# Only single negated characters ([^<]): the regex engine scans those many times faster than sets.
_OBJECT = re.compile(
    r'<objects><obj type="([^"]*)">([^<]*)</obj>'
    r'((?:<propSet><name>[^<]*</name><val\b[^>]*>[^<]*</val></propSet>)*)</objects>')
_PROPERTY = re.compile(r'<propSet><name>([^<]*)</name><val\b([^>]*)>([^<]*)</val></propSet>')
_ATTRIBUTE_VALUE = re.compile(r'[^"<&\t\n\r]*')
_CONTROL_BYTES = bytes(c for c in range(32) if c not in (9, 10, 13))
_NOT_XML_CHAR = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_REFERENCE = re.compile(r"&(?:#([0-9]+)|#x([0-9A-Fa-f]+)|(lt|gt|amp|quot|apos));")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}


class _Unrecognised(Exception):
    """The scanner met something outside the shape it knows: ElementTree decodes the reply instead."""


def scan_retrieve_result(body: bytes) -> Page | None:
    """The reply decoded by regular expressions, or None when it is not in the plain shape: one
    envelope, body and response, then a ``returnval`` holding only a token and objects whose
    properties are all scalar values, without whitespace, comments or CDATA between elements."""
    try:
        return _scan(body)
    except (_Unrecognised, UnicodeDecodeError, ValueError, OverflowError):
        return None  # ValueError/OverflowError: a value that does not convert; ElementTree will say so


def _scan(body: bytes) -> Page:
    text = body.decode("utf-8")
    head = _PROLOGUE.match(text)
    if (head is None or _has_non_xml_chars(body) or "\ufffe" in text or "\uffff" in text or "]]>" in text
            or not _plain_declaration(head["decl"])):
        raise _Unrecognised
    prefix, response = head["p"], head["resp"]
    scope: dict[str, str] = {}
    for attrs in (head["env"], head["body"], head["resp_attrs"]):
        scope.update(_declared(_attributes(attrs)))
    if prefix and prefix[:-1] not in scope:
        raise _Unrecognised
    kinds: dict[str, Callable[[str], Any] | None] = {}
    types: dict[str, str] = {}
    objects: list[ObjectProps] = []
    plain = "&" not in text and "\r" not in text  # no references, no line ends to normalise: as is
    token, pos = _scan_token(text, head.end(), None)
    while (match := _OBJECT.match(text, pos)) is not None:
        objects.append(_scan_object(match, scope, kinds, types, plain))
        pos = match.end()
    token, pos = _scan_token(text, pos, token)
    epilogue = rf"</returnval></{response}>\s*</{re.escape(prefix)}Body>\s*</{re.escape(prefix)}Envelope>\s*"
    if re.fullmatch(epilogue, text[pos:]) is None:
        raise _Unrecognised
    return Page(objects, token)


def _has_non_xml_chars(body: bytes) -> bool:
    """Raw characters XML forbids (C0 controls but tab and line ends; U+FFFE, U+FFFF): malformed."""
    return len(body.translate(None, _CONTROL_BYTES)) != len(body)


def _plain_declaration(declaration: str | None) -> bool:
    return declaration is None or _DECLARATION.fullmatch(declaration) is not None


def _scan_token(text: str, pos: int, token: str | None) -> tuple[str | None, int]:
    match = _TOKEN.match(text, pos)
    if match is None:
        return token, pos
    if token is not None:
        raise _Unrecognised  # two tokens: let ElementTree keep the last, as it always has
    return _xml_text(match[1]) or None, match.end()


def _attributes(attrs: str) -> dict[str, str]:
    """``name="value"`` pairs covering all of ``attrs`` (else unrecognised: other quoting, entities...)."""
    found: dict[str, str] = {}
    pos = 0
    for match in _ATTRIBUTE.finditer(attrs):
        if match.start() != pos or match[1] in found:
            raise _Unrecognised
        found[match[1]] = match[2]
        pos = match.end()
    if attrs[pos:].strip():
        raise _Unrecognised
    return found


def _declared(attrs: Mapping[str, str]) -> dict[str, str]:
    return {name[6:]: uri for name, uri in attrs.items() if name.startswith("xmlns:")}


def _scan_object(
    match: re.Match[str], scope: Mapping[str, str], kinds: dict[str, Callable[[str], Any] | None],
    types: dict[str, str], plain: bool,
) -> ObjectProps:
    """One ``objects`` element; ``kinds`` and ``types`` remember the few distinct attribute strings.
    ``plain``: the reply holds no reference and no carriage return, so text is taken as it is."""
    props: Props = {}
    for name, attrs, raw in _PROPERTY.findall(match[3]):
        convert = kinds.get(attrs, _UNSEEN)
        if convert is _UNSEEN:
            convert = kinds[attrs] = _converter(attrs, scope)
        if not plain:
            raw, name = _xml_text(raw), _xml_text(name)
        props[name] = raw if convert is str else [] if convert is None else convert(raw)
    kind = match[1]
    return ObjectProps(types[kind] if kind in types else types.setdefault(kind, _attribute_value(kind)),
                       match[2] if plain else _xml_text(match[2]), props)


_UNSEEN: Any = object()


def _attribute_value(raw: str) -> str:
    if _ATTRIBUTE_VALUE.fullmatch(raw) is None:
        raise _Unrecognised  # entities, markup or whitespace an XML parser would normalise
    return raw


def _converter(attrs: str, scope: Mapping[str, str]) -> Callable[[str], Any] | None:
    """How to read a ``val`` with these attributes: its xsi:type's converter; None for an (empty) array."""
    found = _attributes(attrs)
    local = {**scope, **_declared(found)}
    kind = "string"
    for name, value in found.items():
        attr_prefix, _, local_name = name.rpartition(":")
        if attr_prefix and attr_prefix != "xmlns" and attr_prefix not in local:
            raise _Unrecognised  # an unbound prefix: malformed, ElementTree reports it
        if local_name == "type" and attr_prefix and local.get(attr_prefix) == _XSI:
            kind = value.rpartition(":")[2]
    if kind.startswith("ArrayOf"):
        return None
    return _SCALARS.get(kind, str)


def _xml_text(raw: str) -> str:
    """Character data as an XML parser reports it: line ends normalised, references replaced."""
    if "\r" in raw:
        raw = raw.replace("\r\n", "\n").replace("\r", "\n")
    if "&" not in raw:
        return raw
    if raw.count("&") != len(_REFERENCE.findall(raw)):
        raise _Unrecognised  # an entity XML does not predefine (or a bare &): malformed here
    return _REFERENCE.sub(_dereference, raw)


def _dereference(match: re.Match[str]) -> str:
    decimal, hexadecimal, name = match.groups()
    if name:
        return _NAMED[name]
    code = int(decimal) if decimal else int(hexadecimal, 16)
    char = chr(code)  # ValueError/OverflowError beyond U+10FFFF: unrecognised
    if _NOT_XML_CHAR.match(char) or 0xD800 <= code <= 0xDFFF:
        raise _Unrecognised
    return char


def _xml_object(element: ET.Element, ns: str) -> ObjectProps:
    children = iter(element)
    obj = next(children)
    props: Props = {}
    missing: list[str] = []
    prop_set, missing_set = ns + "propSet", ns + "missingSet"
    for child in children:
        if child.tag == prop_set:
            name = child[0].text or ""
            props[name] = _xml_value(name, child[1])
        elif child.tag == missing_set:
            missing.append(child[0].text or "")
    return ObjectProps(obj.get("type") or "", obj.text or "", props, tuple(missing))


def _plain(path: str, value: Any, strict: bool = True) -> Any:
    """A pyVmomi property value as the XML reader would give it: object references become moids.

    A data object raises ``ComplexValueError`` when ``strict``, else it is returned as is.
    """
    if isinstance(value, VmomiSupport.ManagedObject):
        return value._moId
    if isinstance(value, list):
        return [_plain(path, v, strict) for v in value]
    if isinstance(value, VmomiSupport.DataObject):
        if strict:
            raise ComplexValueError(
                f"property '{path}' holds a {type(value).__name__}; sweeps read scalar paths only")
        return value
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _page_from_result(result: Any, strict: bool) -> Page:
    if result is None:
        return Page([], None)
    objects = []
    for content in result.objects:
        props = {p.name: _plain(p.name, p.val, strict) for p in content.propSet}
        missing = tuple(m.path for m in (content.missingSet or []))
        objects.append(ObjectProps(content.obj._wsdlName, content.obj._moId, props, missing))
    return Page(objects, result.token or None)


def collect_pages(
    first: Page, more: Callable[[str], Page], cancel: Callable[[str], None]
) -> list[ObjectProps]:
    """All objects of a paged retrieval: follow continuation tokens until none is left.

    If fetching a page fails, the outstanding token is cancelled (best effort) before re-raising so
    the server can free the result set.
    """
    objects = list(first.objects)
    token = first.token
    try:
        while token:
            page = more(token)
            objects.extend(page.objects)
            token = page.token
    except BaseException:
        if token:
            with suppress(Exception):
                cancel(token)
        raise
    return objects


def _accepts_raw(stub: Any) -> bool:
    return isinstance(stub, SoapStubAdapter)


def soap_call(stub: Any, mo: Any, method: str, args: Sequence[Any]) -> bytes:
    """Send one SOAP call through pyVmomi's stub and return the raw 200 reply body.

    The request goes out exactly as pyVmomi sends it (serializer, request modifiers, session cookie,
    pooled connection). A SOAP fault (HTTP 500) is decoded by pyVmomi and raised; any other status
    raises ``http.client.HTTPException``; a transport error drops the stub's pooled connections.
    """
    info = mo._GetMethodInfo(method)
    request = stub.SerializeRequest(mo, info, list(args))
    for modifier in stub.requestModifierList:
        request = modifier(request)
    headers = {"Cookie": stub.cookie, "SOAPAction": stub.versionId, "Content-Type": "text/xml; charset=UTF-8"}
    headers.update(getattr(stub, "_customHeaders", None) or {})
    if getattr(stub, "_acceptCompressedResponses", False):
        headers["Accept-Encoding"] = "gzip, deflate"
    conn = stub.GetConnection()
    try:
        conn.request("POST", stub.path, request, headers)
        response = conn.getresponse()
        body = response.read()
    except (OSError, HTTPException):
        conn.close()
        stub.DropConnections()
        raise
    if response.status in (200, 500):
        stub.ReturnConnection(conn)
    else:
        conn.close()
    cookie = response.getheader("Set-Cookie")
    if cookie:
        stub.cookie = cookie
    body = _decompress(body, (response.getheader("Content-Encoding") or "identity").lower())
    if response.status == 200:
        return body
    if response.status == 500:
        fault = _Deserializer(stub).Deserialize(body, info.result)
        if isinstance(fault, BaseException):
            raise fault
    raise HTTPException(f"{response.status} {response.reason}")


def _decompress(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return zlib.decompress(body, 16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompress(body)
    return body


def retrieve(session: Session, spec: Any, *, fast: bool = True) -> list[ObjectProps]:
    """Every object ``spec`` (a ``PropertyCollector.FilterSpec``) selects, with plain values.

    ``fast=False`` forces pyVmomi's own decoding (the results are the same; tests compare them).
    """
    collector = session.content.propertyCollector
    stub = session.si._stub
    if fast and _accepts_raw(stub):
        def fetch(method: str, *args: Any) -> Page:
            return parse_retrieve_result(soap_call(stub, collector, method, args))

        first = fetch("RetrievePropertiesEx", [spec], PC.RetrieveOptions())
        return collect_pages(first, lambda token: fetch("ContinueRetrievePropertiesEx", token),
                             collector.CancelRetrievePropertiesEx)
    return _retrieve_pyvmomi(collector, spec, strict=True)


def _retrieve_pyvmomi(collector: Any, spec: Any, strict: bool) -> list[ObjectProps]:
    first = _page_from_result(collector.RetrievePropertiesEx([spec], PC.RetrieveOptions()), strict)
    return collect_pages(
        first, lambda token: _page_from_result(collector.ContinueRetrievePropertiesEx(token), strict),
        collector.CancelRetrievePropertiesEx)


def retrieve_objects(session: Session, spec: Any) -> list[ObjectProps]:
    """Like ``retrieve``, decoded by pyVmomi: references still become moids, but data objects
    (``config.hardware.device``, ``snapshot``...) stay pyVmomi objects. For detail reads."""
    return _retrieve_pyvmomi(session.content.propertyCollector, spec, strict=False)


def _view_spec(view: Any, queries: Sequence[Query]) -> Any:
    traverse = PC.TraversalSpec(name="view", type=vim.view.ContainerView, path="view", skip=False)
    return PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=view, skip=True, selectSet=[traverse])],
        propSet=[PC.PropertySpec(type=q.type, pathSet=list(q.paths)) for q in queries],
    )


def sweep(session: Session, queries: Sequence[Query], *, root: Any = None, fast: bool = True,
          objects: bool = False) -> list[ObjectProps]:
    """Read ``queries`` over every object of their types under ``root`` (default: the root folder).

    ``objects=True`` decodes like ``retrieve_objects`` (data-object paths allowed, slower).
    """
    content = session.content
    types = [q.type for q in queries]
    view = content.viewManager.CreateContainerView(root or content.rootFolder, types, True)
    try:
        spec = _view_spec(view, queries)
        return retrieve_objects(session, spec) if objects else retrieve(session, spec, fast=fast)
    finally:
        view.DestroyView()


def by_type(objects: Iterable[ObjectProps]) -> dict[str, list[ObjectProps]]:
    """Objects grouped by their type name."""
    groups: dict[str, list[ObjectProps]] = {}
    for obj in objects:
        groups.setdefault(obj.type, []).append(obj)
    return groups


def managed_object(session: Session, vim_type: Any, moid: str) -> Any:
    """The pyVmomi object for ``moid`` bound to this session (no request is made)."""
    return vim_type(moid, session.si._stub)


def object_spec(obj: Any, paths_by_type: Mapping[Any, Sequence[str]], select: Sequence[Any] = ()) -> Any:
    """A filter spec reading ``paths_by_type`` on ``obj`` and on what ``select`` traverses to."""
    return PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=obj, skip=False, selectSet=list(select))],
        propSet=[PC.PropertySpec(type=t, pathSet=list(p)) for t, p in paths_by_type.items()],
    )


def traverse(name: str, vim_type: Any, path: str, *follow: str) -> Any:
    """A named traversal from ``vim_type`` along ``path``, continuing with the named traversals."""
    return PC.TraversalSpec(name=name, type=vim_type, path=path, skip=False,
                            selectSet=[PC.SelectionSpec(name=f) for f in follow])


# --------------------------------------------------------------------------------------------------
# Inventory paths


@dataclass(frozen=True)
class FolderTree:
    """Names and parents of folders and datacenters, to turn a folder moid into an inventory path."""

    names: dict[str, str]
    parents: dict[str, str]
    root: str
    _paths: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def from_objects(cls, objects: Iterable[ObjectProps], root: str) -> FolderTree:
        names: dict[str, str] = {}
        parents: dict[str, str] = {}
        for obj in objects:
            if obj.type in ("Folder", "Datacenter"):
                names[obj.moid] = obj.props.get("name", obj.moid)
                if "parent" in obj.props:
                    parents[obj.moid] = obj.props["parent"]
        return cls(names, parents, root)

    def path(self, moid: str | None) -> str | None:
        """``/DC0/vm/prod`` for a folder moid; ``None`` if it is not a known folder or datacenter."""
        if moid is None or moid not in self.names:
            return None
        if moid not in self._paths:
            parts: list[str] = []
            current: str | None = moid
            while current is not None and current != self.root and current in self.names:
                parts.append(self.names[current])
                current = self.parents.get(current)
            self._paths[moid] = "/" + "/".join(reversed(parts))
        return self._paths[moid]

    def datacenter(self, moid: str | None, datacenters: set[str]) -> str | None:
        """The name of the datacenter above folder ``moid``."""
        current = moid
        while current is not None and current != self.root:
            if current in datacenters:
                return self.names.get(current)
            current = self.parents.get(current)
        return None


def folder_matches(path: str | None, wanted: str) -> bool:
    """A folder filter: a value with "/" is a path (that folder or below); otherwise the folder's name."""
    if path is None:
        return False
    if "/" in wanted:
        wanted = "/" + wanted.strip("/")
        return path == wanted or path.startswith(wanted + "/")
    return path.rsplit("/", 1)[-1] == wanted


# --------------------------------------------------------------------------------------------------
# Resolution


@dataclass(frozen=True)
class _Kind:
    label: str
    vim_type: Any
    list_tool: str


_VM = _Kind("VM", vim.VirtualMachine, "list_vms")
_HOST = _Kind("host", vim.HostSystem, "list_hosts")
_CLUSTER = _Kind("cluster", vim.ClusterComputeResource, "list_clusters")
_DATASTORE = _Kind("datastore", vim.Datastore, "list_datastores")
_NETWORK = _Kind("network", vim.Network, "get_host_details")
_POOL = _Kind("resource pool", vim.ResourcePool, "get_cluster_details")
_FOLDER = _Kind("folder", vim.Folder, "list_vms (fields folder)")


def _not_found(session: HasTarget, kind: _Kind, ref: str) -> errors.NotFound:
    target = session.target.name
    return errors.NotFound(
        f"no {kind.label} named or with moid '{ref}' on target '{target}'; call {kind.list_tool} to see "
        "what exists (names are exact and case-sensitive)", target=target, ref=ref)


def _ambiguous(session: HasTarget, kind: _Kind, ref: str, moids: Sequence[str]) -> errors.Ambiguous:
    target = session.target.name
    return errors.Ambiguous(
        f"{len(moids)} {kind.label}s on target '{target}' are named '{ref}'; name one by its moid: "
        f"{', '.join(moids)}", target=target, ref=ref, candidates=list(moids))


def _pick(session: HasTarget, kind: _Kind, ref: str, objects: Sequence[ObjectProps],
         names: Callable[[ObjectProps], Iterable[str]] | None = None) -> ObjectProps:
    """The one object ``ref`` names among ``objects``: a moid wins over names; else NotFound/Ambiguous."""
    for obj in objects:
        if obj.moid == ref:
            return obj
    of = names or (lambda o: (o.props.get("name", ""),))
    matches = [obj for obj in objects if ref in of(obj)]
    if not matches:
        raise _not_found(session, kind, ref)
    if len(matches) > 1:
        raise _ambiguous(session, kind, ref, sorted(m.moid for m in matches))
    return matches[0]


def find_vm_by_name(session: Session, name: str) -> list[str]:
    """Moids of every VM whose name is exactly ``name`` (one sweep of names), sorted."""
    objects = sweep(session, [Query(vim.VirtualMachine, ("name",))])
    return sorted(o.moid for o in objects if o.props.get("name") == name)


def _find(session: Session, kind: _Kind, ref: str) -> str:
    if not ref:
        raise errors.InvalidArgument(kind.label.replace(" ", "_").lower(), "name or moid must not be empty")
    return _pick(session, kind, ref, sweep(session, [Query(kind.vim_type, ("name",))])).moid


@dataclass(frozen=True)
class VmRef:
    """A resolved VM and the facts policy matches on.

    ``folder`` is the inventory path of its folder (``/DC0/vm/prod``); ``resource_pool`` and ``host``
    are names (moids alongside); states are vSphere's values (``poweredOn``, ``orphaned``, ...).
    """

    moid: str
    name: str
    folder: str | None
    resource_pool: str | None
    host: str | None
    connection_state: str | None
    power_state: str | None
    datacenter: str | None = None
    cluster: str | None = None
    folder_moid: str | None = None
    resource_pool_moid: str | None = None
    host_moid: str | None = None
    template: bool = False

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.VirtualMachine, self.moid)

    def facts(self) -> dict[str, Any]:
        """The facts as a JSON-able dict (unset ones omitted)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


_VM_FACT_PATHS: dict[Any, tuple[str, ...]] = {
    vim.VirtualMachine: ("name", "parent", "resourcePool", "runtime.host", "runtime.connectionState",
                         "runtime.powerState", "config.template"),
    vim.Folder: ("name", "parent"),
    vim.Datacenter: ("name", "parent"),
    vim.ResourcePool: ("name", "owner"),
    vim.ComputeResource: ("name",),
    vim.HostSystem: ("name",),
}

# From the VM up its folder chain, and from its pool to the pool's cluster and that cluster's hosts,
# so that folder path, pool, cluster and host name arrive in the one round trip.
_VM_FACT_TRAVERSAL = (
    traverse("vmFolder", vim.VirtualMachine, "parent", "folderUp", "dcUp"),
    traverse("folderUp", vim.Folder, "parent", "folderUp", "dcUp"),
    traverse("dcUp", vim.Datacenter, "parent", "folderUp"),
    traverse("vmPool", vim.VirtualMachine, "resourcePool", "poolOwner"),
    traverse("poolOwner", vim.ResourcePool, "owner", "ownerHosts"),
    traverse("ownerHosts", vim.ComputeResource, "host"),
)


def vm_facts(session: Session, moid: str) -> VmRef:
    """The facts of the VM ``moid`` in one PropertyCollector round trip (a second one only for a VM
    without a resource pool, to name its host). A VM that no longer exists raises the target's
    ``ManagedObjectNotFound`` fault."""
    vm = managed_object(session, vim.VirtualMachine, moid)
    return _vm_ref(session, moid, retrieve(session, object_spec(vm, _VM_FACT_PATHS, _VM_FACT_TRAVERSAL)))


def _vm_ref(session: Session, moid: str, objects: Sequence[ObjectProps]) -> VmRef:
    """The facts of VM ``moid`` from a retrieval made with ``_VM_FACT_PATHS`` and ``_VM_FACT_TRAVERSAL``."""
    groups = by_type(objects)
    me = next(o for o in groups.get("VirtualMachine", []) if o.moid == moid)
    tree = FolderTree.from_objects(objects, session.content.rootFolder._moId)
    names = {o.moid: o.props.get("name") for o in objects}
    host_moid = me.props.get("runtime.host")
    if host_moid is not None and host_moid not in names:
        host = retrieve(session, object_spec(managed_object(session, vim.HostSystem, host_moid),
                                             {vim.HostSystem: ("name",)}))
        names.update({o.moid: o.props.get("name") for o in host})
    pool_moid = me.props.get("resourcePool")
    clusters = groups.get("ClusterComputeResource", [])
    p = me.props
    return VmRef(
        moid=moid, name=p.get("name", moid), folder=tree.path(p.get("parent")),
        resource_pool=names.get(pool_moid) if pool_moid else None,
        host=names.get(host_moid) if host_moid else None,
        connection_state=p.get("runtime.connectionState"), power_state=p.get("runtime.powerState"),
        datacenter=tree.datacenter(p.get("parent"), {o.moid for o in groups.get("Datacenter", [])}),
        cluster=clusters[0].props.get("name") if clusters else None,
        folder_moid=p.get("parent"), resource_pool_moid=pool_moid, host_moid=host_moid,
        template=bool(p.get("config.template", False)),
    )


def resolve_vm(session: Session, ref: str) -> VmRef:
    """The VM ``ref`` names (exact name or moid) with its facts; NotFound / Ambiguous otherwise."""
    moid = _find(session, _VM, ref)
    try:
        return vm_facts(session, moid)
    except vmodl.fault.ManagedObjectNotFound:  # deleted between the two reads
        raise _not_found(session, _VM, ref) from None


@dataclass(frozen=True)
class HostRef:
    moid: str
    name: str
    cluster: str | None
    connection_state: str | None
    power_state: str | None
    in_maintenance: bool | None
    compute_resource_moid: str | None = None

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.HostSystem, self.moid)


_HOST_PATHS = ("name", "parent", "runtime.connectionState", "runtime.powerState", "runtime.inMaintenanceMode")


def resolve_host(session: Session, ref: str) -> HostRef:
    """The host ``ref`` names (exact name or moid), with its cluster and states, from one sweep."""
    objects = sweep(session, [Query(vim.HostSystem, _HOST_PATHS), Query(vim.ComputeResource, ("name",))])
    groups = by_type(objects)
    host = _pick(session, _HOST, ref, groups.get("HostSystem", []))
    clusters = {o.moid: o.props.get("name") for o in groups.get("ClusterComputeResource", [])}
    p = host.props
    parent = p.get("parent")
    return HostRef(
        moid=host.moid, name=p.get("name", host.moid), cluster=clusters.get(parent) if parent else None,
        connection_state=p.get("runtime.connectionState"), power_state=p.get("runtime.powerState"),
        in_maintenance=p.get("runtime.inMaintenanceMode"), compute_resource_moid=parent,
    )


@dataclass(frozen=True)
class ClusterRef:
    moid: str
    name: str

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.ClusterComputeResource, self.moid)


def resolve_cluster(session: Session, ref: str) -> ClusterRef:
    """The cluster ``ref`` names (exact name or moid)."""
    objects = sweep(session, [Query(vim.ClusterComputeResource, ("name",))])
    found = _pick(session, _CLUSTER, ref, objects)
    return ClusterRef(found.moid, found.props.get("name", found.moid))


@dataclass(frozen=True)
class DatastoreRef:
    moid: str
    name: str
    type: str | None
    accessible: bool | None
    capacity_bytes: int | None
    free_bytes: int | None
    maintenance_mode: str | None

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.Datastore, self.moid)


_DATASTORE_PATHS = ("name", "summary.type", "summary.accessible", "summary.capacity", "summary.freeSpace",
                    "summary.maintenanceMode")


def resolve_datastore(session: Session, ref: str) -> DatastoreRef:
    """The datastore ``ref`` names (exact name or moid) with type, accessibility and space."""
    found = _pick(session, _DATASTORE, ref, sweep(session, [Query(vim.Datastore, _DATASTORE_PATHS)]))
    p = found.props
    return DatastoreRef(
        found.moid, p.get("name", found.moid), p.get("summary.type"), p.get("summary.accessible"),
        p.get("summary.capacity"), p.get("summary.freeSpace"), p.get("summary.maintenanceMode"))


@dataclass(frozen=True)
class NetworkRef:
    """A network: ``type`` is ``Network``, ``DistributedVirtualPortgroup`` or ``OpaqueNetwork``."""

    moid: str
    name: str
    type: str
    accessible: bool | None

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, getattr(vim, self.type, vim.Network), self.moid)


def resolve_network(session: Session, ref: str) -> NetworkRef:
    """The network or distributed port group ``ref`` names (exact name or moid)."""
    objects = sweep(session, [Query(vim.Network, ("name", "summary.accessible"))])
    found = _pick(session, _NETWORK, ref, objects)
    vim_name = {"DistributedVirtualPortgroup": "dvs.DistributedVirtualPortgroup"}.get(found.type, found.type)
    return NetworkRef(found.moid, found.props.get("name", found.moid), vim_name,
                      found.props.get("summary.accessible"))


@dataclass(frozen=True)
class PoolRef:
    """A resource pool (or vApp); ``owner`` is the name of the cluster or standalone host it belongs to."""

    moid: str
    name: str
    owner: str | None
    owner_moid: str | None
    vapp: bool = False

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.VirtualApp if self.vapp else vim.ResourcePool, self.moid)


def resolve_pool(session: Session, ref: str) -> PoolRef:
    """The resource pool ``ref`` names (exact name, ``owner/name`` or moid).

    Every cluster's root pool is called ``Resources``: ``DC0_C0/Resources`` names one of them.
    """
    objects = sweep(session, [Query(vim.ResourcePool, ("name", "owner")),
                              Query(vim.ComputeResource, ("name",))])
    groups = by_type(objects)
    owners = {o.moid: o.props.get("name") for group in ("ComputeResource", "ClusterComputeResource")
              for o in groups.get(group, [])}
    pools = groups.get("ResourcePool", []) + groups.get("VirtualApp", [])

    def names(o: ObjectProps) -> tuple[str, ...]:
        name = o.props.get("name", "")
        return (name, f"{owners.get(o.props.get('owner', ''), '')}/{name}")

    found = _pick(session, _POOL, ref, pools, names)
    owner = found.props.get("owner")
    return PoolRef(found.moid, found.props.get("name", found.moid), owners.get(owner) if owner else None,
                   owner, vapp=found.type == "VirtualApp")


@dataclass(frozen=True)
class FolderRef:
    """A folder: ``path`` is its inventory path; ``child_types`` what it may hold (``VirtualMachine``...)."""

    moid: str
    name: str
    path: str | None
    child_types: tuple[str, ...]

    def managed_object(self, session: Session) -> Any:
        return managed_object(session, vim.Folder, self.moid)


def folder_tree(session: Session, extra: Sequence[str] = ()) -> tuple[FolderTree, list[ObjectProps]]:
    """Every folder and datacenter (name, parent and ``extra`` paths of folders) from one sweep."""
    objects = sweep(session, [Query(vim.Folder, ("name", "parent", *extra)),
                              Query(vim.Datacenter, ("name", "parent"))])
    return FolderTree.from_objects(objects, session.content.rootFolder._moId), objects


def resolve_folder(session: Session, ref: str) -> FolderRef:
    """The folder ``ref`` names: its moid, its inventory path (``/DC0/vm/prod``) or its exact name."""
    tree, objects = folder_tree(session, ("childType",))
    folders = [o for o in objects if o.type == "Folder" and o.moid != tree.root]
    found = _pick(session, _FOLDER, ref, folders,
                 lambda o: (o.props.get("name", ""), tree.path(o.moid) or "", (tree.path(o.moid) or "")[1:]))
    return FolderRef(found.moid, found.props.get("name", found.moid), tree.path(found.moid),
                     tuple(found.props.get("childType", [])))


# --------------------------------------------------------------------------------------------------
# list_vms


@dataclass(frozen=True)
class Lookups:
    """Names the VM rows refer to, read in the same sweep as the VMs."""

    hosts: dict[str, str]
    pools: dict[str, str]
    folders: FolderTree | None


@dataclass(frozen=True)
class Column:
    """A list_vms column: the VM paths it reads, the lookups it needs, how to compute its value."""

    paths: tuple[str, ...]
    needs: frozenset[str]
    value: Callable[[ObjectProps, Lookups], Any]


def _prop(path: str) -> Callable[[ObjectProps, Lookups], Any]:
    return lambda o, _l: o.props.get(path)


def _folder_path(o: ObjectProps, lookups: Lookups) -> str | None:
    return lookups.folders.path(o.props.get("parent")) if lookups.folders else None


_NONE: frozenset[str] = frozenset()
VM_COLUMNS: dict[str, Column] = {
    "moid": Column((), _NONE, lambda o, _l: o.moid),
    "name": Column(("name",), _NONE, _prop("name")),
    "power_state": Column(("runtime.powerState",), _NONE, _prop("runtime.powerState")),
    "connection_state": Column(("runtime.connectionState",), _NONE, _prop("runtime.connectionState")),
    "created_at": Column(("config.createDate",), _NONE, lambda o, _l: iso(o.props.get("config.createDate"))),
    "host": Column(("runtime.host",), frozenset({"hosts"}),
                   lambda o, lk: lk.hosts.get(o.props.get("runtime.host", ""))),
    "guest_ip": Column(("guest.ipAddress",), _NONE, _prop("guest.ipAddress")),
    "cpu": Column(("config.hardware.numCPU",), _NONE, _prop("config.hardware.numCPU")),
    "memory_mb": Column(("config.hardware.memoryMB",), _NONE, _prop("config.hardware.memoryMB")),
    "folder": Column(("parent",), frozenset({"folders"}), _folder_path),
    "resource_pool": Column(("resourcePool",), frozenset({"pools"}),
                            lambda o, lk: lk.pools.get(o.props.get("resourcePool", ""))),
    "template": Column(("config.template",), _NONE, _prop("config.template")),
    "guest_os": Column(("config.guestFullName",), _NONE, _prop("config.guestFullName")),
}
DEFAULT_VM_FIELDS = (
    "moid", "name", "power_state", "connection_state", "created_at", "host", "guest_ip", "cpu", "memory_mb",
)


@dataclass(frozen=True)
class VmQuery:
    """list_vms filters (all must hold) and the columns to return; see ``VM_FILTERS``."""

    name: str | None = None
    regex: UserRegex | None = None
    folder: str | None = None
    resource_pool: str | None = None
    power_state: str | None = None
    connection_state: str | None = None
    created_before: datetime | None = None
    created_after: datetime | None = None
    fields: tuple[str, ...] = DEFAULT_VM_FIELDS
    limit: int | None = None


def _created(o: ObjectProps) -> datetime | None:
    value = o.props.get("config.createDate")
    return value if isinstance(value, datetime) else None


def _before(o: ObjectProps, _lk: Lookups, when: datetime) -> bool:
    created = _created(o)
    return created is not None and created < when


def _after(o: ObjectProps, _lk: Lookups, when: datetime) -> bool:
    created = _created(o)
    return created is not None and created > when


def _in_pool(o: ObjectProps, lk: Lookups, wanted: str) -> bool:
    pool = o.props.get("resourcePool")
    return pool is not None and (pool == wanted or lk.pools.get(pool) == wanted)


@dataclass(frozen=True)
class Filter:
    paths: tuple[str, ...]
    needs: frozenset[str]
    test: Callable[[ObjectProps, Lookups, Any], bool]


VM_FILTERS: dict[str, Filter] = {
    "name": Filter(("name",), _NONE, lambda o, _l, v: o.props.get("name") == v),
    "regex": Filter(("name",), _NONE, lambda o, _l, v: bool(v.search(o.props.get("name", "")))),
    "folder": Filter(("parent",), frozenset({"folders"}),
                     lambda o, lk, v: folder_matches(_folder_path(o, lk), v)),
    "resource_pool": Filter(("resourcePool",), frozenset({"pools"}), _in_pool),
    "power_state": Filter(("runtime.powerState",), _NONE,
                          lambda o, _l, v: o.props.get("runtime.powerState") == v),
    "connection_state": Filter(("runtime.connectionState",), _NONE,
                               lambda o, _l, v: o.props.get("runtime.connectionState") == v),
    "created_before": Filter(("config.createDate",), _NONE, _before),
    "created_after": Filter(("config.createDate",), _NONE, _after),
}
"""A VM without a creation date (older vSphere, the simulator) matches neither date filter."""


def _vm_plan(query: VmQuery) -> tuple[list[Query], list[tuple[Filter, Any]], list[tuple[str, Column]]]:
    unknown = [f for f in query.fields if f not in VM_COLUMNS]
    if unknown:
        raise errors.InvalidArgument("fields", f"unknown column(s) {', '.join(unknown)}; choose from "
                                     f"{', '.join(VM_COLUMNS)}")
    columns = [(name, VM_COLUMNS[name]) for name in dict.fromkeys(query.fields)]
    active = [(VM_FILTERS[k], getattr(query, k)) for k in VM_FILTERS if getattr(query, k) is not None]
    paths = {p for _n, c in columns for p in c.paths} | {p for f, _v in active for p in f.paths} | {"name"}
    needs = {n for _c, c in columns for n in c.needs} | {n for f, _v in active for n in f.needs}
    queries = [Query(vim.VirtualMachine, tuple(sorted(paths)))]
    if "hosts" in needs:
        queries.append(Query(vim.HostSystem, ("name",)))
    if "pools" in needs:
        queries.append(Query(vim.ResourcePool, ("name",)))
    if "folders" in needs:
        queries += [Query(vim.Folder, ("name", "parent")), Query(vim.Datacenter, ("name", "parent"))]
    return queries, active, columns


def vm_rows(objects: Sequence[ObjectProps], query: VmQuery, root_folder: str) -> dict[str, Any]:
    """Filter and shape swept VM objects (plus the host/pool/folder objects swept with them)."""
    _queries, active, columns = _vm_plan(query)
    groups = by_type(objects)
    names = {o.moid: o.props.get("name", o.moid) for o in objects if o.type != "VirtualMachine"}
    needs_folders = any("folders" in c.needs for _n, c in columns) or any(
        "folders" in f.needs for f, _v in active)
    lookups = Lookups(
        hosts=names, pools=names,
        folders=FolderTree.from_objects(objects, root_folder) if needs_folders else None,
    )
    vms = sorted(groups.get("VirtualMachine", []), key=lambda o: (o.props.get("name", ""), o.moid))
    rows = [{name: column.value(o, lookups) for name, column in columns}
            for o in vms if all(f.test(o, lookups, v) for f, v in active)]
    out: dict[str, Any] = {"count": len(rows)}
    if query.limit is not None and len(rows) > query.limit:
        rows = rows[: query.limit]
        out["truncated"] = True
    out["vms"] = rows
    if query.created_before or query.created_after:
        undated = sum(1 for o in vms if _created(o) is None)
        if undated:
            out["without_created_at"] = undated
    return out


def list_vms(session: Session, query: VmQuery, *, fast: bool = True) -> dict[str, Any]:
    """VMs matching ``query`` as rows of the requested columns, from one sweep (a constant number of
    requests however many VMs exist): ``{"vms": [...], "count": n}``, plus ``truncated`` when
    ``limit`` cut the list and ``without_created_at`` (VMs a date filter could not judge)."""
    queries, _active, _columns = _vm_plan(query)
    objects = sweep(session, queries, fast=fast)
    return vm_rows(objects, query, session.content.rootFolder._moId)


# --------------------------------------------------------------------------------------------------
# Hosts, clusters, datastores


_LIST_HOST_PATHS = (
    "name", "parent", "runtime.connectionState", "runtime.powerState", "runtime.inMaintenanceMode",
    "summary.hardware.numCpuCores", "summary.hardware.cpuMhz", "summary.hardware.memorySize",
    "summary.quickStats.overallCpuUsage", "summary.quickStats.overallMemoryUsage", "config.product.version",
    "config.product.build", "vm",
)
_MIB = 1024 * 1024


def _mib(value: int | None) -> int | None:
    return value // _MIB if isinstance(value, int) else None


def _host_row(o: ObjectProps, clusters: Mapping[str, str]) -> dict[str, Any]:
    p = o.props
    return {
        "moid": o.moid, "name": p.get("name"), "cluster": clusters.get(p.get("parent", "")),
        "connection_state": p.get("runtime.connectionState"), "power_state": p.get("runtime.powerState"),
        "maintenance_mode": p.get("runtime.inMaintenanceMode"),
        "cpu_cores": p.get("summary.hardware.numCpuCores"), "cpu_mhz": p.get("summary.hardware.cpuMhz"),
        "memory_mb": _mib(p.get("summary.hardware.memorySize")),
        "cpu_usage_mhz": p.get("summary.quickStats.overallCpuUsage"),
        "memory_usage_mb": p.get("summary.quickStats.overallMemoryUsage"),
        "version": p.get("config.product.version"), "build": p.get("config.product.build"),
        "vm_count": len(p.get("vm", [])),
    }


LIST_HOSTS_QUERIES = (Query(vim.HostSystem, _LIST_HOST_PATHS), Query(vim.ComputeResource, ("name",)))


def host_rows(reader: HasTarget, objects: Sequence[ObjectProps],
              cluster: str | None = None) -> dict[str, Any]:
    """Shape swept (or mirrored) host and compute-resource objects into the list_hosts answer."""
    groups = by_type(objects)
    clusters = {o.moid: o.props.get("name", o.moid) for o in groups.get("ClusterComputeResource", [])}
    hosts = groups.get("HostSystem", [])
    if cluster is not None:
        wanted = _pick(reader, _CLUSTER, cluster, groups.get("ClusterComputeResource", [])).moid
        hosts = [o for o in hosts if o.props.get("parent") == wanted]
    rows = sorted((_host_row(o, clusters) for o in hosts), key=lambda r: (r["name"] or "", r["moid"]))
    return {"hosts": rows, "count": len(rows)}


def list_hosts(session: Session, cluster: str | None = None) -> dict[str, Any]:
    """Hosts (optionally of one cluster, by name or moid) from one sweep: ``{"hosts": [...], "count": n}``."""
    return host_rows(session, sweep(session, LIST_HOSTS_QUERIES), cluster)


_LIST_CLUSTER_PATHS = (
    "name", "parent", "host", "datastore", "summary.numEffectiveHosts", "summary.totalCpu",
    "summary.totalMemory", "summary.effectiveCpu", "summary.effectiveMemory", "overallStatus",
    "configurationEx",
)


def _cluster_row(o: ObjectProps, tree: FolderTree, datacenters: set[str]) -> dict[str, Any]:
    p = o.props
    config = p.get("configurationEx")
    drs = getattr(config, "drsConfig", None)
    das = getattr(config, "dasConfig", None)
    return {
        "moid": o.moid, "name": p.get("name"), "datacenter": tree.datacenter(p.get("parent"), datacenters),
        "host_count": len(p.get("host", [])), "effective_hosts": p.get("summary.numEffectiveHosts"),
        "datastore_count": len(p.get("datastore", [])), "total_cpu_mhz": p.get("summary.totalCpu"),
        "total_memory_mb": _mib(p.get("summary.totalMemory")),
        "effective_cpu_mhz": p.get("summary.effectiveCpu"),
        "effective_memory_mb": p.get("summary.effectiveMemory"), "overall_status": p.get("overallStatus"),
        "drs_enabled": getattr(drs, "enabled", None), "drs_behavior": getattr(drs, "defaultVmBehavior", None),
        "ha_enabled": getattr(das, "enabled", None),
    }


LIST_CLUSTERS_QUERIES = (Query(vim.ClusterComputeResource, _LIST_CLUSTER_PATHS),
                         Query(vim.Folder, ("name", "parent")), Query(vim.Datacenter, ("name", "parent")))


def cluster_rows(objects: Sequence[ObjectProps], root_folder: str) -> dict[str, Any]:
    """Shape swept (or mirrored) cluster, folder and datacenter objects into the list_clusters answer."""
    tree = FolderTree.from_objects(objects, root_folder)
    groups = by_type(objects)
    datacenters = {o.moid for o in groups.get("Datacenter", [])}
    rows = sorted((_cluster_row(o, tree, datacenters) for o in groups.get("ClusterComputeResource", [])),
                  key=lambda r: (r["name"] or "", r["moid"]))
    return {"clusters": rows, "count": len(rows)}


def list_clusters(session: Session) -> dict[str, Any]:
    """Clusters with capacity and DRS/HA switches, from one sweep: ``{"clusters": [...], "count": n}``."""
    objects = sweep(session, LIST_CLUSTERS_QUERIES, objects=True)
    return cluster_rows(objects, session.content.rootFolder._moId)


_LIST_DATASTORE_PATHS = (
    "name", "summary.type", "summary.capacity", "summary.freeSpace", "summary.uncommitted",
    "summary.accessible", "summary.maintenanceMode", "summary.url", "vm",
)


def _datastore_row(o: ObjectProps) -> dict[str, Any]:
    p = o.props
    capacity, free = p.get("summary.capacity"), p.get("summary.freeSpace")
    provisioned = None
    if capacity is not None:
        provisioned = capacity - (free or 0) + (p.get("summary.uncommitted") or 0)
    return {
        "moid": o.moid, "name": p.get("name"), "type": p.get("summary.type"), "capacity_mb": _mib(capacity),
        "free_mb": _mib(free), "provisioned_mb": _mib(provisioned),
        "accessible": p.get("summary.accessible"), "maintenance_mode": p.get("summary.maintenanceMode"),
        "url": p.get("summary.url"), "vm_count": len(p.get("vm", [])),
    }


LIST_DATASTORES_QUERIES = (Query(vim.Datastore, _LIST_DATASTORE_PATHS),)


def datastore_rows(objects: Sequence[ObjectProps]) -> dict[str, Any]:
    """Shape swept (or mirrored) datastore objects into the list_datastores answer."""
    rows = sorted((_datastore_row(o) for o in objects if o.type == "Datastore"),
                  key=lambda r: (r["name"] or "", r["moid"]))
    return {"datastores": rows, "count": len(rows)}


def list_datastores(session: Session) -> dict[str, Any]:
    """Datastores with type, space and accessibility: ``{"datastores": [...], "count": n}``."""
    return datastore_rows(sweep(session, LIST_DATASTORES_QUERIES))


# --------------------------------------------------------------------------------------------------
# Details (data objects: decoded by pyVmomi)


_NETWORK_TYPES = ("Network", "DistributedVirtualPortgroup", "OpaqueNetwork")


def _one(objects: Sequence[ObjectProps], moid: str) -> Props:
    return next((o.props for o in objects if o.moid == moid), {})


def _names(objects: Sequence[ObjectProps], type_names: Sequence[str]) -> dict[str, str]:
    return {o.moid: o.props.get("name", o.moid) for o in objects if o.type in type_names}


_VM_DETAIL_PATHS = (
    "config.guestFullName", "config.guestId", "config.annotation", "config.uuid", "config.instanceUuid",
    "config.version", "config.hardware.numCPU", "config.hardware.numCoresPerSocket",
    "config.hardware.memoryMB", "config.hardware.device", "config.createDate", "config.files.vmPathName",
    "guest.ipAddress", "guest.hostName", "guest.toolsRunningStatus", "guest.toolsVersionStatus2",
    "guest.guestState", "guest.net",
    "runtime.bootTime", "summary.quickStats.overallCpuUsage", "summary.quickStats.guestMemoryUsage",
    "summary.quickStats.uptimeSeconds", "summary.storage.committed", "summary.storage.uncommitted",
    "snapshot.currentSnapshot", "datastore", "network", "overallStatus",
)
_VM_DETAIL_TRAVERSAL = (
    traverse("vmDatastores", vim.VirtualMachine, "datastore"),
    traverse("vmNetworks", vim.VirtualMachine, "network"),
)


def _device_rows(devices: Sequence[Any], networks: Mapping[str, str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"disks": [], "nics": [], "cdroms": []}
    for device in devices or []:
        label = device.deviceInfo.label if device.deviceInfo else str(device.key)
        backing = device.backing
        connected = device.connectable.connected if device.connectable else None
        if isinstance(device, vim.vm.device.VirtualDisk):
            out["disks"].append({
                "label": label, "key": device.key, "capacity_mb": (device.capacityInKB or 0) // 1024,
                "file": getattr(backing, "fileName", None), "thin": getattr(backing, "thinProvisioned", None),
            })
        elif isinstance(device, vim.vm.device.VirtualEthernetCard):
            port = getattr(backing, "port", None)
            portgroup = getattr(port, "portgroupKey", None)
            network = getattr(backing, "deviceName", None) or networks.get(portgroup or "")
            if network is None and getattr(backing, "network", None) is not None:
                network = networks.get(backing.network._moId, backing.network._moId)
            out["nics"].append({
                "label": label, "key": device.key, "mac": device.macAddress, "connected": connected,
                "network": network, "portgroup_key": portgroup,
                "adapter": type(device).__name__.rsplit(".", 1)[-1],
            })
        elif isinstance(device, vim.vm.device.VirtualCdrom):
            out["cdroms"].append({"label": label, "key": device.key, "connected": connected,
                                  "iso": getattr(backing, "fileName", None)})
    return out


def _guest_nics(nets: Sequence[Any] | None) -> list[dict[str, Any]]:
    return [{"network": n.network, "mac": n.macAddress, "connected": n.connected,
             "ip_addresses": list(n.ipAddress or [])} for n in nets or []]


Lookup = Callable[[Any, str], str | None]
"""``lookup(vim_type, ref)``: the moid the caller already knows ``ref`` names (a live inventory mirror's
index), or None. A hint only: a read given one checks it against what it reads live and searches as
usual when the object is gone or no longer carries that name."""


def get_vm_details(session: Session, ref: str, lookup: Lookup | None = None) -> dict[str, Any]:
    """One VM in depth: identity, placement facts, hardware and devices, guest, storage, networks.

    With a ``lookup`` hint the name search (a sweep of every VM's name) is skipped when the hinted VM,
    read live, still is ``ref`` (its moid or its current name)."""
    hinted = lookup(vim.VirtualMachine, ref) if lookup is not None and ref else None
    if hinted is not None:
        details = _vm_details(session, hinted)
        if details is not None and ref in (details["moid"], details["name"]):
            return details
    # The name sweep, then ONE retrieval for both the placement facts and the details (they used to be
    # two round trips: resolve_vm's facts, then the details).
    details = _vm_details(session, _find(session, _VM, ref))
    if details is None:  # deleted between the two reads
        raise _not_found(session, _VM, ref)
    return details


def vm_details_spec(session: Session, moid: str) -> Any:
    """The one retrieval get_vm_details makes for VM ``moid``: its placement facts and details, and the
    names of what they refer to (host, cluster, folders, datastores, networks)."""
    paths = {**_VM_FACT_PATHS, vim.Datastore: ("name",), vim.Network: ("name",)}
    paths[vim.VirtualMachine] = tuple(dict.fromkeys(_VM_FACT_PATHS[vim.VirtualMachine] + _VM_DETAIL_PATHS))
    return object_spec(managed_object(session, vim.VirtualMachine, moid), paths,
                       _VM_FACT_TRAVERSAL + _VM_DETAIL_TRAVERSAL)


def _vm_details(session: Session, moid: str) -> dict[str, Any] | None:
    """get_vm_details' answer for the VM ``moid``, read in one retrieval; None when it does not exist."""
    try:
        objects = retrieve_objects(session, vm_details_spec(session, moid))
    except vmodl.fault.ManagedObjectNotFound:
        return None
    if not any(o.moid == moid for o in objects):
        return None
    vm = _vm_ref(session, moid, objects)
    p = _one(objects, vm.moid)
    networks = _names(objects, _NETWORK_TYPES)
    datastores = _names(objects, ("Datastore",))
    current = p.get("snapshot.currentSnapshot")
    return {
        **vm.facts(),
        "guest_os": p.get("config.guestFullName"), "guest_id": p.get("config.guestId"),
        "annotation": p.get("config.annotation"), "uuid": p.get("config.uuid"),
        "instance_uuid": p.get("config.instanceUuid"), "hardware_version": p.get("config.version"),
        "cpu": p.get("config.hardware.numCPU"),
        "cores_per_socket": p.get("config.hardware.numCoresPerSocket"),
        "memory_mb": p.get("config.hardware.memoryMB"), "created_at": iso(p.get("config.createDate")),
        "vmx_path": p.get("config.files.vmPathName"), "overall_status": p.get("overallStatus"),
        "guest": {
            "ip_address": p.get("guest.ipAddress"), "hostname": p.get("guest.hostName"),
            "state": p.get("guest.guestState"), "tools_running": p.get("guest.toolsRunningStatus"),
            "tools_version_status": p.get("guest.toolsVersionStatus2"),
            "nics": _guest_nics(p.get("guest.net")),
        },
        "boot_time": iso(p.get("runtime.bootTime")),
        "uptime_seconds": p.get("summary.quickStats.uptimeSeconds"),
        "cpu_usage_mhz": p.get("summary.quickStats.overallCpuUsage"),
        "guest_memory_usage_mb": p.get("summary.quickStats.guestMemoryUsage"),
        "storage_committed_mb": _mib(p.get("summary.storage.committed")),
        "storage_uncommitted_mb": _mib(p.get("summary.storage.uncommitted")),
        "datastores": sorted(datastores.values()), "networks": sorted(networks.values()),
        "current_snapshot": current,
        **_device_rows(p.get("config.hardware.device") or [], networks),
    }


_HOST_DETAIL_PATHS = (
    "summary.hardware.vendor", "summary.hardware.model", "summary.hardware.cpuModel",
    "summary.hardware.numCpuPkgs", "summary.hardware.numCpuCores", "summary.hardware.numCpuThreads",
    "summary.hardware.cpuMhz", "summary.hardware.memorySize", "summary.quickStats.overallCpuUsage",
    "summary.quickStats.overallMemoryUsage", "summary.quickStats.uptime", "config.product.fullName",
    "config.product.version", "config.product.build", "runtime.bootTime", "overallStatus", "datastore",
    "network", "vm",
)
_HOST_DETAIL_TRAVERSAL = (
    traverse("hostDatastores", vim.HostSystem, "datastore"),
    traverse("hostNetworks", vim.HostSystem, "network"),
    traverse("hostVms", vim.HostSystem, "vm"),
)


def get_host_details(session: Session, ref: str) -> dict[str, Any]:
    """One host in depth: hardware, product, states, usage, and the names of its datastores, networks, VMs."""
    host = resolve_host(session, ref)
    objects = retrieve(session, object_spec(
        host.managed_object(session),
        {vim.HostSystem: _HOST_DETAIL_PATHS, vim.Datastore: ("name",), vim.Network: ("name",),
         vim.VirtualMachine: ("name",)},
        _HOST_DETAIL_TRAVERSAL))
    p = _one(objects, host.moid)
    return {
        "moid": host.moid, "name": host.name, "cluster": host.cluster,
        "connection_state": host.connection_state,
        "power_state": host.power_state, "maintenance_mode": host.in_maintenance,
        "vendor": p.get("summary.hardware.vendor"), "model": p.get("summary.hardware.model"),
        "cpu_model": p.get("summary.hardware.cpuModel"), "cpu_packages": p.get("summary.hardware.numCpuPkgs"),
        "cpu_cores": p.get("summary.hardware.numCpuCores"),
        "cpu_threads": p.get("summary.hardware.numCpuThreads"),
        "cpu_mhz": p.get("summary.hardware.cpuMhz"), "memory_mb": _mib(p.get("summary.hardware.memorySize")),
        "cpu_usage_mhz": p.get("summary.quickStats.overallCpuUsage"),
        "memory_usage_mb": p.get("summary.quickStats.overallMemoryUsage"),
        "uptime_seconds": p.get("summary.quickStats.uptime"), "product": p.get("config.product.fullName"),
        "version": p.get("config.product.version"), "build": p.get("config.product.build"),
        "boot_time": iso(p.get("runtime.bootTime")), "overall_status": p.get("overallStatus"),
        "datastores": sorted(_names(objects, ("Datastore",)).values()),
        "networks": sorted(_names(objects, _NETWORK_TYPES).values()),
        "vms": sorted(_names(objects, ("VirtualMachine",)).values()),
    }


_CLUSTER_DETAIL_TRAVERSAL = (
    traverse("clusterHosts", vim.ComputeResource, "host"),
    traverse("clusterDatastores", vim.ComputeResource, "datastore"),
    traverse("clusterPool", vim.ComputeResource, "resourcePool", "childPools"),
    traverse("childPools", vim.ResourcePool, "resourcePool", "childPools"),
)


def get_cluster_details(session: Session, ref: str) -> dict[str, Any]:
    """One cluster: capacity, DRS/HA, its hosts (with states), datastores and resource pools."""
    cluster = resolve_cluster(session, ref)
    objects = retrieve_objects(session, object_spec(
        cluster.managed_object(session),
        {vim.ClusterComputeResource: _LIST_CLUSTER_PATHS, vim.HostSystem: _HOST_PATHS,
         vim.Datastore: ("name",), vim.ResourcePool: ("name", "parent")},
        _CLUSTER_DETAIL_TRAVERSAL))
    groups = by_type(objects)
    me = next(o for o in groups.get("ClusterComputeResource", []) if o.moid == cluster.moid)
    tree = FolderTree({}, {}, session.content.rootFolder._moId)
    row = _cluster_row(me, tree, set())
    row.pop("datacenter")
    hosts = [{"moid": o.moid, "name": o.props.get("name"),
              "connection_state": o.props.get("runtime.connectionState"),
              "power_state": o.props.get("runtime.powerState"),
              "maintenance_mode": o.props.get("runtime.inMaintenanceMode")}
             for o in groups.get("HostSystem", [])]
    pool_names = _names(objects, ("ResourcePool", "VirtualApp"))
    pools = [{"moid": o.moid, "name": o.props.get("name"),
              "parent": pool_names.get(o.props.get("parent", ""))}
             for o in groups.get("ResourcePool", []) + groups.get("VirtualApp", [])]
    return {
        **row, "hosts": sorted(hosts, key=lambda h: h["name"] or ""),
        "datastores": sorted(_names(objects, ("Datastore",)).values()),
        "resource_pools": sorted(pools, key=lambda r: r["name"] or ""),
    }


def get_datastore_details(session: Session, ref: str) -> dict[str, Any]:
    """One datastore: space, type, URL, the hosts that mount it (with mount state) and its VMs."""
    ds = resolve_datastore(session, ref)
    objects = retrieve_objects(session, object_spec(
        ds.managed_object(session),
        {vim.Datastore: ("summary", "host", "info.name", "vm"), vim.VirtualMachine: ("name",)},
        (traverse("dsVms", vim.Datastore, "vm"),)))
    p = _one(objects, ds.moid)
    hosts = sweep(session, [Query(vim.HostSystem, ("name",))])
    host_names = {o.moid: o.props.get("name", o.moid) for o in hosts}
    mounts = [{"host": host_names.get(m.key._moId, m.key._moId), "accessible": m.mountInfo.accessible,
               "mounted": m.mountInfo.mounted, "mode": m.mountInfo.accessMode} for m in p.get("host") or []]
    summary = p.get("summary")
    fields = ("type", "capacity", "freeSpace", "uncommitted", "accessible", "maintenanceMode", "url")
    props = {f"summary.{f}": getattr(summary, f, None) for f in fields}
    props.update(name=ds.name, vm=[o.moid for o in objects if o.type == "VirtualMachine"])
    row = _datastore_row(ObjectProps("Datastore", ds.moid, props))
    return {**row, "hosts": sorted(mounts, key=lambda m: m["host"]),
            "vms": sorted(_names(objects, ("VirtualMachine",)).values())}


# --------------------------------------------------------------------------------------------------
# Snapshots


def flatten_snapshots(roots: Sequence[Any], current: str | None) -> list[dict[str, Any]]:
    """A snapshot tree (``VirtualMachineSnapshotTree`` nodes) as a depth-first list with parent links."""
    rows: list[dict[str, Any]] = []

    def walk(nodes: Sequence[Any], parent: Any, depth: int) -> None:
        for node in nodes or []:
            moid = node.snapshot._moId if node.snapshot is not None else None
            rows.append({
                "moid": moid, "name": node.name, "description": node.description or "",
                "created": iso(node.createTime), "state": node.state, "quiesced": node.quiesced,
                "parent": parent, "depth": depth, "current": moid is not None and moid == current,
                "id": node.id,
            })
            walk(node.childSnapshotList, moid, depth + 1)

    walk(roots, None, 0)
    return rows


def read_snapshot_info(session: Session, vm_moid: str) -> Any:
    """The VM's ``snapshot`` property (``None`` when it has none), read through the PropertyCollector:
    the simulator's property accessor fails on VMs without snapshots."""
    vm = managed_object(session, vim.VirtualMachine, vm_moid)
    objects = retrieve_objects(session, object_spec(vm, {vim.VirtualMachine: ("snapshot",)}))
    return _one(objects, vm_moid).get("snapshot")


def list_snapshots(session: Session, ref: str) -> dict[str, Any]:
    """The VM's snapshots, flattened depth-first: ``{"vm", "snapshots": [...], "count", "current"}``."""
    vm = resolve_vm(session, ref)
    info = read_snapshot_info(session, vm.moid)
    current = info.currentSnapshot._moId if info is not None and info.currentSnapshot is not None else None
    rows = flatten_snapshots(info.rootSnapshotList if info is not None else [], current)
    return {"vm": vm.name, "vm_moid": vm.moid, "snapshots": rows, "count": len(rows), "current": current}


# --------------------------------------------------------------------------------------------------
# The endpoint and the session's own account


def about(session: Session) -> dict[str, Any]:
    """Product facts of the endpoint (no request: read at login). ``instance_uuid`` is None on ESXi."""
    info = session.content.about
    return {
        "product": info.name, "full_name": info.fullName, "version": info.version, "build": info.build,
        "api_type": info.apiType, "api_version": info.apiVersion,
        "instance_uuid": getattr(info, "instanceUuid", None) or None,
    }


@dataclass(frozen=True)
class PrivilegeCheck:
    """Which ``privileges`` the session holds on the root folder: True, False, or None (undetermined)."""

    user: str | None
    held: dict[str, bool | None]
    error: str | None = None


def check_privileges(session: Session, privileges: Sequence[str]) -> PrivilegeCheck:
    """Ask the target whether this session holds ``privileges`` at the root folder.

    Uses ``HasPrivilegeOnEntities`` (needs only System.View), falling back to
    ``FetchUserPrivilegeOnEntities``. A lookup that fails leaves every privilege undetermined (None),
    never granted; ``error`` then names the fault.
    """
    content = session.content
    wanted = sorted(set(privileges))
    undetermined: dict[str, bool | None] = dict.fromkeys(wanted)
    try:
        current = content.sessionManager.currentSession
    except vmodl.MethodFault as exc:
        return PrivilegeCheck(None, undetermined, type(exc).__name__)
    if current is None:
        return PrivilegeCheck(None, undetermined, "the target reports no current session")
    if not wanted:
        return PrivilegeCheck(current.userName, {})
    manager = content.authorizationManager
    try:
        result = manager.HasPrivilegeOnEntities([content.rootFolder], current.key, wanted)
    except vmodl.MethodFault as first:
        try:
            fetched = manager.FetchUserPrivilegeOnEntities([content.rootFolder], current.userName)
        except vmodl.MethodFault:
            return PrivilegeCheck(current.userName, undetermined, type(first).__name__)
        held = {p for r in fetched or [] for p in r.privileges or []}
        return PrivilegeCheck(current.userName, {p: p in held for p in wanted})
    granted = {a.privId: bool(a.isGranted) for r in result or [] for a in r.privAvailability or []}
    return PrivilegeCheck(current.userName, {p: granted.get(p) for p in wanted})
