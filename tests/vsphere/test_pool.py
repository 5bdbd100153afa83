"""SessionPool against the simulator over real SOAP/TLS: lazy login, size bound, re-login, failures, close."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pyVim.connect import Disconnect
from pyVmomi import vim
from support.simulator import (
    VC1_INSTANCE_UUID,
    MakeSimulator,
    Simulator,
    closed_port,
    pyvmomi_connect,
    sim_target,
)

from gateway import errors
from gateway.config import Credentials, Target
from gateway.vsphere.pool import SessionPool, VSphereSession


def credentials(sim: Simulator) -> Credentials:
    return Credentials(sim.user, sim.password)


def session_keys(sim: Simulator) -> set[str]:
    """The keys of every session the simulator holds, seen from a separate admin login (excluded)."""
    si = pyvmomi_connect(sim)
    try:
        manager = si.content.sessionManager
        return {s.key for s in manager.sessionList} - {manager.currentSession.key}
    finally:
        Disconnect(si)  # type: ignore[no-untyped-call]


def now(session: VSphereSession) -> Any:
    return session.si.CurrentTime()


def test_login_is_lazy(sim_vc1: Simulator) -> None:
    before = session_keys(sim_vc1)
    pool = SessionPool(sim_target("vc1", sim_vc1), credentials(sim_vc1))
    try:
        assert pool.stats.logins == 0 and pool.stats.size == 0
        assert session_keys(sim_vc1) == before
        key = pool.run(lambda s: s.key)
        assert session_keys(sim_vc1) - before == {key}
        assert pool.stats.logins == 1 and pool.stats.size == 1 and pool.stats.in_use == 0
        assert pool.run(lambda s: s.key) == key  # the idle session is reused, no second login
        assert pool.stats.logins == 1
    finally:
        pool.close()


def test_a_session_keeps_as_many_connections_as_its_pool_is_given(sim_vc1: Simulator) -> None:
    """One HTTP connection per session by default; a mirror's pool keeps two (its long wait holds one
    while a read's cancel of it goes on the other, with no new TLS handshake)."""
    target = sim_target("vc1", sim_vc1)
    for given, kept in (({}, 1), ({"connections": 2}, 2)):
        pool = SessionPool(target, credentials(sim_vc1), **given)
        try:
            assert pool.run(lambda s: s._stub.poolSize) == kept
        finally:
            pool.close()


def test_about_is_cached_from_login(sim_vc1: Simulator, sim_esx: Simulator) -> None:
    vc = SessionPool(sim_target("vc1", sim_vc1), credentials(sim_vc1))
    esx = SessionPool(sim_target("esx", sim_esx, standalone_host=True), credentials(sim_esx))
    try:
        about = vc.about()
        assert about["api_type"] == "VirtualCenter" and about["instance_uuid"] == VC1_INSTANCE_UUID
        assert about["name"] and about["version"]
        assert vc.stats.logins == 1
        esx_about = esx.about()
        assert esx_about["api_type"] == "HostAgent" and esx_about["instance_uuid"] is None
    finally:
        vc.close()
        esx.close()


def test_pool_never_exceeds_pool_size_under_load(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(method_delay={"CurrentTime": 30})
    before = session_keys(sim)
    pool = SessionPool(sim_target("vc", sim, pool_size=2), credentials(sim))
    lock = threading.Lock()
    active = peak = 0
    used: set[str] = set()

    def call(session: VSphereSession) -> Any:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
            used.add(session.key)
        try:
            return session.si.CurrentTime()
        finally:
            with lock:
                active -= 1

    try:
        with ThreadPoolExecutor(max_workers=6) as workers:
            results = list(workers.map(lambda _: pool.run(call), range(18)))
        assert len(results) == 18
        assert peak == 2
        assert pool.stats.size == 2 and pool.stats.logins == 2 and pool.stats.in_use == 0
        assert len(used) == 2 and session_keys(sim) - before == used
    finally:
        pool.close()


def test_terminated_session_relogs_in_once_transparently(make_simulator: MakeSimulator) -> None:
    sim = make_simulator()
    pool = SessionPool(sim_target("vc", sim), credentials(sim))
    seen: list[str] = []

    def call(session: VSphereSession) -> Any:
        seen.append(session.key)
        return session.si.CurrentTime()

    try:
        pool.run(call)
        assert sim.control("/terminate-sessions", {})["terminated"] >= 1
        seen.clear()
        assert pool.run(call) is not None
        assert len(seen) == 2 and seen[0] != seen[1]
        assert pool.stats.relogins == 1 and pool.stats.logins == 1 and pool.stats.size == 1
        assert seen[1] in session_keys(sim)
    finally:
        pool.close()


def test_persistent_not_authenticated_is_an_error_not_a_loop(make_simulator: MakeSimulator) -> None:
    sim = make_simulator()
    pool = SessionPool(sim_target("vc", sim), credentials(sim))
    calls = 0

    def call(session: VSphereSession) -> Any:
        nonlocal calls
        calls += 1
        return session.si.CurrentTime()

    try:
        pool.run(call)
        calls = 0
        sim.control("/fail-next", {"method": "CurrentTime", "fault": "NotAuthenticated", "count": 5})
        with pytest.raises(errors.NotAuthenticated) as caught:
            pool.run(call)
        assert calls == 2 and pool.stats.relogins == 1
        assert "target 'vc'" in caught.value.message
        assert pool.stats.in_use == 0 and pool.stats.size == 1
    finally:
        pool.close()


def test_fake_fault_not_authenticated_every_time_is_an_error_not_a_loop(sim_vc1: Simulator) -> None:
    """The simulator cannot refuse a fresh session forever, so the fault here is raised by fn itself."""
    pool = SessionPool(sim_target("vc1", sim_vc1), credentials(sim_vc1))
    calls = 0

    def fake_expired(session: VSphereSession) -> Any:
        nonlocal calls
        calls += 1
        raise vim.fault.NotAuthenticated()  # type: ignore[no-untyped-call]

    try:
        with pytest.raises(errors.NotAuthenticated):
            pool.run(fake_expired)
        assert calls == 2 and pool.stats.relogins == 1
        assert pool.run(now) is not None  # the session is still usable afterwards
    finally:
        pool.close()


def test_wrong_password_is_auth_failed_without_the_password(sim_vc1: Simulator) -> None:
    wrong = "Wr0ng-Passw0rd-that-must-not-leak"
    pool = SessionPool(sim_target("vc1", sim_vc1), Credentials(sim_vc1.user, wrong))
    with pytest.raises(errors.AuthFailed) as caught:
        pool.run(now)
    wire = str(caught.value.to_wire())
    assert wrong not in wire and "target 'vc1'" in wire
    assert pool.stats.size == 0 and pool.stats.in_use == 0 and pool.stats.logins == 0
    pool.close()


def test_closed_port_is_unreachable() -> None:
    target = Target(name="gone", host="127.0.0.1", port=closed_port(), credential_env_prefix="GONE",
                    insecure=True, timeout_seconds=5)
    pool = SessionPool(target, Credentials("u", "p"))
    with pytest.raises(errors.Unreachable) as caught:
        pool.run(now)
    assert "target 'gone'" in caught.value.message and "port" in caught.value.message
    assert pool.stats.size == 0 and pool.stats.in_use == 0


def test_silent_peer_times_out(silent_port: int) -> None:
    target = Target(name="hung", host="127.0.0.1", port=silent_port, credential_env_prefix="HUNG",
                    insecure=True, timeout_seconds=0.5)
    pool = SessionPool(target, Credentials("u", "p"))
    with pytest.raises(errors.Timeout) as caught:
        pool.run(now)
    assert "target 'hung'" in caught.value.message and "timeout_seconds" in caught.value.message
    assert pool.stats.size == 0


def test_tls_is_verified_by_default(sim_vc1: Simulator, tmp_path: Path) -> None:
    verified = SessionPool(sim_target("vc1", sim_vc1, insecure=False), credentials(sim_vc1))
    with pytest.raises(errors.Unreachable) as caught:
        verified.run(now)
    assert "ca_file" in caught.value.message and "insecure" in caught.value.message
    assert verified.stats.size == 0

    missing = SessionPool(sim_target("vc1", sim_vc1, insecure=False, ca_file=str(tmp_path / "nope.pem")),
                          credentials(sim_vc1))
    with pytest.raises(errors.ConfigError, match="ca_file"):
        missing.run(now)


def _self_signed(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A P-256 certificate for 127.0.0.1 that is its own CA; returns (cert, key) PEM paths."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now_utc = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now_utc - datetime.timedelta(minutes=5))
            .not_valid_after(now_utc + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_ca_file_is_the_trust_anchor(tmp_path: Path) -> None:
    """The simulator's built-in certificate has a key OpenSSL rejects as too weak, so the handshake is
    checked against a small TLS listener here instead."""
    from gateway.vsphere.pool import tls_context

    cert, key = _self_signed(tmp_path, "server")
    other, _ = _self_signed(tmp_path, "other")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            for _ in range(2):
                conn, _addr = listener.accept()
                with conn, contextlib.suppress(OSError):
                    server_context.wrap_socket(conn, server_side=True).close()

        server = threading.Thread(target=serve, daemon=True)
        server.start()

        def handshake(ca_file: Path) -> None:
            target = Target(name="tls", host="127.0.0.1", port=port, credential_env_prefix="TLS",
                            ca_file=str(ca_file))
            context = tls_context(target)
            assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                context.wrap_socket(raw, server_hostname="127.0.0.1").close()

        handshake(cert)
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake(other)
        server.join(10)


def test_close_logs_every_session_out(sim_vc1: Simulator) -> None:
    pool = SessionPool(sim_target("vc1", sim_vc1, pool_size=2), credentials(sim_vc1))
    both_busy = threading.Barrier(2, timeout=10)

    def hold(session: VSphereSession) -> str:
        both_busy.wait()  # two sessions in use at once, so the pool has to open two
        return session.key

    with ThreadPoolExecutor(max_workers=2) as workers:
        keys = set(workers.map(lambda _: pool.run(hold), range(2)))
    assert len(keys) == 2 and keys <= session_keys(sim_vc1)
    pool.close()
    assert not keys & session_keys(sim_vc1)
    assert pool.stats.size == 0
    with pytest.raises(errors.Unreachable, match="shutting down"):
        pool.run(now)


def test_fn_errors_that_are_not_faults_propagate_and_free_the_session(sim_vc1: Simulator) -> None:
    pool = SessionPool(sim_target("vc1", sim_vc1), credentials(sim_vc1))

    def broken(session: VSphereSession) -> Any:
        raise LookupError("a bug in the caller")

    try:
        with pytest.raises(LookupError):
            pool.run(broken)
        assert pool.stats.in_use == 0 and pool.stats.size == 1
        with pytest.raises(errors.NotFound):  # a gateway error raised by fn passes through as is
            pool.run(lambda s: (_ for _ in ()).throw(errors.NotFound("no such VM")))
    finally:
        pool.close()
