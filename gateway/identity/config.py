"""``identity.yaml``: which identity providers this gateway trusts, and how their claims become callers.

The format is ``identity.example.yaml``; without the file only ``gwt_`` tokens are taken. Parsed
strictly, all ``file:line:column`` problems at once. An ``http://`` issuer is accepted on loopback only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from gateway.config import ConfigProblems, builtin_name, load_yaml, located

TOP_KEYS: Final = {"resource", "issuers", "web_sign_in"}
ISSUER_KEYS: Final = {"issuer", "audience", "ca_file", "principal_claim", "roles_claim", "roles",
                      "enforce_scopes", "keys_max_age_seconds", "application_claims"}
REQUIRED_ISSUER_KEYS: Final = ("issuer", "principal_claim", "roles_claim", "roles")
WEB_KEYS: Final = {"issuer", "client_id", "client_secret_env", "token_sign_in", "scope"}
REQUIRED_WEB_KEYS: Final = ("issuer", "client_id", "client_secret_env")
_CLAIM: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}")
_ENV: Final = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
_LOOPBACK: Final = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class IssuerConfig:
    """One trusted identity provider."""

    issuer: str
    audience: str
    principal_claim: str
    roles_claim: str
    #: claim value -> role name, in the file's order (the first the token carries wins)
    roles: tuple[tuple[str, str], ...]
    ca_file: str | None = None
    enforce_scopes: bool = True
    keys_max_age_seconds: float = 3600.0
    #: (claim, value) pairs that mark a token as an application's own (the issuer's app marker): such a
    #: token is never a person's, on the page or acting for one (``mapping.is_application``)
    application_claims: tuple[tuple[str, str], ...] = ()
    #: ``file:line:column`` of each entry of ``roles`` (for ``gateway check``)
    role_places: tuple[str, ...] = ()


@dataclass(frozen=True)
class WebSignIn:
    """The approval page's OpenID Connect client."""

    issuer: str
    client_id: str
    client_secret_env: str
    token_sign_in: bool = True
    #: what the authorization request asks for: openid plus whatever carries the principal and roles claims
    scope: str = "openid email profile"


@dataclass(frozen=True)
class IdentityConfig:
    resource: str
    issuers: tuple[IssuerConfig, ...]
    web_sign_in: WebSignIn | None = None

    def issuer(self, name: str) -> IssuerConfig | None:
        return next((i for i in self.issuers if i.issuer == name), None)


def identity_file(home: Path, environ: Mapping[str, str]) -> Path:
    """Where identity.yaml is looked for: ``GATEWAY_IDENTITY_FILE``, else ``$GATEWAY_HOME/identity.yaml``."""
    given = environ.get("GATEWAY_IDENTITY_FILE")
    return Path(given).expanduser() if given else home / "identity.yaml"


def load_identity(path: Path) -> IdentityConfig | None:
    """The file's configuration, None when it does not exist; ``ConfigProblems`` listing every problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigProblems([f"{path}: cannot read identity file ({exc.strerror})"]) from exc
    return parse_identity(load_yaml(text, str(path)), str(path))


def _url_problem(value: Any, what: str) -> str | None:
    if not isinstance(value, str) or not value:
        return f"{what} must be a URL, got {value!r}"
    parts = urlsplit(value)
    if parts.query or parts.fragment or not parts.hostname:
        return f"{what} must be an https URL without query or fragment, got {value!r}"
    if parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in _LOOPBACK):
        return None
    return f"{what} must use https (http only on a loopback address), got {value!r}"


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def problem(self, container: Any, key: Any, message: str) -> None:
        self.problems.append(f"{located(self.source, container, key)}: {message}")

    def keys(self, entry: Any, where: Any, key: Any, allowed: set[str], required: tuple[str, ...],
             what: str) -> bool:
        if not isinstance(entry, dict):
            self.problem(where, key, f"{what} must be a mapping, got {builtin_name(entry)}")
            return False
        for extra in sorted(set(entry) - allowed, key=str):
            self.problem(entry, extra,
                         f"{what}: unknown key {extra!r}; the keys are {', '.join(sorted(allowed))}")
        missing = [k for k in required if k not in entry]
        for name in missing:
            self.problem(where, key, f"{what}: the key {name!r} is required")
        return not missing

    def claim(self, entry: Any, key: str, what: str) -> str:
        value = entry.get(key)
        if not isinstance(value, str) or not _CLAIM.fullmatch(value):
            self.problem(entry, key, f"{what}: {key!r} must be a claim name such as sub, email or groups")
            return ""
        return value

    def number(self, entry: Any, key: str, default: float, what: str) -> float:
        value = entry.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            self.problem(entry, key, f"{what}: {key!r} must be a positive number of seconds")
            return default
        return float(value)

    def switch(self, entry: Any, key: str, default: bool, what: str) -> bool:
        value = entry.get(key, default)
        if not isinstance(value, bool):
            self.problem(entry, key, f"{what}: {key!r} must be true or false")
            return default
        return value


def parse_identity(doc: Any, source: str) -> IdentityConfig:
    r = _Reader(source)
    if not r.keys(doc, doc, None, TOP_KEYS, ("resource", "issuers"), "identity.yaml"):
        raise ConfigProblems(r.problems)
    resource = doc["resource"]
    if (problem := _url_problem(resource, "'resource'")) is not None:
        r.problem(doc, "resource", f"{problem}; write the URL clients use for /mcp")
    issuers: list[IssuerConfig] = []
    entries = doc["issuers"]
    if not isinstance(entries, list) or not entries:
        r.problem(doc, "issuers", "'issuers' must be a non-empty list of identity providers")
        entries = []
    for index, entry in enumerate(entries):
        found = _issuer(r, entries, index, entry, str(resource))
        if found is not None:
            if any(i.issuer == found.issuer for i in issuers):
                r.problem(entries, index, f"issuer {found.issuer!r} is listed twice; keep one entry")
            issuers.append(found)
    web = _web(r, doc, issuers) if "web_sign_in" in doc else None
    if r.problems:
        raise ConfigProblems(r.problems)
    return IdentityConfig(resource=str(resource), issuers=tuple(issuers), web_sign_in=web)


def _issuer(r: _Reader, entries: Any, index: int, entry: Any, resource: str) -> IssuerConfig | None:
    what = f"issuers[{index}]"
    if not r.keys(entry, entries, index, ISSUER_KEYS, REQUIRED_ISSUER_KEYS, what):
        return None
    issuer = entry["issuer"]
    if (problem := _url_problem(issuer, f"{what}: 'issuer'")) is not None:
        r.problem(entry, "issuer", problem)
    audience = entry.get("audience", resource)
    if not isinstance(audience, str) or not audience:
        r.problem(entry, "audience", f"{what}: 'audience' must be the resource identifier tokens carry")
    ca_file = entry.get("ca_file")
    if ca_file is not None and not (isinstance(ca_file, str) and Path(ca_file).is_file()):
        r.problem(entry, "ca_file", f"{what}: 'ca_file' {ca_file!r} is not a readable file")
    roles = entry["roles"]
    pairs: list[tuple[str, str]] = []
    places: list[str] = []
    if not isinstance(roles, dict) or not roles:
        r.problem(entry, "roles", f"{what}: 'roles' must map claim values to role names, e.g. "
                                  "{vsphere-ops: lab-operator}")
    else:
        for value, role in roles.items():
            if not isinstance(value, str) or not isinstance(role, str) or not value or not role:
                r.problem(roles, value, f"{what}: roles: {value!r}: {role!r} must map a text value to a "
                                        "role name")
            else:
                pairs.append((value, role))
                places.append(located(r.source, roles, value))
    marks = entry.get("application_claims", {})
    app_claims: list[tuple[str, str]] = []
    if not isinstance(marks, dict):
        r.problem(entry, "application_claims", f"{what}: 'application_claims' must map claim names to the "
                  "value that marks an application's token, e.g. {client_type: service}")
    else:
        for claim, value in marks.items():
            if not isinstance(claim, str) or not _CLAIM.fullmatch(claim) or not isinstance(value, str) \
                    or not value:
                r.problem(marks, claim, f"{what}: application_claims: {claim!r}: {value!r} must map a claim "
                          "name to a text value")
            else:
                app_claims.append((claim, value))
    return IssuerConfig(
        issuer=str(issuer), audience=str(audience), principal_claim=r.claim(entry, "principal_claim", what),
        roles_claim=r.claim(entry, "roles_claim", what), roles=tuple(pairs),
        ca_file=ca_file if isinstance(ca_file, str) else None,
        enforce_scopes=r.switch(entry, "enforce_scopes", True, what),
        keys_max_age_seconds=r.number(entry, "keys_max_age_seconds", 3600.0, what), role_places=tuple(places),
        application_claims=tuple(app_claims))


def _web(r: _Reader, doc: Any, issuers: list[IssuerConfig]) -> WebSignIn | None:
    entry = doc["web_sign_in"]
    what = "web_sign_in"
    if not r.keys(entry, doc, "web_sign_in", WEB_KEYS, REQUIRED_WEB_KEYS, what):
        return None
    issuer = entry["issuer"]
    if not any(i.issuer == issuer for i in issuers):
        r.problem(entry, "issuer", f"{what}: 'issuer' {issuer!r} is not one of the issuers listed above; "
                                   "add it there (its roles mapping applies to people too)")
    client_id = entry["client_id"]
    if not isinstance(client_id, str) or not client_id:
        r.problem(entry, "client_id", f"{what}: 'client_id' must be the client id registered at the provider")
    env = entry["client_secret_env"]
    if not isinstance(env, str) or not _ENV.fullmatch(env) or not env.endswith("_SECRET"):
        r.problem(entry, "client_secret_env", f"{what}: 'client_secret_env' must name an environment "
                  "variable ending in _SECRET, such as GATEWAY_OIDC_CLIENT_SECRET")
    scope = entry.get("scope", "openid email profile")
    if not isinstance(scope, str) or "openid" not in scope.split():
        r.problem(entry, "scope", f"{what}: 'scope' must be space-separated scopes including openid")
        scope = "openid"
    return WebSignIn(issuer=str(issuer), client_id=str(client_id), client_secret_env=str(env),
                     token_sign_in=r.switch(entry, "token_sign_in", True, what), scope=scope)
