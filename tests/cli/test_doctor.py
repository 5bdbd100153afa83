"""``gateway doctor`` against real simulators: a reachable target passes; an untrusted certificate and
a missing credential are named with their fix; ``--json`` says the same for scripts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support.httpserver import FAST_HASH, GATEWAY_MAIN
from support.simulator import MakeSimulator, Simulator, write_targets

from gateway.auth.tokens import create_token
from gateway.store.sqlite import SqliteStore

REPO = Path(__file__).resolve().parents[2]


def doctor(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", GATEWAY_MAIN, "doctor", *argv], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, check=False)


def setup(tmp_path: Path, sims: dict[str, Simulator], extra: dict[str, Any] | None = None,
          token: bool = True) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = write_targets(tmp_path / "targets.yaml", sims, extra)
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
                "PATH": "/usr/bin:/bin"})
    if token:
        with SqliteStore(home / "state.db") as store:
            create_token(store, "ops", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    return env


def test_doctor_passes_a_reachable_target(sim_vc1: Simulator, tmp_path: Path) -> None:
    env = setup(tmp_path, {"vc1": sim_vc1})
    done = doctor(env, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    checks = {(c["check"], c["subject"]): c for c in report["checks"]}
    assert report["ok"] is True
    assert checks[("reachable", "vc1")]["ok"] and checks[("clock", "vc1")]["ok"]
    assert {"credentials", "database", "audit", "token", "signing_key", "file"} <= {c["check"] for c in
                                                                                   report["checks"]}


def test_doctor_names_an_untrusted_certificate_and_a_missing_credential(
    make_simulator: MakeSimulator, sim_vc1: Simulator, tmp_path: Path,
) -> None:
    other = make_simulator()
    env = setup(tmp_path, {"vc1": sim_vc1, "vc2": other}, {"vc1": {"insecure": False}}, token=False)
    for key in [k for k in env if k.startswith("SIM_VC2_")]:
        del env[key]
    done = doctor(env)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "FIX  certificate  vc1: " in out and "certificate could not be verified" in out, out
    assert "fix: set 'ca_file' in targets.yaml" in out, out
    assert "FIX  credentials  vc2: " in out and "fix: set SIM_VC2_USER and SIM_VC2_PASSWORD" in out, out
    assert "FIX  token" in out and "gateway token create NAME --role admin" in out, out
    assert "3 thing(s) to fix" in done.stderr
    as_json = json.loads(doctor(env, "--json").stdout)
    failed = {(c["check"], c["subject"]) for c in as_json["checks"] if not c["ok"]}
    assert {("certificate", "vc1"), ("credentials", "vc2")} <= failed and as_json["ok"] is False


def test_doctor_names_loose_permissions_and_an_unusable_rules_file(
    sim_vc1: Simulator, tmp_path: Path,
) -> None:
    env = setup(tmp_path, {"vc1": sim_vc1})
    home = Path(env["GATEWAY_HOME"])
    rules = home / "rules.yaml"
    rules.write_text("defaults: {read: allow}\n")  # sections missing: serve would refuse it
    rules.chmod(0o666)
    key = home / "audit-signing.key"
    key.write_text("not a key")
    key.chmod(0o644)
    done = doctor(env, "--offline")
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert f"FIX  file         {rules}: writable by group or others (mode 666)" in out, out
    assert f"fix: chmod go-w {rules}" in out and f"`gateway check --rules {rules}`" in out, out
    assert f"FIX  signing_key  {key}" in out and f"chmod 600 {key}" in out, out
    assert "reachable" not in out  # --offline contacts no target
