"""The official MCP conformance suite against the real gateway: both revisions' requirement sets.

The npm package @modelcontextprotocol/conformance (pinned in tests/conformance with the Node it needs)
runs each revision's scored server scenarios (2025-11-25 on the stateful handshake, 2026-07-28
stateless) against the gateway's HTTPS server on loopback in front of a simulated vCenter, every
request carrying an admin's bearer token, and the scenarios of the tasks extension the gateway offers
(``not_scored: extension`` in the 2026-07-28 set), judged like the scored ones.
tests/conformance/not_applicable.yaml names the scenarios (and single checks) that do not apply to a
tools-only server, each with its reason; every other judged scenario must pass (one the suite skips
whole is reported, neither passed nor failing), and a single check listed there that did not fail
must leave the list. A whole scenario listed there that passes anyway (on the gateway's answer to a
tool it lacks) is reported as passing vacuously, never counted as passed. The one scenario excused in
part over HTTPS, dns-rebinding-protection, runs whole against the loopback HTTP transport.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import conformance
from support.httpserver import Served, real_gateway, serve
from support.simulator import Simulator
from support.tier import needs


@pytest.fixture(scope="module")
@needs("node")
def suite() -> conformance.Suite:
    """The pinned suite and its Node (the `oidc` marker: the tests that need Node)."""
    return conformance.installed()


@pytest.fixture(scope="module")
def served(sim_vc1: Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("conformance-server")
    running = serve(tmp, real_gateway(sim_vc1, tmp))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def served_http(
    sim_vc1: Simulator, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[conformance.LoopbackHttp]:
    tmp = tmp_path_factory.mktemp("conformance-http")
    running = conformance.serve_http(real_gateway(sim_vc1, tmp))
    yield running
    running.stop()


def test_every_entry_of_the_not_applicable_list_is_a_judged_scenario_with_a_reason(
    suite: conformance.Suite,
) -> None:
    listed = conformance.not_applicable()
    judged = {name for revision in conformance.REVISIONS
              for name in conformance.required(suite, revision).judged}
    names = [*listed.scenarios, *(key.split(":", 1)[0] for key in listed.checks)]
    assert [name for name in names if name not in judged] == [], (
        f"not_applicable.yaml names scenarios no requirement set of {conformance.REVISIONS} scores "
        "or runs as an extension's")
    assert all(":" in key for key in listed.checks), "a check is named scenario:check-id"
    assert [k for k, why in {**listed.scenarios, **listed.checks}.items() if not str(why or "").strip()] == []
    whole = set(listed.scenarios)
    assert [key for key in listed.checks if key.split(":", 1)[0] in whole] == [], (
        "a scenario is listed whole or check by check, not both")


@pytest.mark.parametrize("revision", conformance.REVISIONS)
def test_every_applicable_scenario_of_the_revision_passes(
    revision: str, suite: conformance.Suite, served: Served, tmp_path: Path,
) -> None:
    requirements = conformance.required(suite, revision)
    result = conformance.run(suite, f"{served.base}/mcp", revision, token=served.tokens["alice"],
                             ca=served.cert.cert, out=tmp_path)
    assert result.checks, f"the suite ran no scenario (exit {result.returncode}):\n{result.output[-4000:]}"
    verdict = conformance.judge(requirements, result, conformance.not_applicable())
    report = conformance.summary(requirements, result, verdict)
    print(report)
    assert (verdict.failing, verdict.stale) == ({}, []), (
        f"scenarios failing on {revision}, or entries of not_applicable.yaml to remove:\n{report}\n"
        + "\n".join(verdict.stale))


@pytest.mark.parametrize("revision", conformance.REVISIONS)
def test_dns_rebinding_protection_passes_whole_on_loopback_http(
    revision: str, suite: conformance.Suite, served_http: conformance.LoopbackHttp, tmp_path: Path,
) -> None:
    """Over HTTPS the suite's rebinding probe never reaches HTTP (its Host fails the certificate's names)
    and its "valid" probe claims an http:// origin (not the server's own); on loopback HTTP, where DNS
    rebinding is the threat, both checks run as written and must pass."""
    scenario = "dns-rebinding-protection"
    requirements = conformance.required(suite, revision)
    assert scenario in requirements.scored
    result = conformance.run(suite, f"{served_http.base}/mcp", revision, token=served_http.token, ca=None,
                             out=tmp_path, scenario=scenario)
    verdict = conformance.judge(requirements, result, conformance.NotApplicable({}, {}), [scenario])
    report = conformance.summary(requirements, result, verdict, not_scored=False)
    print(report)
    assert verdict.passed == [scenario], f"{report}\n{result.output[-3000:]}"
    assert {c["id"] for c in result.checks[scenario]} >= {"localhost-host-rebinding-rejected",
                                                         "localhost-host-valid-accepted"}
