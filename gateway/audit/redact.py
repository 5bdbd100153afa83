"""Redaction and bounding: the one step every text and value passes before it leaves the process.

Audit rows, log lines, proposals, pending cards and notification bodies all pass here, so what one
masks none of the others shows. Correlation ids are never masked unless one is a token of a known
format. ``displayable`` redacts before it bounds, so a cut never leaves half a secret; it is
idempotent, and every exit applies it again. Linear in the length of the text.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from datetime import date, datetime
from enum import Enum
from typing import Any, Final

from gateway.audit import phrasing
from gateway.guard.inputs import storable_text
from gateway.sanitize import DEFAULT_MAX_LEN, clean_text

MASK = "***"


_SECRET_KEY_FRAGMENTS = (
    "password", "passwd", "passphrase", "pwd", "secret", "token", "api_key", "apikey", "authorization",
    "cookie", "credential", "private_key", "privatekey", "access_key", "session_key", "soap_session",
    "license_key", "licensekey", "encryption_key", "passcode", "passwort", "kennwort", "wachtwoord",
    "contrase\u00f1a", "contrasena", "creds", "senha", "haslo", "has\u0142o", "heslo", "salasana",
    "losenord", "passord", "mot_de_passe", "motdepasse",
)
#: short words that name a credential only as a whole part of a key (``pin``, ``x_auth``; not ``ping``,
#: ``author``): their values are masked, but a mapping under one (``auth: {user, password}``) is opened
_SECRET_KEY_WORDS = frozenset({"pass", "auth", "pin", "pincode"})
#: keys naming *about* a secret rather than holding one (``token_id``, ``secret_name``) stay readable
_SAFE_KEY_SUFFIXES = ("_id", "_ids", "_name", "_names", "_count", "_at", "_kind", "_type", "_ttl",
                      "_expires", "_role", "_method", "_mode")
_MAX_DEPTH = 32
_KEY_SEPARATORS = re.compile(r"[\s.\-]")
#: ``_key_strength``: not a credential, a short word (``pin``), a credential whatever its value holds
_PLAIN, _WORD, _STRONG = 0, 1, 2


@functools.lru_cache(maxsize=4096)
def _key_strength(key: str) -> int:
    norm = _KEY_SEPARATORS.sub("_", key.lower())
    if norm.endswith(_SAFE_KEY_SUFFIXES):
        return _PLAIN
    if any(fragment in norm for fragment in _SECRET_KEY_FRAGMENTS):
        return _STRONG
    return _WORD if not _SECRET_KEY_WORDS.isdisjoint(norm.split("_")) else _PLAIN


def is_secret_key(key: str) -> bool:
    """True when a mapping key (or ``key=`` in text) names a credential: case-insensitive substrings
    (``password``, ``client_secret``, ``X-Auth-Token``), or a short word as a whole part of the key
    (``pass``, ``auth``, ``pin``: ``x_auth`` but not ``author``)."""
    return _key_strength(key) != _PLAIN


_GATEWAY_TOKEN = re.compile(r"\bgwt_[^\s\"'`,;)}\]]+")
# Each pattern anchors its start with a look-behind so that scanning long runs of word characters stays
# linear: without it a failed match is retried from every position of the run (quadratic: a 200 kB
# argument would stall every append).
_URL_USERINFO = re.compile(r"(?i)(?<![a-z0-9+.\-])([a-z][a-z0-9+.\-]*://[^/\s:@]+):[^/\s@]+@")
# key=value, key: value, "key": "value", and the same inside JSON quoted once more (\"key\": \"v\")
_KEY_VALUE = re.compile(
    r"(?<![A-Za-z0-9_.\-])(?P<key>[A-Za-z0-9_.\-]+)(?P<sep>(?:\\?[\"'])?\s*[:=]\s*)"
    r"(?P<scheme>(?:bearer|basic|digest|negotiate)\s+)?(?!//)(?![{\[])"
    r"(?P<value>\\?\"[^\"]*\"|'[^']*'|[^\s\"',;&)}\]]+)",
    re.IGNORECASE,
)
_QUOTE = re.compile(r"\\?[\"']")
_PEM_PRIVATE_KEY = re.compile(
    r"-----BEGIN (?P<kind>[A-Z ]*)PRIVATE KEY-----[^-]*(?:-----END [A-Z ]*PRIVATE KEY-----)?")
_BEARER = re.compile(r"(?i)\b(bearer\s+)(?!\*\*\*)[^\s\"',;]+")
_OPAQUE_SECRET = re.compile(r"[A-Za-z0-9+/_\-]{32,}={0,2}")


def _mask_gateway_token(match: re.Match[str]) -> str:
    # gwt_<id>_<secret>: keep the id (it names the token), drop the rest.
    parts = match.group(0).split("_", 2)
    return f"gwt_{parts[1]}_{MASK}" if len(parts) == 3 and parts[1] else f"gwt_{MASK}"


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _looks_opaque(value: str) -> bool:
    """A long base64/hex run with letters and digits: a key, signature or secret, not prose (nor a UUID)."""
    return (_OPAQUE_SECRET.fullmatch(value) is not None and any(c.isdigit() for c in value)
            and any(c.isalpha() for c in value) and _UUID.fullmatch(value) is None)


#: keys whose values are correlation (trace, request) ids: never masked, in text or in mappings
_CORRELATION_KEYS = frozenset({
    "cid", "correlation_id", "correlationid", "x_correlation_id", "request_id", "requestid",
    "x_request_id", "trace_id", "traceid", "traceparent", "span_id",
    # stable caller keys (gateway.auth.principal): a token's reads "token::<id>", its id, never its secret
    "caller_key", "proposer_key", "approver_key", "person_key", "acting_for_key", "requested_by_key",
})


@functools.lru_cache(maxsize=4096)
def is_correlation_key(key: str) -> bool:
    """True for keys (``correlation_id``, ``X-Request-ID``, ``cid``, ...) naming a correlation id."""
    return _KEY_SEPARATORS.sub("_", key.lower()) in _CORRELATION_KEYS


_CORRELATION_VALUE = re.compile(
    r"(?i)(?<![A-Za-z0-9_.\-])(?:cid|x-request-id|x-correlation-id|correlation[_-]?id|request[_-]?id"
    r"|trace[_-]?id|traceparent|span[_-]?id)\\?[\"']?\s*[:=]\s*\\?[\"']?(?P<value>[A-Za-z0-9._:\-]{1,256})")
_CORRELATION_NEEDLES = ("cid", "request", "correlation", "trace", "span")


def _mask_key_value(match: re.Match[str]) -> str:
    key, sep, scheme, value = match.group("key", "sep", "scheme", "value")
    quote = _QUOTE.match(value)
    opening = quote.group(0) if quote else ""
    bare = value.removeprefix(opening).removesuffix(opening[-1:]).removesuffix("\\")
    opaque = "=" in sep and not is_correlation_key(key) and _looks_opaque(bare)
    if not (is_secret_key(key) or opaque):
        return match.group(0)
    return f"{key}{sep}{scheme or ''}{opening}{MASK}{opening}"


# Well-known secret formats, masked wherever they appear (no key name needed).
_AWS_ACCESS_KEY = re.compile(
    r"(?<![A-Za-z0-9])(AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}(?![A-Za-z0-9])")
_AWS_SECRET_KEY = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_SSH_KEY = re.compile(
    r"(?<![A-Za-z0-9\-])(ssh-rsa|ssh-dss|ssh-ed25519|ecdsa-sha2-nistp\d{3}|sk-ssh-ed25519@openssh\.com)"
    r"(\s+)[A-Za-z0-9+/]{16,}={0,3}")
_CONFIRMATION_TOKEN = re.compile(r"(?<![A-Za-z0-9_])gwc_[A-Za-z0-9_\-]+")
_JWT = re.compile(r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{6,}\.eyJ[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]*")
_GITHUB_TOKEN = re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")
_SLACK_TOKEN = re.compile(r"(?<![A-Za-z0-9\-])xox[abposre]-[A-Za-z0-9\-]{10,}")
_SLACK_WEBHOOK = re.compile(r"(?i)(https://hooks\.slack\.com/)[A-Za-z0-9/_\-]+")
# Credential phrasing: "password is X", "the password for root is X", "pw: X", "Passwort: X", "passwd X",
# "secret X", "credentials X", a quoted value whole (but not "password is required", "the secret sauce").
_PHRASE_WORDS = (
    r"password|passwd|passphrase|passcode|passwort|kennwort|wachtwoord|contrase(?:\u00f1|n)a|senha"
    r"|mot\s+de\s+passe|\u043f\u0430\u0440\u043e\u043b\u044c|pwd?|secret|credentials?")
_PASSWORD_PHRASE = re.compile(
    rf"(?i)(?<!\w)(?P<lead>(?P<word>{_PHRASE_WORDS})(?:\s+(?:for|of)\s+[^\s\"',;:=]{{1,64}})?)"
    r"(?P<sep>\s+(?:is|was|ist|est|es)\s+|\s*[:=]\s*|\s+)"
    r"(?P<value>\"[^\"\n]{0,256}\"|'[^'\n]{0,256}'|[\"']?[^\s\"',;]+)")
_PHRASE_NEEDLES = ("pass", "pw", "secret", "credential", "wort", "\u043f\u0430\u0440\u043e\u043b\u044c",
                   "contrase", "senha", "wachtwoord")
#: words after "password is" that say something about a password rather than being one
_NOT_A_SECRET = frozenset({
    "required", "wrong", "incorrect", "invalid", "missing", "empty", "not", "too", "expired", "changed",
    "set", "unset", "the", "a", "an", "needed", "correct", "ok", "none", "null", "redacted", "hidden",
}) | phrasing.NOT_A_SECRET


def _mask_phrase(match: re.Match[str]) -> str:
    lead, word, sep, value = match.group("lead", "word", "sep", "value")
    quote = value[0] if value[0] in "\"'" and len(value) > 1 and value[-1] == value[0] else ""
    bare = value[1:-1] if quote else value
    if bare.startswith(MASK) or (not quote and bare.rstrip(".!?:)").lower() in _NOT_A_SECRET):
        return match.group(0)
    if not sep.strip() and not quote and bare.endswith(":"):  # "secret key: X": a label; phrasing reads it
        return match.group(0)
    # "passwd X", "secret X" without "is" or ":": only a value that is not a plain word ("the secret
    # sauce", "password field"), and never after the short "pw"
    if not sep.strip() and not quote and (bare.isalpha() or word.lower().startswith("pw")):
        return match.group(0)
    return f"{lead}{sep}{quote}{MASK}{quote}"


# Webhook URLs that carry their secret in the path (Teams, Discord, Slack-style /hooks/) or the query.
_WEBHOOK_PATH = re.compile(
    r"(?i)(://[^\s/\"'<>]+(?:/[^\s/\"'<>?#]+)*?/(?:webhookb2|incomingwebhook|api/webhooks|hooks)/)"
    r"[^\s\"'<>?#]+")
_URL_QUERY = re.compile(r"(?<=[?&])(?P<key>[A-Za-z0-9_.\-]{1,64})=(?P<value>[^&\s\"'<>#]+)")
#: query parameters that are a webhook's credential although their names are not credential words
_URL_SECRET_PARAMETERS = frozenset({"sig", "signature", "code", "key", "hmac", "sp_sig"})


def _mask_url_query(match: re.Match[str]) -> str:
    key = match.group("key")
    if match.group("value").startswith(MASK):
        return match.group(0)
    if key.lower() in _URL_SECRET_PARAMETERS or (is_secret_key(key) and not is_correlation_key(key)):
        return f"{key}={MASK}"
    return match.group(0)


def _mask_aws_secret(match: re.Match[str]) -> str:
    # 40 characters of base64 with upper case, lower case and a digit or / +: an AWS secret access key
    # (a SHA-1 in hex has no upper case; names and paths carry other characters).
    text = match.group(0)
    mixed = (any(c.isupper() for c in text) and any(c.islower() for c in text)
             and any(c.isdigit() or c in "/+" for c in text))
    return MASK if mixed else text


#: pattern, replacement, and the substrings (of the lower-cased text) without which it cannot match
_TEXT_RULES: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str], tuple[str, ...]], ...] = (
    (_GATEWAY_TOKEN, _mask_gateway_token, ("gwt_",)),
    (_CONFIRMATION_TOKEN, f"gwc_{MASK}", ("gwc_",)),
    (_SLACK_WEBHOOK, rf"\1{MASK}", ("hooks.slack.com",)),
    (_WEBHOOK_PATH, rf"\1{MASK}", ("webhook", "/hooks/")),
    (_URL_USERINFO, rf"\1:{MASK}@", ("://",)),
    (_URL_QUERY, _mask_url_query, ("?",)),
    (_KEY_VALUE, _mask_key_value, (":", "=")),
    (_BEARER, rf"\1{MASK}", ("bearer",)),
    (_PEM_PRIVATE_KEY, rf"-----BEGIN \g<kind>PRIVATE KEY-----{MASK}-----END \g<kind>PRIVATE KEY-----",
     ("private key",)),
    (_SSH_KEY, rf"\1\2{MASK}", ("ssh-", "ecdsa-")),
    (_JWT, MASK, ("eyj",)),
    (_GITHUB_TOKEN, MASK, ("gh", "github_pat_")),
    (_SLACK_TOKEN, MASK, ("xox",)),
    (_PASSWORD_PHRASE, _mask_phrase, _PHRASE_NEEDLES),
)
#: rules for shapes without a keyword to look for first; they run on any text this long
_SHAPE_RULES: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (_AWS_ACCESS_KEY, rf"\1{MASK}"),
    (_AWS_SECRET_KEY, _mask_aws_secret),
)
_SHORTEST_SHAPE = 20


#: short texts already seen to need no masking: the names, states and ids every row repeats are looked
#: up, not searched again. Only texts left whole are kept (never one that held a secret), at most
#: ``_CLEAN_TEXTS_MAX`` of them (then the set starts over), so memory stays bounded whatever callers send
_CLEAN_TEXTS: dict[str, None] = {}
_CLEAN_TEXT_LEN: Final = 200
_CLEAN_TEXTS_MAX: Final = 4096


def redact_text(text: str) -> str:
    """Mask credential-shaped pieces of free text: ``password=...``, ``Bearer ...``, gateway tokens
    ``gwt_<id>_<secret>`` (the id stays) and ``gwc_`` confirmation tokens, URL passwords, PEM private
    keys, SSH keys, AWS access key ids and secret keys, JWTs, GitHub and Slack tokens, "password is X"
    phrasing, long opaque values after ``key=``. Correlation ids (``cid=``, ``X-Request-ID:``,
    ``correlation_id``) are never masked (see ``redact_correlation_id``). Linear in the length of
    ``text``."""
    if len(text) < 4:
        return text
    short = len(text) <= _CLEAN_TEXT_LEN
    if short and text in _CLEAN_TEXTS:
        return text
    masked = _redact_text(text)
    if short and masked == text:
        if len(_CLEAN_TEXTS) >= _CLEAN_TEXTS_MAX:
            _CLEAN_TEXTS.clear()
        _CLEAN_TEXTS[text] = None
    return masked


def _redact_text(text: str) -> str:
    if not _mentions(text, _CORRELATION_NEEDLE, _CORRELATION_NEEDLES):
        return _redact_piece(text)
    pieces: list[str] = []
    position = 0
    for match in _CORRELATION_VALUE.finditer(text):
        start, end = match.span("value")
        pieces += [_redact_piece(text[position:start]), redact_correlation_id(text[start:end])]
        position = end
    pieces.append(_redact_piece(text[position:]))
    return "".join(pieces)


#: token formats unmistakable by their prefix: masked even where a correlation id is expected
_PREFIXED_RULES: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (_GATEWAY_TOKEN, _mask_gateway_token),
    (_CONFIRMATION_TOKEN, f"gwc_{MASK}"),
    (_AWS_ACCESS_KEY, rf"\1{MASK}"),
    (_JWT, MASK),
    (_GITHUB_TOKEN, MASK),
    (_SLACK_TOKEN, MASK),
)


def redact_correlation_id(value: str) -> str:
    """A correlation id as logged: never masked as an opaque value (ids look random), but a token
    of a well-known format (``gwt_``, ``gwc_``, ``AKIA``, a JWT, GitHub, Slack) sent as one is."""
    for pattern, replacement in _PREFIXED_RULES:
        value = pattern.sub(replacement, value)
    return value


#: up to this length one regex search for any needle is fastest; beyond it, substring tests are
_SHORT_TEXT = 2048
_EVERY_NEEDLE = {*(needle for _, _, needles in _TEXT_RULES for needle in needles), *phrasing.NEEDLES}
#: the needles that hold no other (a text holding "password" holds "pas"): fewer substring tests
_ALL_NEEDLES = tuple(sorted(n for n in _EVERY_NEEDLE if not any(o != n and o in n for o in _EVERY_NEEDLE)))


def _trie_pattern(needles: tuple[str, ...]) -> str:
    """One regex matching any of ``needles``, shaped as a prefix tree (each position tries one branch
    per next character, not one per needle)."""
    tree: dict[str, Any] = {}
    for needle in needles:
        node = tree
        for char in needle:
            node = node.setdefault(char, {})
        node[""] = {}

    def shape(node: dict[str, Any]) -> str:
        if "" in node and len(node) > 1:  # a needle ends here: the shorter match is enough
            return ""
        branches = [re.escape(char) + shape(child) for char, child in sorted(node.items()) if char]
        return branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})" if branches else ""

    return shape(tree)


# searched in the lower-cased text, case-sensitively: far faster than IGNORECASE over Unicode needles
_ANY_NEEDLE = re.compile(_trie_pattern(_ALL_NEEDLES))
_CORRELATION_NEEDLE = re.compile("|".join(_CORRELATION_NEEDLES))


def _mentions(text: str, pattern: re.Pattern[str], needles: tuple[str, ...]) -> bool:
    """Whether ``text`` contains any of ``needles`` (lower case; the test is case-insensitive), the
    cheapest way for its length: a regex alternation over the lower-cased text is fast on short text but
    slow on long text, where substring tests win."""
    lowered = text.lower()
    if len(text) <= _SHORT_TEXT:
        return pattern.search(lowered) is not None
    return any(needle in lowered for needle in needles)


def _redact_piece(text: str) -> str:
    phrased = False
    if _mentions(text, _ANY_NEEDLE, _ALL_NEEDLES):  # the common case (names, moids, states) skips this
        lowered = text.lower()
        for pattern, replacement, needles in _TEXT_RULES:
            if any(needle in lowered for needle in needles):
                text = pattern.sub(replacement, text)
        phrased = any(needle in lowered for needle in phrasing.NEEDLES)
    if len(text) >= _SHORTEST_SHAPE:
        for pattern, replacement in _SHAPE_RULES:
            text = pattern.sub(replacement, text)
    if phrased:  # credentials as people write them, last: what the patterns masked keeps their form
        text = phrasing.mask_phrased(text, MASK)
    return text

def redact(value: Any) -> Any:
    """A JSON-native copy of ``value`` safe to log.

    Values under credential-like keys (see ``is_secret_key``) become ``"***"`` whatever their shape
    (``None`` and booleans stay: they carry no secret); every string is passed through
    ``redact_text``. Keys become strings, tuples and sets lists, enums their values, datetimes ISO
    text, non-finite floats text and anything else its (redacted) ``str()``.
    """
    return Walk().value(value, 0)


def displayable_text(text: str, max_len: int = DEFAULT_MAX_LEN) -> str:
    """``text`` as people and models are shown it: redacted (``redact_text``), then hidden characters
    escaped and the length bounded with a visible marker (``gateway.sanitize.clean_text``).
    Redacting first means a cut never leaves half a secret behind. Idempotent."""
    return clean_text(redact_text(text), max_len)


def displayable(value: Any, max_len: int = DEFAULT_MAX_LEN) -> Any:
    """``redact(value)`` with every string (keys too) bounded as ``displayable_text`` bounds it: the form of
    a proposal's summary and affected objects, the pending card, ``list_pending_actions`` and the
    facts a notification carries. Idempotent."""
    return Walk(max_len).value(value, 0)


#: a container nested deeper than a walk's ``max_depth`` becomes this text
TOO_DEEP = "<nested too deep>"
#: the key (a mapping) or item (a list) that says how many items a walk with ``max_items`` left out
MORE_ITEMS = "more_items"
_CONTAINERS = (Mapping, list, tuple, set, frozenset)


class Walk:
    """One walk over a value: redaction always; with ``shown_len``, the bounds of text shown to
    people (hidden characters escaped, a visible cut). ``gateway.audit.bounds`` subclasses it to add
    the audit row's bounds on size (``text``, ``key``, ``max_depth`` and ``max_items``)."""

    #: containers nested this deep become ``TOO_DEEP``
    max_depth = _MAX_DEPTH
    #: items kept of one list or mapping (None: all of them)
    max_items: int | None = None

    def __init__(self, shown_len: int | None = None) -> None:
        self.shown_len = shown_len

    def value(self, value: Any, depth: int) -> Any:
        if value is None or isinstance(value, bool | int):
            return value
        if isinstance(value, str):
            return self.text(redact_text(storable_text(value)))
        if isinstance(value, float):
            return value if math.isfinite(value) else str(value)
        if depth >= self.max_depth and isinstance(value, _CONTAINERS):
            return TOO_DEEP
        if isinstance(value, Mapping):
            return self.mapping(value, depth)
        if isinstance(value, list | tuple | set | frozenset):
            return self.sequence(value, depth)
        return self.scalar(value, depth)

    def text(self, text: str) -> Any:
        return text if self.shown_len is None else clean_text(text, self.shown_len)

    def key(self, key: Any) -> str:
        name = storable_text(str(key))
        return name if self.shown_len is None else clean_text(name, self.shown_len)

    def mapping(self, value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for index, (key, item) in enumerate(value.items()):
            if self.max_items is not None and index >= self.max_items:
                out[MORE_ITEMS] = len(value) - self.max_items
                break
            name = self.key(key)
            strength = _key_strength(name)
            if item is not None and not isinstance(item, bool) and (
                    strength == _STRONG or (strength == _WORD and not isinstance(item, _CONTAINERS))):
                out[name] = MASK
            elif isinstance(item, str) and is_correlation_key(name):
                out[name] = self.text(redact_correlation_id(item))  # not masked as opaque; bounded
            else:
                out[name] = self.value(item, depth + 1)
        return out

    def sequence(self, value: Any, depth: int) -> list[Any]:
        if self.max_items is None:
            return [self.value(v, depth + 1) for v in value]
        out: list[Any] = []
        for index, item in enumerate(value):
            if index >= self.max_items:
                out.append({MORE_ITEMS: len(value) - self.max_items})
                break
            out.append(self.value(item, depth + 1))
        return out

    def scalar(self, value: Any, depth: int) -> Any:
        if isinstance(value, Enum):
            return self.value(value.value, depth + 1)
        if isinstance(value, datetime | date):
            return value.isoformat()
        if isinstance(value, bytes | bytearray):
            return f"<{len(value)} bytes>"
        return self.text(redact_text(storable_text(str(value))))
