"""The lab suite (tests/lab, ``make lab-test``) proven on every change: run against two simulators as
a user runs it against their vCenters (``LAB_TARGETS_FILE`` and the ``<PREFIX>_USER``/``_PASSWORD``
variables), and refused with the variable's name without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.simulator import Simulator, write_targets

REPO = Path(__file__).resolve().parent.parent


def outer_env() -> dict[str, str]:
    """This environment without the outer pytest's and make's own variables, nor a lab of its own."""
    dropped = ("PYTEST_", "MAKE", "MFLAGS", "LAB_TARGETS_FILE")
    return {k: v for k, v in os.environ.items() if not k.startswith(dropped)}


def test_the_lab_suite_passes_against_two_simulators(sim_vc1: Simulator, sim_vc2: Simulator,
                                                     tmp_path: Path) -> None:
    lab_file = tmp_path / "lab-targets.yaml"
    credentials = write_targets(lab_file, {"lab-a": sim_vc1, "lab-b": sim_vc2})
    env = {**outer_env(), **credentials, "LAB_TARGETS_FILE": str(lab_file)}
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/lab", "-q", "-p", "no:cacheprovider"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "7 passed" in done.stdout and "skipped" not in done.stdout, done.stdout


def test_without_the_variable_make_lab_test_names_it_and_exits_2() -> None:
    done = subprocess.run(["make", "--no-print-directory", "lab-test"], cwd=REPO, env=outer_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "set LAB_TARGETS_FILE" in done.stderr and "_USER" in done.stderr, done.stderr
    assert "pytest" not in done.stdout  # nothing ran


def test_without_the_variable_the_main_collection_holds_no_lab_test() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/lab", "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=REPO, env=outer_env(), capture_output=True,
                          text=True, timeout=120, check=False)
    assert "test_lab_readonly" not in done.stdout, done.stdout
