"""gateway.cli.serve: the checks ``gateway serve`` makes before it builds or binds anything."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

from gateway import cli
from gateway.auth.tokens import create_token
from gateway.cli import main
from gateway.cli.serve import (
    DEFAULT_PORT,
    STDIO_WEB,
    check_network_args,
    edge_config,
    environment_problem,
    require_token,
    switches,
)
from gateway.errors import ConfigError, InvalidArgument
from gateway.settings import Settings
from gateway.store import SqliteStore


@pytest.fixture(autouse=True)
def only_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("serve",))


def args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["serve", *argv])


HTTPS = ("--transport", "https", "--cert", "c.pem", "--key", "k.pem", "--public-name", "gw.example")


def test_switches_left_off_leave_the_environment_its_say() -> None:
    assert switches(args()) == {"read_only": None, "enable_destructive": None, "web_ui": None,
                                "allow_write": None}


def test_switches_given_turn_features_on() -> None:
    out = switches(args("--read-only", "--enable-destructive", "--web", "--allow-write", "create_snapshot"))
    assert out["read_only"] is True and out["enable_destructive"] is True and out["web_ui"] is True
    assert out["allow_write"] is not None


@pytest.mark.parametrize(("argv", "host"), [
    (HTTPS, "0.0.0.0"),
    (("--transport", "http"), "127.0.0.1"),
    (("--transport", "http", "--host", "localhost"), "localhost"),
    (("--transport", "http", "--host", "::1"), "::1"),
    ((*HTTPS, "--host", "10.0.0.5"), "10.0.0.5"),
])
def test_the_address_to_bind(argv: tuple[str, ...], host: str) -> None:
    assert check_network_args(args(*argv)) == host


@pytest.mark.parametrize("port", ["0", "1", "65535"])
def test_ports_in_range(port: str) -> None:
    assert check_network_args(args("--transport", "http", "--port", port)) == "127.0.0.1"


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_ports_out_of_range(port: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_network_args(args("--transport", "http", "--port", port))
    assert raised.value.message == "port: must be between 1 and 65535 (0 picks a free port)"


def test_the_default_port() -> None:
    assert args().port == DEFAULT_PORT == 8443


@pytest.mark.parametrize("flag", ["--session-idle-seconds", "--max-body-bytes", "--max-concurrent",
                                  "--max-sessions", "--max-sessions-per-token", "--header-timeout-seconds"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_limits_must_be_positive(flag: str, value: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_network_args(args("--transport", "http", flag, value))
    assert raised.value.message == f"{flag}: must be a positive number"


@pytest.mark.parametrize(("argv", "missing"), [
    (("--transport", "https"), "--cert, --key, --public-name"),
    (("--transport", "https", "--cert", "c.pem"), "--key, --public-name"),
    (("--transport", "https", "--cert", "c.pem", "--key", "k.pem"), "--public-name"),
])
def test_https_needs_a_certificate_and_a_public_name(argv: tuple[str, ...], missing: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_network_args(args(*argv))
    assert raised.value.message == (f"transport: https needs {missing}; create a certificate with `gateway "
                                    "cert create --name NAME --out DIR`")


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "gw.example"])
def test_http_binds_loopback_only(host: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_network_args(args("--transport", "http", "--host", host))
    assert raised.value.message == (f"host: http binds a loopback address only (127.0.0.1, ::1 or "
                                    f"localhost), not {host!r}; put a TLS-terminating proxy in front, or use "
                                    "--transport https")


def test_edge_config_for_https() -> None:
    config = edge_config(args(*HTTPS, "--max-concurrent", "8", "--max-body-bytes", "1000"))
    assert config.surface == "https" and config.origin_schemes == {"https"}
    assert config.max_concurrent_requests == 8 and config.max_body_bytes == 1000
    assert config.host_allowed("gw.example", "https")
    assert not config.host_allowed("evil.example", "https")


def test_edge_config_for_http_allows_loopback_names() -> None:
    config = edge_config(args("--transport", "http", "--public-name", "gw.example"))
    assert config.surface == "http" and config.origin_schemes == {"http", "https"}
    assert config.host_allowed("localhost:8443", "http")
    assert config.host_allowed("gw.example", "https")


def test_require_token(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "state.db") as store:
        with pytest.raises(ConfigError) as raised:
            require_token(store)
        assert raised.value.message.startswith("no usable bearer token exists, so no client could connect; "
                                               "create one with `gateway token create NAME --role admin`")
        create_token(store, "expired", "admin", expires_in=1.0, now=time.time() - 60)
        with pytest.raises(ConfigError):
            require_token(store)
        create_token(store, "ci", "admin", expires_in=None, now=time.time())
        assert require_token(store) is None


def test_environment_problem(tmp_path: Path) -> None:
    home = str(tmp_path)
    assert environment_problem(Settings.from_env({}, home=home)) is None
    assert environment_problem(Settings.from_env({"GATEWAY_ALLOW_WRITE": "power_on_vm"}, home=home)) is None
    problem = environment_problem(Settings.from_env({"GATEWAY_ALLOW_WRITE": "nope"}, home=home))
    assert problem is not None
    assert problem.startswith("GATEWAY_ALLOW_WRITE='nope': 'nope' is not a write tool of this gateway")


def test_stdio_serves_no_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--web", "--home", str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"gateway: config_error: {STDIO_WEB}\n"
    assert list(tmp_path.iterdir()) == []


def test_a_bad_network_flag_stops_serve_before_anything_is_built(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--transport", "http", "--host", "0.0.0.0", "--home", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gateway: invalid_argument: host: http binds a loopback address")
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_transport_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as raised:
        args("--transport", "ftp")
    assert raised.value.code == 2
