"""The PropertyCollector transport: filter specs, ``retrieve`` with continuation tokens, and sweeps.

A sweep reads scalar properties of every object of some types through a ContainerView the session
keeps (``views``), as plain values. On a ``SoapStubAdapter`` replies are decoded by ``soap_scan``
instead of pyVmomi's deserializer, each page while the server computes the next; a failed reply is
still decoded by pyVmomi, so faults surface as from any call. Runs in the target's worker thread.
"""

from __future__ import annotations

import re
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
    MalformedReply,
    ObjectProps,
    Page,
    parse_retrieve_result,
)
from gateway.vsphere.views import ViewCache

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

    @property
    def views(self) -> ViewCache: ...


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


def _page_from_result(result: Any, value: Callable[[str, Any], Any]) -> Page:
    if result is None:
        return Page([], None)
    objects = []
    for content in result.objects or []:
        props = {str(p.name): value(p.name, p.val) for p in content.propSet or [] if p.val is not None}
        missing = tuple(m.path for m in (content.missingSet or []))
        objects.append(ObjectProps(content.obj._wsdlName, content.obj._moId, props, missing))
    return Page(objects, result.token or None)


PageSink = Callable[[list[ObjectProps]], None]
"""Called with each page's objects as soon as it is decoded, in order (``sweep``'s ``each_page``): a
reader can work on one page while the target computes the next. Given one, a retrieval hands its
objects to it only and returns an empty list, so a page the reader is done with is freed at once."""


def collect_pages(
    first: Page, more: Callable[[str], Page], cancel: Callable[[str], None],
    each_page: PageSink | None = None,
) -> list[ObjectProps]:
    """All objects of a paged retrieval: follow continuation tokens until none is left, each page
    handed to ``each_page`` as it comes.

    If fetching a page (or ``each_page``) fails, the outstanding token is cancelled (best effort)
    before re-raising so the server can free the result set.
    """
    objects: list[ObjectProps] = []
    sink = objects.extend if each_page is None else each_page
    token = first.token
    try:
        sink(first.objects)
        while token:
            page = more(token)
            token = page.token
            sink(page.objects)
    except BaseException:
        if token:
            with suppress(Exception):
                cancel(token)
        raise
    return objects


MAX_REPLY_BYTES = 1 << 30
"""The most a retrieval reads or inflates over all its pages (1 GiB: about 850,000 VMs of list_vms
columns); past it the call fails as ``ReplyTooLarge`` instead of exhausting the gateway's memory."""
PAGE_OBJECTS = 1000
"""``RetrieveOptions.maxObjects`` of every retrieval: vSphere sends at most this many objects per reply
(about 1.2 MB of list_vms columns) and a token for the rest. The gateway decodes each page while the
server computes the next one, so only the last page's decode (5 ms at most) follows the last byte;
larger pages would lengthen it, smaller ones add round trips (30 pages for 30,000 VMs)."""
_READ_BYTES = 1 << 23  # pieces of a chunked reply: few enough that joining them costs one more copy
_TOKEN = re.compile(rb"<returnval><token>([^<&]{1,512})</token>")
"""A page's continuation token where vSphere writes it, first in the result: read before the page is
decoded, so the next page is asked for first (the decoded page's token is checked against it)."""


def retrieve_options() -> Any:
    """The options of every retrieval the gateway makes: pages of ``PAGE_OBJECTS``."""
    return PC.RetrieveOptions(maxObjects=PAGE_OBJECTS)


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
    return _Call(stub, mo, method, args).reply()


def continuation_token(body: bytes) -> str | None:
    """The token of a ``RetrievePropertiesEx``/``ContinueRetrievePropertiesEx`` reply as vSphere writes it
    (first in the result), without decoding the reply; None when there is none or it is written
    otherwise (the decoded page's token then decides)."""
    found = _TOKEN.search(body, 0, 4096)
    return found.group(1).decode() if found else None


class _Call:
    """One SOAP request sent on a connection of the stub's pool; ``reply()`` reads its answer.

    Between the two the connection is this call's alone, so the caller can do other work (decode the
    previous page) while the server computes the reply.
    """

    def __init__(self, stub: Any, mo: Any, method: str, args: Sequence[Any]) -> None:
        self.stub = stub
        self.info = mo._GetMethodInfo(method)
        request = stub.SerializeRequest(mo, self.info, list(args))
        for modifier in stub.requestModifierList:
            request = modifier(request)
        headers = {"Cookie": stub.cookie, "SOAPAction": stub.versionId,
                   "Content-Type": "text/xml; charset=UTF-8"}
        headers.update(getattr(stub, "_customHeaders", None) or {})
        if getattr(stub, "_acceptCompressedResponses", False):
            headers["Accept-Encoding"] = "gzip, deflate"
        self.conn = stub.GetConnection()
        self._guarded(lambda: self.conn.request("POST", stub.path, request, headers))

    def _guarded(self, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except (OSError, HTTPException):
            self.conn.close()
            self.stub.DropConnections()
            raise
        except BaseException:  # the exchange did not finish: the connection cannot be reused
            self.conn.close()
            raise

    def reply(self, limit: int = MAX_REPLY_BYTES) -> bytes:
        """The 200 reply's body (inflated), at most ``limit`` bytes; faults raise as in ``soap_call``."""
        def read() -> tuple[Any, str, bytes]:
            response = self.conn.getresponse()
            encoding = (response.getheader("Content-Encoding") or "identity").lower()
            return response, encoding, _read_bounded(response, limit)

        response, encoding, body = self._guarded(read)
        if response.status in (200, 500):
            self.stub.ReturnConnection(self.conn)
        else:
            self.conn.close()
        cookie = response.getheader("Set-Cookie")
        if cookie:
            self.stub.cookie = cookie
        body = _decompress(body, encoding, limit)
        if response.status == 200:
            return body
        if response.status == 500:
            fault = _Deserializer(self.stub).Deserialize(body, self.info.result)
            if isinstance(fault, BaseException):
                raise fault
        raise HTTPException(f"{response.status} {response.reason}")


def _read_bounded(response: Any, limit: int) -> bytes:
    """The whole body of ``response``, or ``ReplyTooLarge`` once more than ``limit`` bytes arrived
    (with a Content-Length, before reading any)."""
    if response.length is not None:
        if response.length > limit:
            raise ReplyTooLarge(limit)
        body: bytes = response.read()
        return body
    pieces: list[bytes] = []
    size = 0
    while piece := response.read(_READ_BYTES):
        size += len(piece)
        if size > limit:
            raise ReplyTooLarge(limit)
        pieces.append(piece)
    return b"".join(pieces)


def retrieve_pipelined(stub: Any, collector: Any, spec: Any,
                       decode: Callable[[bytes], Page] | None = None,
                       each_page: PageSink | None = None) -> list[ObjectProps]:
    """Every object of a paged retrieval over pyVmomi's ``stub``, each page decoded by ``decode``
    (``parse_retrieve_result``) and handed to ``each_page`` while the server computes the next: the
    continuation is sent as soon as a page's bytes are read.

    The pages together are bounded by ``MAX_REPLY_BYTES``. If a page fails (its reply, its decode or
    ``each_page``), the outstanding token is cancelled (best effort) before the error is raised, so the
    server can free the rest of the result.
    """
    decode = decode or parse_retrieve_result
    budget = MAX_REPLY_BYTES
    body = _Call(stub, collector, "RetrievePropertiesEx", [[spec], retrieve_options()]).reply(budget)
    objects: list[ObjectProps] = []
    sink = objects.extend if each_page is None else each_page
    while True:
        budget -= len(body)
        token = continuation_token(body)
        following = _Call(stub, collector, "ContinueRetrievePropertiesEx", [token]) if token else None
        try:
            page = decode(body)
            if token is not None and page.token != token:
                raise MalformedReply(f"the reply's continuation token is not the one it starts with "
                                     f"({page.token!r}, not {token!r})")
            sink(page.objects)
        except BaseException:
            if following is not None:
                _abandon(following, collector)
            raise
        if following is None:
            if not page.token:
                return objects
            token = page.token  # written otherwise: asked for after the decode
        try:
            following = following or _Call(stub, collector, "ContinueRetrievePropertiesEx", [token])
            body = following.reply(budget)
        except BaseException:
            with suppress(Exception):
                collector.CancelRetrievePropertiesEx(token)
            raise


def _abandon(call: _Call, collector: Any) -> None:
    """Read the reply of a continuation nobody will decode and cancel the rest of its result."""
    with suppress(Exception):
        token = continuation_token(call.reply())
        if token:
            collector.CancelRetrievePropertiesEx(token)


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


def retrieve(session: Session, spec: Any, *, fast: bool = True,
             each_page: PageSink | None = None) -> list[ObjectProps]:
    """Every object ``spec`` (a ``PropertyCollector.FilterSpec``) selects, with plain values; each page's
    objects handed to ``each_page`` as it is decoded.

    ``fast=False`` forces pyVmomi's own decoding (the results are the same; tests compare them).
    """
    collector = session.content.propertyCollector
    stub = session.si._stub
    if fast and _accepts_raw(stub):
        return retrieve_pipelined(stub, collector, spec, each_page=each_page)
    return _retrieve_pyvmomi(collector, spec, strict=True, each_page=each_page)


def _retrieve_pyvmomi(collector: Any, spec: Any, strict: bool,
                      each_page: PageSink | None = None) -> list[ObjectProps]:
    return retrieve_with(collector, spec, lambda name, value: _plain(name, value, strict), each_page)


def retrieve_with(collector: Any, spec: Any, value: Callable[[str, Any], Any],
                  each_page: PageSink | None = None) -> list[ObjectProps]:
    """Every object ``spec`` selects, decoded by pyVmomi page after page (``collect_pages``), each set
    property as ``value(name, pyVmomi's value)``; unset ones are absent."""
    first = _page_from_result(collector.RetrievePropertiesEx([spec], retrieve_options()), value)
    return collect_pages(
        first, lambda token: _page_from_result(collector.ContinueRetrievePropertiesEx(token), value),
        collector.CancelRetrievePropertiesEx, each_page)


def retrieve_objects(session: Session, spec: Any, each_page: PageSink | None = None) -> list[ObjectProps]:
    """Like ``retrieve``, decoded by pyVmomi: references still become moids, but data objects
    (``config.hardware.device``, ``snapshot``...) stay pyVmomi objects. For detail reads."""
    return _retrieve_pyvmomi(session.content.propertyCollector, spec, False, each_page)


def _view_spec(view: Any, queries: Sequence[Query]) -> Any:
    traverse = PC.TraversalSpec(name="view", type=vim.view.ContainerView, path="view", skip=False)
    return PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=view, skip=True, selectSet=[traverse])],
        propSet=[PC.PropertySpec(type=q.type, pathSet=list(q.paths)) for q in queries],
    )


def sweep(session: Session, queries: Sequence[Query], *, root: Any = None, fast: bool = True,
          objects: bool = False, each_page: PageSink | None = None) -> list[ObjectProps]:
    """Read ``queries`` over every object of their types under ``root`` (default: the root folder),
    through the session's view of that root and those types (``views``: made once, then reused).

    ``objects=True`` decodes like ``retrieve_objects`` (data-object paths allowed, slower).
    ``each_page`` gets each page's objects as it is decoded (``PageSink``), before the next is read.
    A kept view the server no longer knows is forgotten and the sweep made once more through a new one.
    """
    content = session.content
    where = root or content.rootFolder
    types = [q.type for q in queries]
    while True:
        view, made = session.views.view(content, where, types)
        spec = _view_spec(view, queries)
        try:
            if objects:
                return retrieve_objects(session, spec, each_page)
            return retrieve(session, spec, fast=fast, each_page=each_page)
        except vmodl.fault.ManagedObjectNotFound as fault:
            if made or getattr(fault.obj, "_moId", None) != view._moId:
                raise  # not the view, or a view made just now: the server's answer stands
            session.views.forget(view)  # the first request failed: no page was read through it


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
