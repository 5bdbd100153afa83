"""Logged-in pyVmomi sessions for one target, reused across calls.

No health probe on checkout: an expired session shows as ``NotAuthenticated`` and the call logs in
again once and re-runs. ``SoapStubAdapter``, not ``SmartConnect``, which negotiates without a socket
timeout, keeps a global service instance and disables TLS verification for loopback addresses.
"""

from __future__ import annotations

import http.client
import logging
import ssl
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pyVmomi import VmomiSupport, vim
from pyVmomi.SoapAdapter import SoapStubAdapter

from gateway import errors, tracing
from gateway.config import Credentials, Target
from gateway.vsphere import faults
from gateway.vsphere.views import ViewCache

log = logging.getLogger(__name__)

T = TypeVar("T")

IDLE_CONNECTION_SECONDS = 20
"""An HTTP connection idle this long is closed rather than reused: reusing one the server (or a proxy)
has already closed fails the call with a dropped connection, and idle limits of proxies in front of
vSphere are often a minute or less. Reuse within a burst of calls still saves the TLS handshake."""

CLOSE_SECONDS = 5.0
"""Upper bound on how long ``close`` waits for logouts."""

_VERSIONS_PATH = "/sdk/vimServiceVersions.xml"
_MAX_VERSIONS_BYTES = 256 * 1024


@dataclass(frozen=True)
class PoolStats:
    """Counters of one pool: sessions open, sessions lent out, logins done, re-logins after expiry."""

    size: int
    in_use: int
    logins: int
    relogins: int


class VSphereSession:
    """One logged-in pyVmomi connection to one target; used by one thread at a time."""

    target: Target
    si: vim.ServiceInstance
    content: vim.ServiceInstanceContent

    def __init__(self, target: Target, si: vim.ServiceInstance, content: vim.ServiceInstanceContent,
                 stub: Any, key: str) -> None:
        self.target = target
        self.si = si
        self.content = content
        self._stub = stub
        self.key = key
        """The target's id of this login (``UserSession.key``); not a secret, but not a credential either."""
        self.views = ViewCache()
        """The container views this login made, kept for the next sweep (``gateway.vsphere.views``)."""

    @property
    def socket_timeout(self) -> float:
        """Seconds any single socket read may take; long server-side waits must stay below it."""
        return self.target.timeout_seconds

    def __repr__(self) -> str:
        return f"VSphereSession(target={self.target.name!r})"


def tls_context(target: Target) -> ssl.SSLContext:
    """The TLS context for ``target``: verified by default, against ``ca_file`` if set, none if insecure."""
    try:
        context = ssl.create_default_context(cafile=target.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise errors.ConfigError(
            f"target '{target.name}': ca_file '{target.ca_file}' cannot be loaded "
            f"({exc.__class__.__name__}); point 'ca_file' at a readable PEM bundle") from exc
    if target.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def supported_api_version(document: bytes) -> str | None:
    """The newest pyVmomi API version that a ``vimServiceVersions.xml`` document says the server speaks."""
    root = ET.fromstring(document)
    spoken = {v.text for v in root.iter("version") if v.text}
    known: list[str] = VmomiSupport.GetServiceVersions("vim25")  # type: ignore[no-untyped-call]
    return next((v for v in known if VmomiSupport.versionIdMap.get(v) in spoken), None)


def _session_manager(content: vim.ServiceInstanceContent) -> vim.SessionManager:
    manager = content.sessionManager
    if manager is None:
        raise errors.NotSupported(f"the endpoint at {content.about.fullName!r} has no session manager")
    return manager


def _about(content: vim.ServiceInstanceContent) -> dict[str, Any]:
    about = content.about
    return {
        "name": about.name,
        "full_name": about.fullName,
        "version": about.version,
        "build": about.build,
        "api_type": about.apiType,
        "api_version": about.apiVersion,
        "instance_uuid": getattr(about, "instanceUuid", None) or None,
    }


class SessionPool:
    """Sessions for one target: lazy login, at most ``pool_size``, one re-login on expiry, bounded close."""

    def __init__(self, target: Target, credentials: Credentials, *, connections: int = 1) -> None:
        self.target = target
        self._credentials = credentials
        #: HTTP connections each session keeps open for reuse (a mirror's session has a long wait on
        #: one while a read's cancel of it goes on another)
        self._connections = connections
        self._cond = threading.Condition()
        self._idle: list[VSphereSession] = []
        self._size = 0
        self._in_use = 0
        self._logins = 0
        self._relogins = 0
        self._closed = False
        self._api_version: str | None = None
        self._tls: ssl.SSLContext | None = None
        self._about: dict[str, Any] | None = None

    # --- public

    def run(self, fn: Callable[[VSphereSession], T]) -> T:
        """Run ``fn`` with a session of this pool's own (blocking; call it from a worker thread).

        Checks out an idle session or logs in a new one (at most ``pool_size`` exist), runs
        ``fn(session)`` and returns the session to the pool. If ``fn`` raises ``NotAuthenticated``
        the session logs in again and ``fn`` runs once more from the start, so ``fn`` must be safe to
        re-run after a call the target refused for want of a session; a second ``NotAuthenticated``
        is an error. vSphere faults and transport errors leave as ``GatewayError`` subclasses (see
        ``faults.translate``); any other exception from ``fn`` propagates unchanged.
        """
        session = self._guarded(self._checkout)
        try:
            return self._guarded(lambda: self._call(session, fn))
        finally:
            self._checkin(session)

    def about(self) -> dict[str, Any]:
        """Product name, version, build, API type and version, instance uuid (None for ESXi).

        Read at login and cached; logs in first (blocking) if no session has logged in yet.
        """
        if self._about is None:
            self.run(lambda _session: None)
        assert self._about is not None
        return dict(self._about)

    @property
    def stats(self) -> PoolStats:
        with self._cond:
            return PoolStats(self._size, self._in_use, self._logins, self._relogins)

    def close(self) -> None:
        """Log out every idle session (best effort, at most ``CLOSE_SECONDS``); lent ones log out when
        returned. Later ``run`` calls fail."""
        with self._cond:
            self._closed = True
            sessions, self._idle = self._idle, []
            self._size -= len(sessions)
            self._cond.notify_all()
        workers = [threading.Thread(target=self._logout, args=(s,), daemon=True,
                                    name=f"vsphere-logout-{self.target.name}") for s in sessions]
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + CLOSE_SECONDS
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    # --- checkout / checkin

    def _checkout(self) -> VSphereSession:
        deadline = time.monotonic() + self.target.timeout_seconds
        with self._cond:
            while not self._idle and self._size >= self.target.pool_size and not self._closed:
                if not self._cond.wait(deadline - time.monotonic()):
                    raise errors.QueueTimeout(
                        f"target '{self.target.name}': all {self.target.pool_size} sessions stayed busy for "
                        f"{self.target.timeout_seconds:g}s; raise 'pool_size' or send fewer concurrent calls",
                        target=self.target.name)
            if self._closed:
                raise errors.Unreachable(
                    f"target '{self.target.name}': the gateway is shutting down its sessions; retry later",
                    target=self.target.name)
            self._in_use += 1
            if self._idle:
                return self._idle.pop()
            self._size += 1
        try:
            return self._login()
        except BaseException:
            with self._cond:
                self._size -= 1
                self._in_use -= 1
                self._cond.notify()
            raise

    def _checkin(self, session: VSphereSession) -> None:
        with self._cond:
            self._in_use -= 1
            if self._closed:
                self._size -= 1
            else:
                self._idle.append(session)
            self._cond.notify()
            closed = self._closed
        if closed:
            self._logout(session)

    # --- calls

    def _call(self, session: VSphereSession, fn: Callable[[VSphereSession], T]) -> T:
        try:
            return fn(session)
        except vim.fault.NotAuthenticated:
            log.info("target %s: session expired; logging in again", self.target.name)
            self._relogin(session)
        return fn(session)

    def _guarded(self, step: Callable[[], T]) -> T:
        try:
            return step()
        except Exception as exc:
            if not faults.is_foreign(exc):
                raise
            error = faults.translate(exc, self.target.name)
            log.debug("target %s: %s", self.target.name, error.message, exc_info=True)
            raise error from exc

    # --- login / logout

    def _login(self) -> VSphereSession:
        started = time.monotonic()
        stub: Any = SoapStubAdapter(  # type: ignore[no-untyped-call]
            host=self.target.host, port=self.target.port, version=self._negotiated_version(),
            poolSize=self._connections,
            sslContext=self._tls_context(), httpConnectionTimeout=self.target.timeout_seconds,
            connectionPoolTimeout=IDLE_CONNECTION_SECONDS)
        tracing.trace_soap(stub, self.target.name)
        try:
            si = vim.ServiceInstance("ServiceInstance", stub)  # type: ignore[no-untyped-call]
            content = si.RetrieveContent()
            user_session = _session_manager(content).Login(
                self._credentials.user, self._credentials.password, None)
        except BaseException:
            stub.DropConnections()
            raise
        with self._cond:
            self._logins += 1
            self._about = _about(content)
        log.info("target %s: logged in (%.0f ms)", self.target.name, (time.monotonic() - started) * 1000)
        return VSphereSession(self.target, si, content, stub, user_session.key)

    def _relogin(self, session: VSphereSession) -> None:
        # A login that carries the old session cookie is refused by some servers: send none.
        session._stub.SetSessionId(None)
        user_session = _session_manager(session.content).Login(
            self._credentials.user, self._credentials.password, None)
        session.key = user_session.key
        session.views.clear()  # they were the old login's
        with self._cond:
            self._relogins += 1

    def _logout(self, session: VSphereSession) -> None:
        try:
            _session_manager(session.content).Logout()
        except Exception as exc:  # best effort: the target may be gone or the session already expired
            log.debug("target %s: logout failed: %s", self.target.name, type(exc).__name__)
        finally:
            session._stub.DropConnections()

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = tls_context(self.target)
        return self._tls

    def _negotiated_version(self) -> str:
        """The API version to speak, asked of the server once per pool (one extra HTTPS request)."""
        if self._api_version is None:
            self._api_version = self._fetch_api_version()
        return self._api_version

    def _fetch_api_version(self) -> str:
        conn = http.client.HTTPSConnection(self.target.host, self.target.port, context=self._tls_context(),
                                           timeout=self.target.timeout_seconds)
        try:
            conn.request("GET", _VERSIONS_PATH)
            response = conn.getresponse()
            body = response.read(_MAX_VERSIONS_BYTES)
        finally:
            conn.close()
        try:
            version = supported_api_version(body) if response.status == 200 else None
        except ET.ParseError:
            version = None
        if version is None:
            raise errors.NotSupported(
                f"target '{self.target.name}': {self.target.address} did not describe a vSphere API version "
                f"this gateway speaks (HTTP {response.status} for {_VERSIONS_PATH}); check that 'host' and "
                "'port' point at a vCenter or ESXi host", target=self.target.name)
        return version
