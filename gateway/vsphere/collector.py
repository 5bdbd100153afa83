"""The PropertyCollector transport: filter specs, ``retrieve`` with continuation tokens, and sweeps.

Sweeps
    ``sweep(session, queries)`` reads the given properties of every object of the given types: one
    ContainerView over the types, one ``RetrievePropertiesEx`` (plus one
    ``ContinueRetrievePropertiesEx`` per further page the server hands back), then the view is
    destroyed. The number of requests does not grow with the number of objects except through the
    server's own paging. Values come back plain (``Props``): ``str``, ``int``, ``float``, ``bool``,
    aware ``datetime``, a moid ``str`` for an object reference, or a list of those; unset or
    unreadable properties are absent. Only such scalar paths may be swept.

    On a ``SoapStubAdapter`` the reply is decoded by ``soap_scan`` instead of pyVmomi's
    object deserializer, which costs several times more than the request itself on large inventories;
    it is fed to the decoder in pieces as it is read (``soap_retrieve``), so the objects received are
    decoded while the rest arrives.
    The request is still built, sent (same connection pool, cookie, request modifiers) and, when it
    fails, decoded into a fault by pyVmomi, so faults surface exactly as from any other call.

Every function takes a session with ``target``, ``si`` and ``content`` (``pool.VSphereSession``)
and must run in that target's worker thread. pyVmomi faults propagate untranslated; the session
pool turns them into gateway errors.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from http.client import HTTPException
from typing import Any, Protocol

from pyVmomi import VmomiSupport, vim, vmodl
from pyVmomi.SoapAdapter import SoapResponseDeserializer, SoapStubAdapter

from gateway.config import Target
from gateway.vsphere.soap_scan import (
    ComplexValueError,
    ObjectProps,
    Page,
    ReplyScanner,
    parse_retrieve_result,
)

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


@dataclass(frozen=True)
class Query:
    """The properties to read of every object of ``type`` (a pyVmomi managed object class)."""

    type: Any
    paths: tuple[str, ...]


def iso(value: datetime | None) -> str | None:
    """An aware datetime as ISO-8601 in UTC (``...+00:00``); ``None`` stays ``None``."""
    return value.astimezone(UTC).isoformat() if value is not None else None


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


MAX_REPLY_BYTES = 1 << 30
"""The largest reply a sweep reads or inflates (1 GiB: about 850,000 VMs of list_vms columns); past it
the call fails as ``ReplyTooLarge`` instead of exhausting the gateway's memory."""
_READ_BYTES = 1 << 23  # pieces of a chunked reply: few enough that joining them costs one more copy
_FEED_BYTES = 1 << 20  # pieces fed to the decoder as they arrive: about 900 VMs of list_vms columns each


class ReplyTooLarge(HTTPException):
    """A reply (or its inflated body) over ``MAX_REPLY_BYTES``: an HTTP-level failure, so the pool reports
    the target ``unreachable`` ("an unexpected HTTP response") with this message."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the reply is larger than {limit:,} bytes; list fewer objects per call")


def _accepts_raw(stub: Any) -> bool:
    return isinstance(stub, SoapStubAdapter)


def soap_call(stub: Any, mo: Any, method: str, args: Sequence[Any]) -> bytes:
    """Send one SOAP call through pyVmomi's stub and return the raw 200 reply body.

    The request goes out exactly as pyVmomi sends it (serializer, request modifiers, session cookie,
    pooled connection). A SOAP fault (HTTP 500) is decoded by pyVmomi and raised; any other status
    raises ``http.client.HTTPException``; a transport error drops the stub's pooled connections.
    """
    body = _exchange(stub, mo, method, args, None)
    assert body is not None
    return body


def soap_retrieve(stub: Any, mo: Any, method: str, args: Sequence[Any]) -> Page:
    """``soap_call`` of a ``RetrievePropertiesEx``/``ContinueRetrievePropertiesEx``, the reply decoded
    (``parse_retrieve_result``). An uncompressed 200 reply is fed to the decoder piece by piece as it
    is read, so decoding the objects already received overlaps receiving the rest."""
    scanner = ReplyScanner()
    body = _exchange(stub, mo, method, args, scanner.feed)
    return scanner.page() if body is None else parse_retrieve_result(body)


def _exchange(stub: Any, mo: Any, method: str, args: Sequence[Any],
              feed: Callable[[bytes], None] | None) -> bytes | None:
    """The call of ``soap_call``; a 200 uncompressed reply goes to ``feed`` when given (None returned)."""
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
        encoding = (response.getheader("Content-Encoding") or "identity").lower()
        streamed = feed is not None and response.status == 200 and encoding == "identity"
        body = _read_bounded(response, MAX_REPLY_BYTES, feed if streamed else None)
    except (OSError, HTTPException):
        conn.close()
        stub.DropConnections()
        raise
    except BaseException:  # the reply was not read to its end: the connection cannot be reused
        conn.close()
        raise
    if response.status in (200, 500):
        stub.ReturnConnection(conn)
    else:
        conn.close()
    cookie = response.getheader("Set-Cookie")
    if cookie:
        stub.cookie = cookie
    if streamed:
        return None
    body = _decompress(body, encoding)
    if response.status == 200:
        return body
    if response.status == 500:
        fault = _Deserializer(stub).Deserialize(body, info.result)
        if isinstance(fault, BaseException):
            raise fault
    raise HTTPException(f"{response.status} {response.reason}")


def _read_bounded(response: Any, limit: int, feed: Callable[[bytes], None] | None = None) -> bytes:
    """The whole body of ``response``, or ``ReplyTooLarge`` once more than ``limit`` bytes arrived
    (with a Content-Length, before reading any). With ``feed``, each piece goes to it as it is read
    and nothing is returned (``b""``)."""
    if response.length is not None and response.length > limit:
        raise ReplyTooLarge(limit)
    if response.length is not None and feed is None:
        body: bytes = response.read()
        return body
    pieces: list[bytes] = []
    size = 0
    while piece := response.read(_READ_BYTES if feed is None else _FEED_BYTES):
        size += len(piece)
        if size > limit:
            raise ReplyTooLarge(limit)
        if feed is None:
            pieces.append(piece)
        else:
            feed(piece)
    return b"".join(pieces)


def _decompress(body: bytes, encoding: str, limit: int | None = None) -> bytes:
    """``body`` inflated, at most ``limit`` bytes (default ``MAX_REPLY_BYTES``; a gzip bomb stops there)."""
    if encoding not in ("gzip", "deflate"):
        return body
    limit = MAX_REPLY_BYTES if limit is None else limit
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise HTTPException(f"the {encoding} reply is corrupt ({exc})") from exc
    if len(out) > limit:
        raise ReplyTooLarge(limit)
    if not inflater.eof:
        raise HTTPException(f"the {encoding} reply is cut short")
    return out


def retrieve(session: Session, spec: Any, *, fast: bool = True) -> list[ObjectProps]:
    """Every object ``spec`` (a ``PropertyCollector.FilterSpec``) selects, with plain values.

    ``fast=False`` forces pyVmomi's own decoding (the results are the same; tests compare them).
    """
    collector = session.content.propertyCollector
    stub = session.si._stub
    if fast and _accepts_raw(stub):
        def fetch(method: str, *args: Any) -> Page:
            return soap_retrieve(stub, collector, method, args)

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
