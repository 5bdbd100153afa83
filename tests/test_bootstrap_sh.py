"""The fresh-machine path: ``make run`` and ``make test`` (the README's two commands) and ``.ci/run`` all
start with deploy/bootstrap.sh, the one list of Debian packages; it installs what is missing as root and
otherwise prints one sudo line and stops.

The install/refuse logic runs against fake ``dpkg``/``apt-get``/``id`` commands (a fresh machine's
missing packages cannot be produced on this one); the check itself runs for real on this machine."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BOOTSTRAP = REPO / "deploy" / "bootstrap.sh"


def readme_quick_start() -> list[str]:
    """The commands of the README's quick-start block (comments dropped)."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the quick start has no ```sh block"
    commands = (line.split("#", 1)[0].strip() for line in block.group(1).splitlines())
    return [command for command in commands if command]


def make_plan(*argv: str) -> list[str]:
    """What ``make -n`` would run, as a person typing it would see it: not as a sub-make of ``make test``
    (which would print "Entering directory" lines and inherit the outer make's flags)."""
    outer = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")
    env = {k: v for k, v in os.environ.items() if k not in outer}
    done = subprocess.run(["make", "-n", *argv], cwd=REPO, capture_output=True, text=True, check=True,
                          env=env)
    return done.stdout.splitlines()


def packages(*argv: str) -> list[str]:
    return subprocess.run(["bash", str(BOOTSTRAP), "--list", *argv], check=True, capture_output=True,
                          text=True).stdout.split()


#: what only the tests need: never installed by `make run`
TEST_ONLY = {"chromium", "buildah", "mmdebstrap", "postgresql", "rsyslog", "rsyslog-gnutls", "nodejs", "npm",
             "prometheus"}


def test_the_readme_quick_start_is_two_make_commands_that_bootstrap_first() -> None:
    commands = readme_quick_start()
    assert commands == ["make run", "make test"]
    expected = {"make run": "bash deploy/bootstrap.sh run", "make test": "bash deploy/bootstrap.sh"}
    for command in commands:
        first = make_plan(*command.split()[1:])[0]
        assert first == expected[command], f"`{command}` starts with {first!r}"


def test_the_run_set_holds_only_what_the_demo_needs_and_the_full_list_everything() -> None:
    run, everything = packages("run"), packages()
    assert not TEST_ONLY & set(run), run
    assert {"golang-go", "golang-github-vmware-govmomi-dev", "python3-venv", "make"} <= set(run)
    assert set(run) < set(everything) and TEST_ONLY - {"npm"} <= set(everything)
    assert packages("test") == everything


def test_make_run_on_a_machine_without_chromium_installs_no_chromium(tmp_path: Path) -> None:
    env = {**fake_debian(tmp_path, uid=0), "BOOTSTRAP_LOG": str(tmp_path / "bootstrap.log")}
    result = subprocess.run(["bash", str(BOOTSTRAP), "run"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    installed = (tmp_path / "apt-get.calls").read_text().splitlines()[-1].split()
    assert "chromium" not in installed and not TEST_ONLY & set(installed), installed
    assert installed[4:] == packages("run")


def test_apt_output_goes_to_the_log_and_the_terminal_gets_one_line_per_step(tmp_path: Path) -> None:
    env = fake_debian(tmp_path, uid=0, apt_says="Selecting previously unselected package x.\n" * 300)
    log = tmp_path / "bootstrap.log"
    result = subprocess.run(["bash", str(BOOTSTRAP)], env={**env, "BOOTSTRAP_LOG": str(log)},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert result.stdout == "" and len(lines) == 4, lines
    assert str(log) in lines[0] and lines[1] == "bootstrap: apt-get update"
    assert lines[2].startswith("bootstrap: apt-get install ") and lines[3] == "bootstrap: done"
    assert log.read_text().count("Selecting previously unselected") == 600


def test_a_failing_step_shows_the_end_of_the_log(tmp_path: Path) -> None:
    env = fake_debian(tmp_path, uid=0, apt_says="E: Unable to locate package chromium\n", apt_code=100)
    env["BOOTSTRAP_LOG"] = str(tmp_path / "b.log")
    result = subprocess.run(["bash", str(BOOTSTRAP), "run"], env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert "apt-get update failed" in result.stderr and "Unable to locate package" in result.stderr


def test_make_run_takes_the_port() -> None:
    plan = make_plan("run", "PORT=9443")
    assert plan[-1].endswith("-m gateway.dev.demo --port 9443"), plan


def test_ci_runs_the_same_bootstrap_and_the_readme_test_command() -> None:
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.strip().startswith("#")]
    assert "bash deploy/bootstrap.sh" in ci
    assert ci.index("bash deploy/bootstrap.sh") < ci.index(readme_quick_start()[1]) and "make lint" in ci
    assert "apt-get" not in (REPO / ".ci" / "run").read_text(), "the package list lives only in bootstrap.sh"


def test_postgresql_and_the_simulator_toolchain_are_in_the_list() -> None:
    assert {"postgresql", "golang-go", "golang-github-vmware-govmomi-dev", "chromium"} <= set(packages())


def test_the_bootstrap_check_passes_on_this_machine() -> None:
    result = subprocess.run(["bash", str(BOOTSTRAP), "--check"], capture_output=True, text=True)
    if result.returncode != 0 and os.environ.get("CI") != "true":
        pytest.skip(f"this machine lacks packages (CI installs them): {result.stdout.strip()}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every package is installed" in result.stdout


def fake_debian(tmp_path: Path, uid: int, apt_says: str = "", apt_code: int = 0) -> dict[str, str]:
    """A PATH whose dpkg knows no package, whose id answers ``uid`` and whose apt-get records its calls
    (printing ``apt_says``, exiting ``apt_code``)."""
    fake = tmp_path / "fake-debian-tools"
    fake.mkdir()
    (tmp_path / "apt-says").write_text(apt_says)
    scripts = {
        "dpkg": "exit 1",
        "id": f'[ "$1" = "-u" ] && echo {uid}',
        "apt-get": f'echo "$*" >> {tmp_path / "apt-get.calls"}; cat {tmp_path / "apt-says"}; exit {apt_code}',
    }
    for name, body in scripts.items():
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(0o755)
    return {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}


def test_a_user_without_root_gets_one_sudo_line_and_a_stop(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(BOOTSTRAP)], env=fake_debian(tmp_path, uid=1000),
                            capture_output=True, text=True)
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].endswith("sudo apt-get install -y --no-install-recommends " + " ".join(packages()))
    assert not (tmp_path / "apt-get.calls").exists()


def test_root_installs_what_is_missing(tmp_path: Path) -> None:
    env = {**fake_debian(tmp_path, uid=0), "BOOTSTRAP_LOG": str(tmp_path / "bootstrap.log")}
    result = subprocess.run(["bash", str(BOOTSTRAP)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "apt-get.calls").read_text().splitlines()
    assert calls == ["update -qq", "install -y -qq --no-install-recommends " + " ".join(packages())]
