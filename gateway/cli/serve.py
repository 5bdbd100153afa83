"""``gateway serve``: run the MCP server over stdio, HTTPS, or loopback HTTP behind a TLS proxy.

Network transports refuse to start without a usable token, a certificate (https) or a loopback
address (http), and unless /mcp refuses an unauthenticated request. Over stdio every log line goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
from starlette.types import ASGIApp

from gateway import tracing
from gateway.cli import add_path_flags, settings_from
from gateway.errors import ConfigError, InvalidArgument
from gateway.server.base.ops_metrics import certificate_collector
from gateway.server.edge import bootstrap_token, gc_tuning
from gateway.server.edge.app import GatewayServer, build_app, self_check, uvicorn_config
from gateway.server.edge.mcp import serve_stdio
from gateway.server.edge.middleware import EdgeConfig, is_loopback, split_authority
from gateway.server.edge.sighup import Hangup
from gateway.server.edge.tls import server_context
from gateway.settings import Settings
from gateway.tools.exposure import allow_write_arg, allow_write_names

if TYPE_CHECKING:
    from gateway.server.runtime import Gateway

log = logging.getLogger(__name__)

DEFAULT_PORT = 8443

SWITCH_INTERVAL_SECONDS = 0.001
"""How long a Python thread may hold the GIL while another waits (CPython's default is 5 ms). Decoding and
encoding big listings run in worker threads; with several at once the event loop queued behind each of
them for a whole interval: /healthz p99 was 118-160 ms (3 runs) while eight 3,000-VM listings ran, and
39-108 ms (6 runs, median 58) at 1 ms (``python bench/event_loop.py --phases idle,listings``)."""
_DEFAULT_HOSTS = {"https": "0.0.0.0", "http": "127.0.0.1"}


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("serve", help="run the MCP server")
    parser.add_argument("--transport", choices=("stdio", "https", "http"), default="stdio",
                        help="stdio (default, local user), https, or http on loopback behind a TLS proxy")
    parser.add_argument("--cert", type=Path, help="PEM certificate chain (https)")
    parser.add_argument("--key", type=Path, help="PEM private key (https)")
    parser.add_argument("--public-name", action="append", default=[], dest="public_names",
                        metavar="NAME[:PORT]",
                        help="a host name clients use; requests for any other Host are refused (repeat)")
    parser.add_argument("--host", help="address to bind (https: 0.0.0.0, http: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port to bind (default {DEFAULT_PORT}; 0 picks a free one, see the log)")
    parser.add_argument("--forwarded-allow-ips", dest="forwarded_allow_ips", metavar="IPS",
                        help="proxies whose X-Forwarded-For/-Proto are trusted (comma-separated)")
    parser.add_argument("--web", action="store_true", help="serve the approval page at /ui (GATEWAY_WEB_UI)")
    parser.add_argument("--read-only", action="store_true", help="offer read tools only (GATEWAY_READ_ONLY)")
    parser.add_argument("--allow-write", type=allow_write_arg, default=None, metavar="TOOL[,TOOL]",
                        help="with --read-only: also offer these write tools (e.g. create_snapshot; "
                             "GATEWAY_ALLOW_WRITE, which this flag overrides)")
    parser.add_argument("--enable-destructive", action="store_true",
                        help="offer destructive tools (GATEWAY_ENABLE_DESTRUCTIVE)")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20,
                        help="request body limit (default 1 MiB)")
    parser.add_argument("--max-concurrent", type=int, default=64,
                        help="requests in progress before 503 (default 64)")
    parser.add_argument("--session-idle-seconds", type=float, default=1800.0,
                        help="close an MCP session after this long without a request (default 1800)")
    parser.add_argument("--max-sessions", type=int, default=1000,
                        help="MCP sessions open at once in total (default 1000); at the limit the biggest "
                             "holder's session idle the longest is closed")
    parser.add_argument("--max-sessions-per-token", type=int, default=32,
                        help="MCP sessions one token may hold (default 32); a new one closes that token's "
                             "session idle the longest")
    parser.add_argument("--header-timeout-seconds", type=float, default=10.0,
                        help="close a connection whose request headers are not complete in this time "
                             "(default 10)")
    parser.add_argument("--drain-seconds", type=float, default=0.0,
                        help="on SIGTERM, keep serving this long with readiness failing (default 0)")
    parser.add_argument("--grace-seconds", type=float, default=30.0,
                        help="on SIGTERM, wait this long at most for calls in progress (default 30)")
    add_path_flags(parser)
    parser.set_defaults(handler=run)


def switches(args: argparse.Namespace) -> dict[str, bool | None]:
    """A switch given on the command line turns the feature on; an absent one leaves the environment's."""
    return {"read_only": args.read_only or None, "enable_destructive": args.enable_destructive or None,
            "web_ui": args.web or None, "allow_write": getattr(args, "allow_write", None)}


def check_network_args(args: argparse.Namespace) -> str:
    """Validate the flags of a network transport; return the address to bind."""
    host: str = args.host or _DEFAULT_HOSTS[args.transport]
    if not 0 <= args.port < 65536:
        raise InvalidArgument("port", "must be between 1 and 65535 (0 picks a free port)")
    for flag in ("session_idle_seconds", "max_body_bytes", "max_concurrent", "max_sessions",
                 "max_sessions_per_token", "header_timeout_seconds"):
        if not getattr(args, flag) > 0:
            raise InvalidArgument("--" + flag.replace("_", "-"), "must be a positive number")
    if args.transport == "https":
        missing = [flag for flag, value in (("--cert", args.cert), ("--key", args.key),
                                            ("--public-name", args.public_names)) if not value]
        if missing:
            raise InvalidArgument("transport", f"https needs {', '.join(missing)}; create a certificate with "
                                  "`gateway cert create --name NAME --out DIR`")
    elif not is_loopback((split_authority(host) or (host, None))[0]):
        raise InvalidArgument("host", f"http binds a loopback address only (127.0.0.1, ::1 or localhost), "
                              f"not {host!r}; put a TLS-terminating proxy in front, or use --transport https")
    return host


def require_token(store: Any) -> None:
    """Network transports need at least one usable token, else every request would be refused."""
    now = time.time()
    if not any(record.usable(now) for record in store.list_tokens()):
        raise ConfigError("no usable bearer token exists, so no client could connect; create one with "
                          "`gateway token create NAME --role admin` (in a container or pod: set "
                          "GATEWAY_BOOTSTRAP_TOKEN_FILE, see deploy/README.md)")


def edge_config(args: argparse.Namespace) -> EdgeConfig:
    options = {"max_body_bytes": args.max_body_bytes, "max_concurrent_requests": args.max_concurrent,
               "session_idle_seconds": args.session_idle_seconds, "max_sessions": args.max_sessions,
               "max_sessions_per_token": args.max_sessions_per_token,
               "header_timeout_seconds": args.header_timeout_seconds}
    if args.transport == "https":
        return EdgeConfig.for_https(args.public_names, **options)
    return EdgeConfig.for_http(args.public_names, **options)


def _version() -> str:
    try:
        return importlib.metadata.version("vsphere-mcp-gateway")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def _web_app(gateway: Any) -> ASGIApp:
    """The approval page (``gateway.web.app.build_web_app(gateway)``), when this build has it."""
    try:
        module = importlib.import_module("gateway.web.app")
    except ModuleNotFoundError as exc:
        raise ConfigError("the approval page is not part of this build; start without --web") from exc
    app: ASGIApp = module.build_web_app(gateway)
    return app


def _build_gateway(settings: Settings) -> Gateway:
    from gateway.server.runtime import Gateway  # imported late: it loads every tool module

    tracing.configure(settings.traces_exporter)  # OTEL_TRACES_EXPORTER; the no-op tracer when none
    return Gateway.build(settings)


#: why stdio serves no page, and what to run instead (the page shares the same GATEWAY_HOME's proposals)
STDIO_WEB: Final = (
    "the approval page is served over HTTPS only, and stdio has no HTTPS listener, so --web cannot be "
    "honoured here; start without --web and either run the page next to it on the same GATEWAY_HOME "
    "(`gateway serve --transport https --web --cert CERT --key KEY --public-name localhost --port 8443`, "
    "certificate from `gateway cert create --name localhost --out DIR`; it sees the stdio session's "
    "proposals), or approve from a shell with `gateway pending list` and `gateway pending approve ID`")


def environment_problem(settings: Settings) -> str | None:
    """Why the environment's GATEWAY_ALLOW_WRITE cannot be served (the flag's check, exit 2), else None;
    the seed variables set without their GATEWAY_* equivalent are logged as warnings."""
    for line in settings.seed_warnings:
        log.warning("%s", line)
    if settings.allow_write_env is None:
        return None
    try:
        allow_write_names(settings.allow_write_env, "GATEWAY_ALLOW_WRITE")
    except ValueError as exc:
        return f"GATEWAY_ALLOW_WRITE={settings.allow_write_env!r}: {exc}"
    return None


def run(args: argparse.Namespace) -> int:
    if args.transport == "stdio" and args.web:
        raise ConfigError(STDIO_WEB)
    host = check_network_args(args) if args.transport != "stdio" else ""
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    settings = settings_from(args, **switches(args))
    problem = environment_problem(settings)
    if problem is not None:  # as argparse answers a bad --allow-write: a usage error, exit 2
        print(f"gateway serve: error: {problem}", file=sys.stderr)
        return 2
    if args.transport == "stdio" and settings.web_ui:
        log.warning("GATEWAY_WEB_UI is set, but %s", STDIO_WEB)
    gateway = _build_gateway(settings)
    if args.transport == "stdio":
        gc_tuning.settle()  # what is alive now lives as long as the process
        anyio.run(lambda: serve_stdio(gateway, version=_version()))
        return 0
    bootstrap_token.adopt(gateway.store, settings.bootstrap_token_file, gateway.trail.write_or_wait)
    if gateway.identity is None:  # with identity.yaml, callers may all come from the identity provider
        require_token(gateway.store)
    config = edge_config(args)
    context = server_context(args.cert, args.key) if args.transport == "https" else None
    if context is not None:  # the served certificate's dates (gateway_tls_certificate_*, the expiry alert)
        gateway.metrics.add_collector("tls", certificate_collector(args.cert))
    app = build_app(gateway, config, version=_version(), web=_web_app(gateway) if settings.web_ui else None,
                    stateless=gateway.backends.engine.shared)  # replicas keep no MCP session
    anyio.run(self_check, app, config)
    gc_tuning.settle(gateway.metrics)  # what is alive now lives as long as the process
    server = GatewayServer(
        uvicorn_config(app, config, host=host, port=args.port, ssl_context=context,
                       forwarded_allow_ips=args.forwarded_allow_ips),
        gateway, app.state.in_flight, drain_seconds=args.drain_seconds, grace_seconds=args.grace_seconds,
    )
    log.info("serving MCP over %s at /mcp for %s", args.transport,
             ", ".join(h.authority() for h in config.hosts))
    hangup = Hangup(gateway)  # SIGHUP (systemctl reload) re-reads rules and roles instead of ending it
    hangup.install()
    try:
        server.run()
    finally:
        hangup.uninstall()
    return 0
