"""The only reader of the process environment: ``Settings.from_env`` builds one immutable value at the edge.

Command-line flags win over the environment, which wins over defaults.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from gateway.errors import ConfigError
from gateway.private_files import UnsafeFile, read_private

log = logging.getLogger(__name__)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_switch(name: str, raw: str | None, *, default: bool, fail_safe: bool | None = None) -> bool:
    """Parse a boolean switch. An unparseable value becomes ``fail_safe`` (with a warning) if given."""
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    chosen = default if fail_safe is None else fail_safe
    log.warning(
        "%s=%r is not a recognised switch value (use true/false); treating it as %s",
        name,
        raw,
        "on" if chosen else "off",
    )
    return chosen


def logging_options(environ: Mapping[str, str]) -> tuple[str, str]:
    """(format, level) for the process's logs, read before anything else is configured."""
    return environ.get("GATEWAY_LOG_FORMAT", "text"), environ.get("GATEWAY_LOG_LEVEL", "INFO")


def database_url(from_env: str | None, from_flag: str | None) -> str | None:
    """The PostgreSQL URL to use, or None for the embedded SQLite store; ``ConfigError`` for a URL that
    is not ``postgresql://``, or that carries a password on the command line (every user on the host
    could read it in the process list: put it in GATEWAY_DATABASE_URL, PGPASSWORD or PGPASSFILE)."""
    url = (from_flag or from_env or "").strip() or None
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError("the database URL must start with postgresql:// (GATEWAY_DATABASE_URL, "
                          "--database-url); leave it unset for the embedded SQLite store")
    if from_flag and (parts.password or "password" in parse_qs(parts.query)):
        raise ConfigError("--database-url must not carry a password (the process list shows it to every "
                          "user); put the URL in GATEWAY_DATABASE_URL or the password in PGPASSFILE")
    return url


def audit_origin(raw: str | None) -> str:
    """GATEWAY_AUDIT_ORIGIN, else ``<host name>/vsphere-mcp-gateway/audit``; ConfigError when it cannot
    name a signed note's key (empty, or with a space or a '+')."""
    origin = raw.strip() if raw and raw.strip() else f"{socket.gethostname()}/vsphere-mcp-gateway/audit"
    if not re.fullmatch(r"[^\s+]+", origin):
        raise ConfigError(f"GATEWAY_AUDIT_ORIGIN={origin!r} cannot name the audit log's checkpoints: use "
                          "no spaces and no '+', e.g. gateway.example.com/audit")
    return origin


#: the fewest bytes the request-state secret may hold (``openssl rand -hex 32`` makes 64)
REQUEST_STATE_SECRET_BYTES: Final = 32
_MAKE_ONE: Final = "make one with `openssl rand -hex 32`"


def request_state_secret(value: str | None, file: str | None) -> bytes | None:
    """The operator's secret mixed into the key that seals 2026-07-28 ``requestState``s
    (``gateway.server.proposals.request_state``): GATEWAY_REQUEST_STATE_SECRET, or the file
    GATEWAY_REQUEST_STATE_SECRET_FILE names (read as every secret file is, ``private_files.read_private``);
    None when neither is set. Whitespace around it is dropped (a file's last newline), so either way one
    secret gives one key. ``ConfigError`` naming the fix, never the value: both set, a file that is
    missing, unsafe or unreadable, a secret shorter than ``REQUEST_STATE_SECRET_BYTES``."""
    if value is not None and file:
        raise ConfigError("GATEWAY_REQUEST_STATE_SECRET and GATEWAY_REQUEST_STATE_SECRET_FILE are both set; "
                          "set one of them")
    if file:
        path, what = Path(file).expanduser(), "GATEWAY_REQUEST_STATE_SECRET_FILE"
        try:
            data = read_private(path, what)
        except UnsafeFile as exc:
            raise ConfigError(f"{exc}; or unset {what}") from None
        except OSError as exc:
            raise ConfigError(f"{what} {path} cannot be read ({exc.strerror}); fix: make it readable by the "
                              f"gateway's user (chmod 600), or unset {what}") from None
        if data is None:
            raise ConfigError(f"{what} {path} does not exist; put the secret there ({_MAKE_ONE}, mode 600), "
                              f"or unset {what}")
        where = f"{what} {path}"
    elif value is not None:
        data, where = value.encode("utf-8", "surrogateescape"), "GATEWAY_REQUEST_STATE_SECRET"
    else:
        return None
    secret = data.strip()
    if len(secret) < REQUEST_STATE_SECRET_BYTES:
        raise ConfigError(f"{where} holds {len(secret)} bytes; the request-state secret must hold at least "
                          f"{REQUEST_STATE_SECRET_BYTES} ({_MAKE_ONE}), and the same on every replica")
    return secret


#: the seed's variables this gateway reads under another name: (the seed's name as a pattern, ours)
SEED_VARIABLES: Final = (
    ("ENABLE_DESTRUCTIVE", "GATEWAY_ENABLE_DESTRUCTIVE"),
    ("POLICY_FILE", "GATEWAY_RULES_FILE"),
    ("TARGETS_FILE", "GATEWAY_TARGETS_FILE"),
    ("AUDIT_LOG_PATH", "GATEWAY_AUDIT_LOG"),
    ("DRY_RUN", "GATEWAY_DRY_RUN"),
    ("WEB_UI_ENABLED", "GATEWAY_WEB_UI"),
    (r"VMWARE_(?:[A-Z0-9]+_)*READ_ONLY", "GATEWAY_READ_ONLY"),
    (r"VMWARE_(?:[A-Z0-9]+_)*MCP_ALLOW_WRITE", "GATEWAY_ALLOW_WRITE"),
    (r"VMWARE_(?:[A-Z0-9]+_)*MCP_EXPOSE", "GATEWAY_READ_ONLY"),
)


def seed_variables(environ: Mapping[str, str]) -> list[str]:
    """A sentence for each seed variable set without its ``GATEWAY_*`` equivalent, naming the one to use
    (this gateway ignores the seed's names). Pure; in ``SEED_VARIABLES`` order, then by name."""
    found = []
    for pattern, ours in SEED_VARIABLES:
        if environ.get(ours):
            continue
        for name in sorted(n for n in environ if re.fullmatch(pattern, n)):
            found.append(f"{name} is set, but this gateway does not read it: set {ours} instead "
                         f"({name} is ignored)")
    return found


def allow_write_list(raw: str | None) -> tuple[str, ...]:
    """``"a, b,"`` as ``("a", "b")`` (order kept, repeats dropped); unchecked (``serve`` checks the names
    against the write tools, ``gateway.tools.exposure``). Pure."""
    return tuple(dict.fromkeys(n.strip() for n in (raw or "").split(",") if n.strip()))


#: variables no notification channel or identity provider may name as its secret
_NOT_FOR_CHANNELS: Final = frozenset({"GATEWAY_DATABASE_URL", "GATEWAY_REQUEST_STATE_SECRET"})


@dataclass(frozen=True)
class Settings:
    """Everything configurable about one gateway process."""

    home: Path
    targets_file: Path
    rules_file: Path
    roles_file: Path
    audit_log: Path
    enable_destructive: bool = False
    read_only: bool = False
    #: write tools still offered in read-only mode (``serve --allow-write``, else GATEWAY_ALLOW_WRITE;
    #: gateway.tools.exposure)
    allow_write: tuple[str, ...] = ()
    #: GATEWAY_ALLOW_WRITE as set (None: unset or empty), for ``serve`` to check when no flag is given
    allow_write_env: str | None = None
    #: the seed variables set without their GATEWAY_* equivalent (``seed_variables``)
    seed_warnings: tuple[str, ...] = ()
    dry_run: bool = False
    web_ui: bool = False
    confirm_ttl_seconds: float = 120.0
    #: how long an idempotency key's outcome is replayed (``gateway.guard.idempotency_rules``)
    idempotency_window_seconds: float = 86400.0
    #: how long a finished MCP task's result is kept when the client asks for no ttl (``edge.mcp_tasks``)
    task_keep_seconds: float = 3600.0
    queue_timeout_seconds: float = 300.0
    fanout_timeout_seconds: float = 30.0
    audit_max_bytes: int = 50 * 1024 * 1024
    #: the longest a written audit row waits for a signed checkpoint, calls or none
    #: (GATEWAY_AUDIT_CHECKPOINT_SECONDS; the sinks also sign every ``checkpoint_rows`` rows)
    audit_checkpoint_seconds: float = 300.0
    #: ``postgresql://...``: shared state (and audit) on PostgreSQL for several replicas; None: SQLite
    #: under ``home``. May carry a password, so it is never shown (see ``gateway.store.postgres``).
    database_url: str | None = field(default=None, repr=False)
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: notifications.yaml (GATEWAY_NOTIFICATIONS_FILE; default $GATEWAY_HOME/notifications.yaml)
    notifications_file: Path | None = None
    #: variables ending in _SECRET or _URL: notification channels' HMAC secrets and webhook URLs
    notify_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: the Ed25519 key audit checkpoints are signed with (GATEWAY_AUDIT_SIGNING_KEY_FILE; default
    #: ``$GATEWAY_HOME/audit-signing.key``). Replicas sharing one PostgreSQL chain mount the same file.
    audit_signing_key_file: Path | None = None
    #: identity.yaml (GATEWAY_IDENTITY_FILE; default $GATEWAY_HOME/identity.yaml): identity providers
    #: whose tokens this gateway accepts besides its own; None or an absent file: gateway tokens only
    identity_file: Path | None = None
    #: the environment variables web_sign_in's ``client_secret_env`` may name (ending in _SECRET)
    identity_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: a file holding the first token for a fresh state, or where serve writes one
    #: (GATEWAY_BOOTSTRAP_TOKEN_FILE; gateway/server/edge/bootstrap_token.py); None: no such step
    bootstrap_token_file: Path | None = None
    #: the origin line (and key name) of the signed checkpoint notes (GATEWAY_AUDIT_ORIGIN; default
    #: ``<host name>/vsphere-mcp-gateway/audit``). Replicas sharing one PostgreSQL chain set the same one.
    audit_origin: str = "vsphere-mcp-gateway/audit"
    #: a directory every signed checkpoint note is also written to (GATEWAY_AUDIT_WITNESS_DIR; none by
    #: default): mount storage there that this host's root cannot rewrite alone
    audit_witness_dir: Path | None = None
    #: syslog.yaml: the SIEM audit rows are forwarded to (GATEWAY_SYSLOG_FILE; default
    #: ``$GATEWAY_HOME/syslog.yaml``; a missing file forwards nothing; ``gateway.audit.syslog_config``)
    syslog_file: Path | None = None
    #: rules, roles and notifications files named explicitly (a flag or a GATEWAY_*_FILE variable), not
    #: defaulted under ``home``: a missing one is a mistake, never "no file" (``missing_named_files``;
    #: a missing targets file is refused whatever named it)
    named_files: tuple[Path, ...] = ()
    #: the operator's secret mixed into the key sealing 2026-07-28 ``requestState``s
    #: (``request_state_secret``: GATEWAY_REQUEST_STATE_SECRET or GATEWAY_REQUEST_STATE_SECRET_FILE); None:
    #: the store's secret alone. Every replica on one database holds the same one. Never shown.
    request_state_secret: bytes | None = field(default=None, repr=False)
    #: OTEL_TRACES_EXPORTER: otlp, console or none (the default); see ``gateway.tracing``
    traces_exporter: str = "none"

    def missing_named_files(self) -> list[str]:
        """A sentence for each explicitly named configuration file that does not exist (a typo in
        ``--rules`` must not silently mean the built-in defaults)."""
        return [f"{path}: does not exist, but it was named explicitly (a flag or a GATEWAY_*_FILE "
                "variable); fix the path, or drop the setting to use the default location"
                for path in self.named_files if not path.exists()]

    @property
    def state_db(self) -> Path:
        return self.home / "state.db"

    @property
    def signing_key_file(self) -> Path:
        """The audit signing key's path: the setting when given, else ``<home>/audit-signing.key``."""
        return self.audit_signing_key_file or self.home / "audit-signing.key"

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **flags: Any) -> Settings:
        """Build settings from the environment, then apply non-None ``flags`` on top."""
        home = Path(flags.get("home") or environ.get("GATEWAY_HOME") or Path.home() / ".gateway").expanduser()

        named: list[Path] = []

        def path(flag: str, env: str, default: str) -> Path:
            given = flags.get(flag) or environ.get(env)
            if given and flag in ("rules", "roles", "notifications"):
                named.append(Path(given).expanduser())
            return Path(given or home / default).expanduser()

        def number(env: str, default: float) -> float:
            raw = environ.get(env)
            try:
                return float(raw) if raw else default
            except ValueError:
                log.warning("%s=%r is not a number; using %s", env, raw, default)
                return default

        settings = cls(
            home=home,
            targets_file=path("targets", "GATEWAY_TARGETS_FILE", "targets.yaml"),
            rules_file=path("rules", "GATEWAY_RULES_FILE", "rules.yaml"),
            roles_file=path("roles", "GATEWAY_ROLES_FILE", "roles.yaml"),
            audit_log=path("audit_log", "GATEWAY_AUDIT_LOG", "audit.jsonl"),
            enable_destructive=parse_switch(
                "GATEWAY_ENABLE_DESTRUCTIVE", environ.get("GATEWAY_ENABLE_DESTRUCTIVE"), default=False
            ),
            # A read-only switch that cannot be parsed counts as on: a typo must never expose writes.
            read_only=parse_switch(
                "GATEWAY_READ_ONLY", environ.get("GATEWAY_READ_ONLY"), default=False, fail_safe=True
            ),
            allow_write=allow_write_list(environ.get("GATEWAY_ALLOW_WRITE")),
            allow_write_env=environ.get("GATEWAY_ALLOW_WRITE") or None,
            seed_warnings=tuple(seed_variables(environ)),
            dry_run=parse_switch(
                "GATEWAY_DRY_RUN", environ.get("GATEWAY_DRY_RUN"), default=False, fail_safe=True
            ),
            web_ui=parse_switch("GATEWAY_WEB_UI", environ.get("GATEWAY_WEB_UI"), default=False),
            confirm_ttl_seconds=number("GATEWAY_CONFIRM_TTL_SECONDS", 120.0),
            idempotency_window_seconds=number("GATEWAY_IDEMPOTENCY_WINDOW_SECONDS", 86400.0),
            task_keep_seconds=number("GATEWAY_TASK_KEEP_SECONDS", 3600.0),
            queue_timeout_seconds=number("GATEWAY_QUEUE_TIMEOUT_SECONDS", 300.0),
            fanout_timeout_seconds=number("GATEWAY_FANOUT_TIMEOUT_SECONDS", 30.0),
            audit_max_bytes=int(number("GATEWAY_AUDIT_MAX_BYTES", 50 * 1024 * 1024)),
            audit_checkpoint_seconds=number("GATEWAY_AUDIT_CHECKPOINT_SECONDS", 300.0),
            database_url=database_url(environ.get("GATEWAY_DATABASE_URL"), flags.get("database_url")),
            credentials={k: v for k, v in environ.items() if k.endswith(("_USER", "_PASSWORD"))},
            notifications_file=path("notifications", "GATEWAY_NOTIFICATIONS_FILE", "notifications.yaml"),
            notify_env={k: v for k, v in environ.items()
                        if k.endswith(("_SECRET", "_URL")) and k not in _NOT_FOR_CHANNELS},
            audit_signing_key_file=path("audit_signing_key_file", "GATEWAY_AUDIT_SIGNING_KEY_FILE",
                                        "audit-signing.key"),
            identity_file=path("identity", "GATEWAY_IDENTITY_FILE", "identity.yaml"),
            identity_env={k: v for k, v in environ.items()
                          if k.endswith("_SECRET") and k not in _NOT_FOR_CHANNELS},
            bootstrap_token_file=(Path(environ["GATEWAY_BOOTSTRAP_TOKEN_FILE"]).expanduser()
                                  if environ.get("GATEWAY_BOOTSTRAP_TOKEN_FILE") else None),
            audit_origin=audit_origin(environ.get("GATEWAY_AUDIT_ORIGIN")),
            audit_witness_dir=Path(environ["GATEWAY_AUDIT_WITNESS_DIR"]).expanduser()
            if environ.get("GATEWAY_AUDIT_WITNESS_DIR") else None,
            syslog_file=path("syslog", "GATEWAY_SYSLOG_FILE", "syslog.yaml"),
            traces_exporter=environ.get("OTEL_TRACES_EXPORTER", "none"),
            request_state_secret=request_state_secret(environ.get("GATEWAY_REQUEST_STATE_SECRET"),
                                                      environ.get("GATEWAY_REQUEST_STATE_SECRET_FILE")),
            named_files=tuple(named),  # last: every path() above has run
        )
        overrides = {
            k: v
            for k, v in flags.items()
            if v is not None and k not in {"home", "targets", "rules", "roles", "audit_log", "notifications",
                                           "database_url", "audit_signing_key_file", "identity",
                                           "syslog"}
        }
        if "allow_write" in overrides:  # the flag wins: the environment's list is not looked at
            overrides["allow_write_env"] = None
        return replace(settings, **overrides) if overrides else settings
