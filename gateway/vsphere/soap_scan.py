"""Decoding ``RetrievePropertiesEx`` replies into plain objects.

The plain shape vSphere sends for scalar sweeps is read with regular expressions, one compiled per
object shape; anything else goes to ElementTree, giving the same ``ObjectProps``. Its cost against
pyVmomi's decoder: bench/RESULTS.md, "list_vms sweeping ... decode alone" rows.
"""

from __future__ import annotations

import functools
import re
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import CodeType
from typing import Any, NamedTuple
from xml.parsers import expat

Props = dict[str, Any]


@dataclass(slots=True)
class ObjectProps:
    """One object of a retrieval: its type (``VirtualMachine``), moid and plain property values.

    Read-only by convention (a mirror hands the same objects to every reader), not ``frozen``: a frozen
    dataclass sets each field through ``object.__setattr__``, which makes building one several times
    dearer, and a sweep builds one per object."""

    type: str
    moid: str
    props: Props
    missing: tuple[str, ...] = ()


class Page(NamedTuple):
    objects: list[ObjectProps]
    token: str | None


class ComplexValueError(ValueError):
    """A swept path returned a data object; sweeps take only scalar paths (a programming error)."""


class MalformedReply(expat.ExpatError):
    """The reply is not well-formed XML (cut short, garbage) or declares a document type: refused.

    vSphere never sends a DTD; one in a reply could only declare entities (``billion laughs``,
    external files), so the decoder refuses it before anything is expanded. An ``ExpatError``, so the
    session pool reports it as ``unreachable``: "the target answered with malformed XML".
    """


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
    the same objects. Raises ``ComplexValueError`` for a data-object value and ``MalformedReply`` for
    malformed XML or a document type declaration (never expanded).
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
    """``parse_retrieve_result`` through ElementTree, whatever the reply's shape (``MalformedReply`` for
    malformed XML or a document type declaration)."""
    refuse_document_types(body)
    try:
        envelope = ET.fromstring(body)
    except ET.ParseError as exc:  # the check above parsed it already; kept typed all the same
        raise MalformedReply(f"the reply is not well-formed XML ({exc})") from exc
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


def refuse_document_types(body: bytes) -> None:
    """Raise ``MalformedReply`` when ``body`` is not well-formed XML or declares a document type.

    One pass of expat with no handler but the document type's, which raises before the internal subset
    (where entities are declared) is read: no entity is ever declared, expanded or fetched.
    """
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)

    def refuse(*_args: object) -> None:
        raise MalformedReply("the reply declares a document type (DTD); vSphere sends none, so it is "
                             "refused and no entity in it is expanded")

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    try:
        parser.Parse(body, True)
    except expat.ExpatError as exc:
        if isinstance(exc, MalformedReply):
            raise
        raise MalformedReply(f"the reply is not well-formed XML ({exc})") from exc


# The scanner: ElementTree builds ~20 elements per VM and costs several times what the simulator needs
# to answer; matching the known shape with a few regular expressions costs a fifth of that. It accepts
# only compact replies whose every byte it accounts for and otherwise answers None, so whatever it does
# not recognise is left to ElementTree (which also reports malformed XML). In a reply without references
# or carriage returns, an object of a shape already seen (same type, property names and attribute
# strings: every VM of a sweep) is read by one regular expression compiled for that shape (``_Shape``),
# a third cheaper again than matching its properties one by one.
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
        text = _checked_text(body)
        opened, pos = _Open.read(text)
        return opened.close(text, opened.objects_from(text, pos))
    except _FAILURES:
        return None


_FAILURES = (_Unrecognised, UnicodeDecodeError, ValueError, OverflowError)
"""What makes the scanner leave a reply to ElementTree (ValueError/OverflowError: a value that does
not convert; ElementTree will say so)."""


class _Open:
    """A reply's prologue (namespaces in scope, response element, first token) and its objects."""

    def __init__(self, head: re.Match[str], scope: dict[str, str], token: str | None) -> None:
        self.prefix, self.response = head["p"], head["resp"]
        self.token = token
        self.kinds = _Readers(scope)
        self.types: dict[str, str] = {}
        self.shapes = _Shapes(self.kinds)
        self.objects: list[ObjectProps] = []

    @classmethod
    def read(cls, text: str) -> tuple[_Open, int]:
        head = _PROLOGUE.match(text)
        if head is None or not _plain_declaration(head["decl"]):
            raise _Unrecognised
        scope: dict[str, str] = {}
        for attrs in (head["env"], head["body"], head["resp_attrs"]):
            scope.update(_declared(_attributes(attrs)))
        if head["p"] and head["p"][:-1] not in scope:
            raise _Unrecognised
        token, pos = _scan_token(text, head.end(), None)
        return cls(head, scope, token), pos

    def objects_from(self, text: str, pos: int) -> int:
        """Decode the objects of ``text`` from ``pos`` on; where they end."""
        objects, kinds, types = self.objects, self.kinds, self.types
        append = objects.append
        plain = "&" not in text and "\r" not in text  # no references, no line ends to normalise: as is
        shapes = self.shapes if plain else None
        while True:
            shape = shapes.current if shapes is not None else None
            if shape is not None:
                same, read = shape.pattern.match, shape.read
                while (match := same(text, pos)) is not None:  # the run of objects of this shape
                    append(read(match))
                    pos = match.end()
            if (match := _OBJECT.match(text, pos)) is None:
                return pos
            append(_scan_object(match, kinds, types, plain))
            pos = match.end()
            if shapes is not None:
                shapes.learn(match)

    def close(self, text: str, pos: int) -> Page:
        """The page, ``text[pos:]`` being the reply's end: a last token, then the closing tags."""
        token, pos = _scan_token(text, pos, self.token)
        prefix = re.escape(self.prefix)
        epilogue = rf"</returnval></{self.response}>\s*</{prefix}Body>\s*</{prefix}Envelope>\s*"
        if re.fullmatch(epilogue, text[pos:]) is None:
            raise _Unrecognised
        return Page(self.objects, token)


def _checked_text(body: bytes) -> str:
    text = _text(body)
    if "\ufffe" in text or "\uffff" in text or ("]" in text and "]]>" in text):
        raise _Unrecognised
    return text


_ASCII_XML_CHARS = bytes(c for c in range(128) if c in (9, 10, 13) or c >= 32)
"""The ASCII characters XML allows: deleting them from an ASCII reply leaves the ones it forbids."""


def _text(body: bytes) -> str:
    """``body`` as text: ``UnicodeDecodeError`` for invalid UTF-8, ``_Unrecognised`` for a C0 control
    character XML forbids. ASCII (every sweep of plain names) is checked by one deletion pass whose
    result is empty, then decoded as ASCII (cheaper than a checking decode table)."""
    if body.isascii():
        if body.translate(None, _ASCII_XML_CHARS):
            raise _Unrecognised
        return body.decode("ascii")
    if _has_non_xml_chars(body):
        raise _Unrecognised
    return body.decode("utf-8")


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


def _scan_object(match: re.Match[str], kinds: _Readers, types: dict[str, str], plain: bool) -> ObjectProps:
    """One ``objects`` element; ``kinds`` and ``types`` remember the few distinct attribute strings.
    ``plain``: the reply holds no reference and no carriage return, so text is taken as it is (one
    dict comprehension, one call per value: the cost of a 30,000-VM sweep is mostly this loop)."""
    if plain:
        props = {name: kinds[attrs](raw) for name, attrs, raw in _PROPERTY.findall(match[3])}
    else:
        props = {_xml_text(name): kinds[attrs](_xml_text(raw))
                 for name, attrs, raw in _PROPERTY.findall(match[3])}
    kind = match[1]
    return ObjectProps(types[kind] if kind in types else types.setdefault(kind, _attribute_value(kind)),
                       match[2] if plain else _xml_text(match[2]), props)


def _no_items(_raw: str) -> list[Any]:
    return []  # an ArrayOf* value without items (an array with items is left to ElementTree)


class _Readers(dict[str, Callable[[str], Any]]):
    """How to read a ``val``'s text, by its attribute string (a reply holds a few distinct ones):
    worked out on first sight (``_converter``), then one dictionary look-up."""

    def __init__(self, scope: Mapping[str, str]) -> None:
        super().__init__()
        self.scope = scope

    def __missing__(self, attrs: str) -> Callable[[str], Any]:
        convert = _converter(attrs, self.scope)
        reader = self[attrs] = _no_items if convert is None else convert
        return reader


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


class _Shape(NamedTuple):
    """One object shape of a plain reply: its type, and its properties' names and ``val`` attribute
    strings in order. ``pattern`` matches an object of exactly that shape (the generic ``_OBJECT`` with
    those literals in place of its patterns, so it matches the same span), capturing the moid and the
    values; ``read`` makes the object of such a match (``_shape_reader``)."""

    pattern: re.Pattern[str]
    read: Callable[[re.Match[str]], ObjectProps]


_MAX_SHAPES = 16
"""Distinct object shapes compiled per reply at most (a sweep has one per queried type, or a few more
where some objects lack a property); past it, objects of new shapes are decoded generically."""


class _Shapes:
    """The object shapes of one plain reply (no reference, no carriage return: text read as it is),
    learned from objects the generic path decoded; ``current`` is tried first on the next object."""

    def __init__(self, kinds: _Readers) -> None:
        self.kinds = kinds
        self.known: dict[tuple[str, tuple[tuple[str, str], ...]], _Shape] = {}
        self.current: _Shape | None = None

    def learn(self, match: re.Match[str]) -> None:
        """The shape of the object ``match`` (an ``_OBJECT`` match already decoded, so its type and
        attribute strings were accepted) becomes ``current``."""
        pairs = tuple((name, attrs) for name, attrs, _raw in _PROPERTY.findall(match[3]))
        key = (match[1], pairs)
        if key not in self.known:
            names = tuple(name for name, _attrs in pairs)
            if len(self.known) >= _MAX_SHAPES or len(set(names)) != len(names):
                self.current = None  # repeated names keep the generic path's last-one-wins reading
                return
            self.known[key] = _compile_shape(match[1], pairs, self.kinds)
        self.current = self.known[key]


def _compile_shape(kind: str, pairs: tuple[tuple[str, str], ...], kinds: _Readers) -> _Shape:
    parts = [f'<objects><obj type="{re.escape(kind)}">([^<]*)</obj>']
    parts += [f"<propSet><name>{re.escape(name)}</name><val{re.escape(attrs)}>([^<]*)</val></propSet>"
              for name, attrs in pairs]
    converted = tuple((group, name, kinds[attrs]) for group, (name, attrs) in enumerate(pairs, start=1)
                      if kinds[attrs] is not str)
    pattern = re.compile("".join(parts) + "</objects>")
    return _Shape(pattern, _shape_reader(kind, tuple(n for n, _a in pairs), converted))


def _shape_reader(kind: str, names: tuple[str, ...],
                  converted: tuple[tuple[int, str, Callable[[str], Any]], ...],
                  ) -> Callable[[re.Match[str]], ObjectProps]:
    """The object of a match of one shape: group 1 the moid, then the values of ``names`` in order;
    ``converted``: (group, name, reader) of the values not read as text.

    One dict display per object, written for the shape's number of values and the places of those to
    convert (``_reader_code``); the names, the converters and the type come in as the function's globals,
    so nothing of the reply is ever part of the source: cheaper per object, matching included, than
    building the dict from ``zip`` and converting after."""
    namespace: dict[str, Any] = {"ObjectProps": ObjectProps, "kind": kind}
    namespace.update((f"n{index}", name) for index, name in enumerate(names))
    namespace.update((f"c{group}", convert) for group, _name, convert in converted)
    exec(_reader_code(len(names), frozenset(group for group, _name, _convert in converted)), namespace)
    read: Callable[[re.Match[str]], ObjectProps] = namespace["read"]
    return read


@functools.lru_cache(maxsize=128)
def _reader_code(count: int, converted: frozenset[int]) -> CodeType:
    """``read(match)`` for a shape of ``count`` values: ``v = match.groups()`` holds the moid in ``v[0]``
    and value ``i`` (named ``n<i>``) in ``v[i + 1]``, read by ``c<i + 1>`` when ``i + 1`` is in
    ``converted``. Compiled once per count and places, whatever the names."""
    items = ", ".join(f"n{i}: c{i + 1}(v[{i + 1}])" if i + 1 in converted else f"n{i}: v[{i + 1}]"
                      for i in range(count))
    source = f"def read(match):\n    v = match.groups()\n    return ObjectProps(kind, v[0], {{{items}}})\n"
    return compile(source, f"<soap_scan reader of {count} values>", "exec")


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
