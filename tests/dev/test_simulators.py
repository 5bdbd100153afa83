"""gateway.dev.simulators: targets.yaml and credentials for launchers, and reading a launcher's announcement.

No simulator runs here: the announcement tests read the stdout of a short Python child process."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import load_targets
from gateway.dev.simulators import (
    SimulatorError,
    SimulatorProcess,
    _dash_to_none,
    _read_announcement,
    credential_prefix,
    credentials_env,
    target_entry,
    write_targets,
)


def sim(tmp_path: Path, model: str = "vc", port: int = 8989, control: str | None = None) -> SimulatorProcess:
    return SimulatorProcess(url=f"https://127.0.0.1:{port}/sdk", host="127.0.0.1", port=port, user="admin",
                            password="s3cret", instance_uuid=None, control_url=control, pid=0, model=model,
                            process=None, tmpdir=tmp_path)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "prefix"), [
    ("vc-1", "SIM_VC_1"), ("lab", "SIM_LAB"), ("esx.example", "SIM_ESX_EXAMPLE"), ("a b", "SIM_A_B"),
    ("Prod2", "SIM_PROD2"),
])
def test_credential_prefix(name: str, prefix: str) -> None:
    assert credential_prefix(name) == prefix


@pytest.mark.parametrize(("value", "out"), [(None, None), ("", None), ("-", None), ("x", "x"), ("--", "--")])
def test_dash_to_none(value: str | None, out: str | None) -> None:
    assert _dash_to_none(value) == out


def test_a_vcenter_entry(tmp_path: Path) -> None:
    assert target_entry("vc-1", sim(tmp_path)) == {"name": "vc-1", "host": "127.0.0.1", "port": 8989,
                                                   "credential_env_prefix": "SIM_VC_1", "insecure": True}


def test_an_esx_entry_is_a_standalone_host_and_extra_keys_win(tmp_path: Path) -> None:
    entry = target_entry("esx", sim(tmp_path, model="esx"), tags=["lab"], insecure=False)
    assert entry["standalone_host"] is True and entry["tags"] == ["lab"] and entry["insecure"] is False


def test_credentials_env(tmp_path: Path) -> None:
    assert credentials_env({"vc-1": sim(tmp_path), "vc-2": sim(tmp_path, port=1)}) == {
        "SIM_VC_1_USER": "admin", "SIM_VC_1_PASSWORD": "s3cret",
        "SIM_VC_2_USER": "admin", "SIM_VC_2_PASSWORD": "s3cret"}


def test_write_targets_writes_a_private_file_the_gateway_loads(tmp_path: Path) -> None:
    path = tmp_path / "targets.yaml"
    env = write_targets(path, {"vc-1": sim(tmp_path), "esx": sim(tmp_path, model="esx", port=9000)},
                        {"vc-1": {"tags": ["lab"]}})
    assert env["SIM_ESX_USER"] == "admin"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    targets = {t.name: t for t in load_targets(path)}
    assert targets["vc-1"].tags == ("lab",) and targets["vc-1"].insecure
    assert targets["esx"].standalone_host and targets["esx"].port == 9000


def test_address_and_log(tmp_path: Path) -> None:
    process = sim(tmp_path, port=1234)
    assert process.address == "127.0.0.1:1234"
    assert process.log() == ""
    (tmp_path / "vcsim.log").write_text("started\n")
    assert process.log() == "started\n"


def test_control_without_its_endpoint(tmp_path: Path) -> None:
    with pytest.raises(SimulatorError, match="started without its control endpoint"):
        sim(tmp_path).control("/health")


def test_the_password_is_not_in_the_repr(tmp_path: Path) -> None:
    assert "s3cret" not in repr(sim(tmp_path))


def child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def announced(code: str) -> dict[str, str]:
    process = child(code)
    try:
        return _read_announcement(process, timeout=30)
    finally:
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


def test_the_announcement_line_is_read_as_fields() -> None:
    line = "VCSIM_URL=https://127.0.0.1:1/sdk VCSIM_PID=7 noise VCSIM_UUID=-"
    fields = announced(f"print({line!r}); print('x')")
    assert fields == {"VCSIM_URL": "https://127.0.0.1:1/sdk", "VCSIM_PID": "7", "VCSIM_UUID": "-"}


def test_an_announcement_in_pieces() -> None:
    code = ("import sys\nsys.stdout.write('VCSIM_URL=a'); sys.stdout.flush()\n"
            "sys.stdout.write(' B=c\\n'); sys.stdout.flush()")
    assert announced(code) == {"VCSIM_URL": "a", "B": "c"}


def test_a_launcher_that_exits_first() -> None:
    with pytest.raises(SimulatorError, match=r"the launcher exited with status 3 before serving"):
        announced("import sys; sys.exit(3)")


def test_unexpected_output() -> None:
    with pytest.raises(SimulatorError) as raised:
        announced("print('listening on 8989')")
    assert str(raised.value) == "unexpected launcher output: 'listening on 8989'"
