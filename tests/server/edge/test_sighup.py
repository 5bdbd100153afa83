"""SIGHUP (``systemctl reload``: the unit's ExecReload) re-reads rules.yaml and roles.yaml in a running
``gateway serve`` instead of ending it (gateway/server/edge/sighup.py)."""

from __future__ import annotations

import os
import signal
import ssl
import time
from pathlib import Path
from typing import Any

import httpx2
import yaml
from support.gateway_env import role, write_roles
from support.httpserver import FAST_HASH, Command, https_argv, run_serve, serve_home
from support.simulator import Simulator, complete_rules, wait_until

from gateway.audit.query import read_rows
from gateway.auth.tokens import create_token
from gateway.server.edge.tls import create_certificate
from gateway.store.sqlite import SqliteStore


def reload_rows(audit: Path, file: str, command: Command | None = None) -> list[dict[str, Any]]:
    """``file``'s config_reload rows; with ``command``, first that the gateway still runs."""
    assert command is None or command.process.poll() is None, f"gateway ended: {command.process.returncode}"
    rows = read_rows(audit, phase="config_reload") if audit.exists() else []
    return [row for row in rows if row.get("file") == file]


def test_sighup_reloads_rules_and_roles_and_the_gateway_keeps_serving(
    sim_vc1: Simulator, tmp_path: Path,
) -> None:
    home, env = serve_home(tmp_path, {"vc1": sim_vc1})
    rules = home / "rules.yaml"
    rules.write_text(yaml.safe_dump(complete_rules({"rules": []})))
    write_roles(home, {"first": role()})
    with SqliteStore(home / "state.db") as store:
        create_token(store, "ops", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    command = run_serve(tmp_path, env, *https_argv(cert))
    audit = home / "audit.jsonl"
    try:
        base = command.base()
        assert [r["at_start"] for r in reload_rows(audit, "roles")] == [True], command.output()
        write_roles(home, {"first": role(), "second": role(write=("power_on_vm",))})
        rules.write_text(yaml.safe_dump(complete_rules({"rules": [], "defaults": {"max_bulk_objects": 7}})))
        os.kill(command.process.pid, signal.SIGHUP)  # what `systemctl reload` sends; no request follows
        roles = wait_until(lambda: [r for r in reload_rows(audit, "roles", command) if not r["at_start"]],
                           timeout=30, what="the roles reload row after SIGHUP")
        assert roles[0]["outcome"] == "loaded" and roles[0]["changed"] == {"roles": {"added": 1}}, roles
        rule_rows = wait_until(lambda: [r for r in reload_rows(audit, "rules", command) if not r["at_start"]],
                               timeout=30, what="the rules reload row after SIGHUP")
        assert rule_rows[0]["outcome"] == "loaded" and "defaults" in rule_rows[0]["changed"], rule_rows
        assert command.process.poll() is None, command.output()
        tls = ssl.create_default_context(cafile=str(cert.cert))
        assert httpx2.get(f"{base}/healthz", verify=tls, timeout=30).status_code == 200
        wait_until(lambda: "SIGHUP: re-reading rules.yaml and roles.yaml" in command.output(), timeout=30,
                   what="the SIGHUP line in the server's log (a thread writes the log lines)")
    finally:
        code = command.stop()
    assert code == 0, command.output()
