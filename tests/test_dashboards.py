"""The Grafana dashboard (deploy/grafana/gateway.json) and the Prometheus alert rules (deploy/prometheus/).

- Every metric either names, and every label it selects or groups by, is on the ``/metrics`` of a real
  ``gateway serve`` (over a simulator, with syslog forwarding, after calls, a refusal and the first
  signed checkpoint, so the families made on first use exist).
- The rules pass ``promtool check rules`` and their unit tests (``promtool test rules``); promtool is in
  Debian's ``prometheus`` package (deploy/bootstrap.sh): missing, the test skips, or fails under CI=true.
- Each alert links its runbook heading in docs/operations.md, and the dashboard imports as is: one
  Prometheus data source input and variable, every panel on it, ids unique, the grid 24 wide.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from prometheus_client.parser import text_string_to_metric_families
from support.httpserver import FAST_HASH, https_argv, run_serve, serve_home
from support.processes import free_port, need, stop
from support.simulator import Simulator, wait_until

from gateway.auth.tokens import create_token
from gateway.server.edge.tls import create_certificate
from gateway.store.sqlite import SqliteStore

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "deploy" / "grafana" / "gateway.json"
RULES = REPO / "deploy" / "prometheus" / "gateway-alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "gateway-alerts.test.yml"
EXAMPLE = REPO / "deploy" / "prometheus" / "prometheus.example.yml"
OPERATIONS = REPO / "docs" / "operations.md"
#: labels Prometheus adds to every series it scrapes
SCRAPE_LABELS = frozenset({"instance", "job"})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                      "group_left", "group_right", "inf", "nan"})
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
SELECTOR = re.compile(r"\b([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?")


@dataclass(frozen=True)
class Selector:
    metric: str
    labels: frozenset[str]


@dataclass(frozen=True)
class Query:
    """One PromQL expression: the series it selects and the labels it groups by."""

    where: str
    selectors: tuple[Selector, ...]
    grouped_by: frozenset[str]


def parse_promql(where: str, expr: str) -> Query:
    """The selectors and grouping labels of ``expr`` (strings, ranges and Grafana's ``$`` variables
    blanked first; an identifier before ``(`` is a function)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)
    grouped = {label.strip() for group in GROUPING.findall(text) for label in group.split(",")
               if label.strip()}
    text = GROUPING.sub(" ", text)
    selectors = []
    for match in SELECTOR.finditer(text):
        name, braces = match.group(1), match.group(2)
        if name.lower() in KEYWORDS or (text[match.end():].lstrip().startswith("(") and not braces):
            continue
        if match.start() and text[match.start() - 1] in "$.":
            continue
        selectors.append(Selector(name, frozenset(MATCHER.findall(braces or ""))))
    return Query(where, tuple(selectors), frozenset(grouped))


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_queries() -> list[Query]:
    queries = [parse_promql(f"panel {p['title']!r} {t['refId']}", t["expr"]) for p in panels()
               for t in p["targets"]]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        found = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["definition"])
        assert found, variable["definition"]
        query = parse_promql(f"variable {variable['name']}", found.group(1))
        queries.append(Query(query.where, query.selectors, frozenset({found.group(2)})))
    return queries


def alert_rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(RULES.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def rule_queries() -> list[Query]:
    return [parse_promql(f"alert {rule['alert']}", rule["expr"]) for rule in alert_rules()]


# ----------------------------------------------------------------------------------- the live /metrics


@dataclass(frozen=True)
class Exported:
    """What a live /metrics shows: each sample name with the label names it carries."""

    samples: Mapping[str, frozenset[str]]
    text: str


def exported_by(text: str) -> Exported:
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return Exported({name: frozenset(names) for name, names in labels.items()}, text)


async def exercise(base: str, tls: ssl.SSLContext, tokens: Mapping[str, str]) -> None:
    """A read by one agent, a refused change by another, a bad token and a foreign Host."""
    for name, calls in (("agent-a", [("list_vms", {"target": "vc1"})]),
                        ("agent-b", [("list_vms", {"target": "vc1"}),
                                     ("power_off_vm", {"target": "vc1", "vm": "DC0_H0_VM0"})])):
        http = httpx2.AsyncClient(verify=tls, headers={"Authorization": f"Bearer {tokens[name]}"}, timeout=60)
        async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http),
                                mode="legacy") as client:
            for tool, args in calls:
                await client.call_tool(tool, args)
    async with httpx2.AsyncClient(base_url=base, verify=tls, timeout=30) as plain:
        stranger = await plain.get("/metrics", headers={"Authorization": "Bearer gwt_nonsense"})
        assert stranger.status_code == 401
        assert (await plain.get("/metrics", headers={"Host": "rebound.example"})).status_code == 421


@dataclass(frozen=True)
class Running:
    """A real ``gateway serve`` after ``exercise``: its address, CA, tokens and scratch folder."""

    base: str
    tls: ssl.SSLContext
    cert: Path
    tokens: Mapping[str, str]
    tmp: Path


@pytest.fixture(scope="module")
def running(sim_vc1: Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("dashboards")
    home, env = serve_home(tmp, {"vc1": sim_vc1})
    # a receiver that is never there: the forwarder's families exist, it keeps trying
    (home / "syslog.yaml").write_text(yaml.safe_dump(
        {"syslog": {"host": "127.0.0.1", "port": free_port(), "transport": "tcp"}}))
    (home / "syslog.yaml").chmod(0o600)
    env["GATEWAY_AUDIT_CHECKPOINT_SECONDS"] = "0.5"  # the first checkpoint makes the signing key
    with SqliteStore(home / "state.db") as store:
        tokens = {name: create_token(store, name, role, expires_in=None, now=time.time(), hasher=FAST_HASH)[0]
                  for name, role in (("agent-a", "admin"), ("agent-b", "reader"), ("prometheus", "reader"))}
    # valid for one day: the certificate alert fires at once (below)
    cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"], days=1)
    command = run_serve(tmp, env, *https_argv(cert))
    try:
        base = command.base()
        tls = ssl.create_default_context(cafile=str(cert.cert))
        anyio.run(exercise, base, tls, tokens)
        yield Running(base, tls, cert.cert, tokens, tmp)
    finally:
        code = command.stop()
    assert code == 0, command.output()


@pytest.fixture(scope="module")
def exported(running: Running) -> Exported:
    """The /metrics of the running gateway once the families made on first use are there."""

    scrapes: list[Exported] = []

    def scrape() -> Exported | None:
        response = httpx2.get(f"{running.base}/metrics", verify=running.tls, timeout=30,
                              headers={"Authorization": f"Bearer {running.tokens['agent-a']}"})
        assert response.status_code == 200, response.text
        scrapes.append(exported_by(response.text))
        lazy = ("gateway_audit_signing_key_written_timestamp_seconds", "gateway_mirror_synced",
                "gateway_caller_refusals_total")
        return scrapes[-1] if all(name in scrapes[-1].samples for name in lazy) else None

    try:
        return wait_until(scrape, timeout=30, interval=0.5, what="the families made on first use")
    except TimeoutError:  # a family that never comes: the tests name what is missing
        return scrapes[-1]


def local_config(tmp: Path, *, token: str, ca: Path, target: str) -> Path:
    """deploy/prometheus/prometheus.example.yml with its files and target made local, scraping and
    evaluating every second."""
    config = yaml.safe_load(EXAMPLE.read_text())
    (tmp / "token").write_text(token)
    (tmp / "token").chmod(0o600)
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(RULES)]
    [job] = config["scrape_configs"]
    job["authorization"]["credentials_file"] = str(tmp / "token")
    job["tls_config"]["ca_file"] = str(ca)
    job["static_configs"] = [{"targets": [target]}]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def prometheus(running: Running, exported: Exported) -> Iterator[str]:
    """Debian's Prometheus scraping the running gateway with the example configuration and the rules;
    its address once it has scraped twice (so rates have two points)."""
    binary = need("prometheus", "prometheus")
    tmp = running.tmp / "prometheus"
    tmp.mkdir()
    config = local_config(tmp, token=running.tokens["prometheus"], ca=running.cert,
                          target=running.base.removeprefix("https://"))
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                                    f"--web.listen-address=127.0.0.1:{port}"],
                                   stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        def scraped_twice() -> bool:
            assert process.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                answer = httpx2.get(f"{url}/api/v1/query", params={"query": "count_over_time(up[1m])"},
                                    timeout=10)
            except httpx2.TransportError:
                return False
            if answer.status_code != 200:  # 503 while it starts
                return False
            result = answer.json()["data"]["result"]
            return bool(result) and float(result[0]["value"][1]) >= 2
        wait_until(scraped_twice, timeout=60, interval=0.5, what="Prometheus to scrape the gateway twice")
        yield url
    finally:
        stop(process)


def instant(url: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx2.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30).json()
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def unknown_names(queries: list[Query], exported: Exported) -> list[str]:
    """Each metric or label a query names that the live /metrics does not show."""
    problems = []
    for query in queries:
        seen_labels: set[str] = set(SCRAPE_LABELS)
        for selector in query.selectors:
            labels = exported.samples.get(selector.metric)
            if labels is None:
                problems.append(f"{query.where}: {selector.metric} is not exported")
                continue
            seen_labels |= labels
            extra = selector.labels - labels - SCRAPE_LABELS
            if extra:
                problems.append(f"{query.where}: {selector.metric} has no label {sorted(extra)}")
        missing = query.grouped_by - seen_labels
        if missing and query.selectors:
            problems.append(f"{query.where}: groups by {sorted(missing)}, which its series do not carry")
    return problems


def test_every_metric_and_label_the_dashboard_names_is_exported(exported: Exported) -> None:
    queries = dashboard_queries()
    assert len(queries) > 40 and all(q.selectors for q in queries)
    assert unknown_names(queries, exported) == []


def test_every_metric_and_label_the_alert_rules_name_is_exported(exported: Exported) -> None:
    queries = rule_queries()
    assert {s.metric for q in queries for s in q.selectors} >= {
        "gateway_target_circuit_open", "gateway_audit_writable", "gateway_mirror_divergence_total",
        "gateway_target_queue_depth", "gateway_tool_calls_total", "gateway_caller_refusals_total",
        "gateway_tls_certificate_expiry_timestamp_seconds",
        "gateway_audit_signing_key_written_timestamp_seconds"}
    assert unknown_names(queries, exported) == []


def test_the_caller_families_carry_token_names_and_no_raw_caller_input(exported: Exported) -> None:
    callers = {m.group(1) for m in re.finditer(r'gateway_caller_audit_rows_total\{caller="([^"]*)"',
                                               exported.text)}
    assert {"agent-a", "agent-b"} <= callers <= {"agent-a", "agent-b", "gateway", "idp", "other"}, callers
    assert re.search(r'gateway_caller_refusals_total\{caller="agent-b",code="\w+",role="reader"\} 1\.0',
                     exported.text), exported.text


def test_the_parser_finds_selectors_labels_and_grouping() -> None:
    query = parse_promql("q", 'histogram_quantile(0.95, sum by (tool, le) (rate(gateway_x_bucket{a="1", '
                              'b=~"$v"}[$__rate_interval]))) > 2 and on (instance) up')
    assert query.selectors == (Selector("gateway_x_bucket", frozenset({"a", "b"})),
                               Selector("up", frozenset()))
    assert query.grouped_by == {"tool", "le", "instance"}
    missing = unknown_names([query], Exported({"gateway_x_bucket": frozenset({"a", "le"})}, ""))
    assert missing == ["q: gateway_x_bucket has no label ['b']", "q: up is not exported",
                       "q: groups by ['tool'], which its series do not carry"]


def grafana_free(expr: str) -> str:
    """A dashboard expression as Grafana sends it with every variable at All."""
    for variable, value in (("$__rate_interval", "1m"), ("$__range", "5m"), ("$instance", ".*"),
                            ("$target", ".*"), ("$caller", ".*")):
        expr = expr.replace(variable, value)
    return expr


def test_prometheus_scrapes_the_gateway_with_the_example_configuration(prometheus: str) -> None:
    targets = httpx2.get(f"{prometheus}/api/v1/targets", timeout=30).json()["data"]["activeTargets"]
    assert [(t["health"], t["lastError"]) for t in targets] == [("up", "")], targets


def test_every_dashboard_query_runs_in_prometheus_and_the_core_panels_have_data(prometheus: str) -> None:
    empty = []
    for panel in panels():
        for target in panel["targets"]:
            if not instant(prometheus, grafana_free(target["expr"])):
                empty.append(f"{panel['title']} {target['refId']}")
    # what the few calls of ``exercise`` and the configuration make non-empty (the rest needs traffic or
    # faults: refusals by a queue, divergences, lock timeouts...)
    for title in ("Tool calls by tool", "Calls by caller", "Refusals by caller and code",
                  "Queue depth per target", "Call time per target p50 / p95", "Circuit breakers",
                  "Audit log writable", "Signing key age", "TLS certificate expires in",
                  "Audit append time p50 / p99", "Mirror lag", "Syslog backlog", "Syslog connected"):
        assert f"{title} A" not in empty, (title, empty)


def test_the_rules_load_in_prometheus_and_the_certificate_alert_fires(prometheus: str) -> None:
    groups = httpx2.get(f"{prometheus}/api/v1/rules", timeout=30).json()["data"]["groups"]
    loaded = [rule for group in groups for rule in group["rules"]]
    assert len(loaded) == len(alert_rules()) and all(r["health"] == "ok" for r in loaded), loaded

    expiring = {("GatewayTLSCertificateExpiring", "warning"), ("GatewayTLSCertificateExpiring", "critical")}

    def firing() -> set[tuple[str, str]] | None:
        alerts = httpx2.get(f"{prometheus}/api/v1/alerts", timeout=30).json()["data"]["alerts"]
        now = {(a["labels"]["alertname"], a["labels"]["severity"]) for a in alerts if a["state"] == "firing"}
        return now if expiring <= now else None

    # the server's certificate is valid for one day: both severities fire (no `for:`)
    found = wait_until(firing, timeout=30, interval=0.5, what="the certificate alert to fire")
    assert not {name for name, _ in found} & {"GatewayAuditUnwritable", "GatewayTargetBreakerOpen"}, found


# ------------------------------------------------------------------------------------------- promtool


def promtool() -> str:
    return need("promtool", "prometheus")


def test_promtool_checks_the_alert_rules() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_promtool_checks_the_example_configuration(tmp_path: Path) -> None:
    ca = create_certificate(tmp_path / "tls", ["localhost"]).cert
    config = local_config(tmp_path, token="gwt_example", ca=ca, target="gateway.example.com:8443")
    done = subprocess.run([promtool(), "check", "config", str(config)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout


def test_the_alert_rules_unit_tests_pass() -> None:
    done = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                          timeout=60, check=False, cwd=RULE_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_a_broken_rule_fails_promtool(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(RULES.read_text().replace("== 1\n", "== \n", 1))
    done = subprocess.run([promtool(), "check", "rules", str(broken)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0 and "GatewayTargetBreakerOpen" in done.stdout + done.stderr


# ------------------------------------------------------------------------------------------ runbook


def headings(page: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("### ")}


def test_every_alert_links_its_runbook_heading() -> None:
    written = headings(OPERATIONS)
    for rule in alert_rules():
        name, annotations = rule["alert"], rule["annotations"]
        assert annotations["runbook_url"] == f"docs/operations.md#{name.lower()}", name
        assert name in written, f"docs/operations.md has no '### {name}'"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert annotations["summary"] and annotations["description"], name


# ----------------------------------------------------------------------------------------- dashboard


def test_the_dashboard_imports_with_one_prometheus_input_and_variable() -> None:
    board = dashboard()
    assert board["__inputs"] == [{**board["__inputs"][0], "name": "DS_PROMETHEUS", "type": "datasource",
                                  "pluginId": "prometheus"}]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    source = variables["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    assert source["current"]["value"] == "${DS_PROMETHEUS}"
    assert board["schemaVersion"] >= 36 and board["uid"] and board["id"] is None
    on_variable = {"type": "prometheus", "uid": "${datasource}"}
    for panel in panels():
        assert panel["datasource"] == on_variable and panel["targets"], panel["title"]
        assert all(t["datasource"] == on_variable and t["expr"] for t in panel["targets"]), panel["title"]
    for name in ("instance", "target", "caller"):
        assert variables[name]["datasource"] == on_variable and variables[name]["includeAll"]


def test_the_dashboard_panels_have_unique_ids_and_fit_the_grid() -> None:
    every = dashboard()["panels"]
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in every:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        covered = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                   for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered


def test_the_dashboard_covers_what_issue_37_asks_for() -> None:
    named = {s.metric for q in dashboard_queries() for s in q.selectors}
    for wanted in ("gateway_tool_calls_total", "gateway_caller_audit_rows_total",
                   "gateway_caller_refusals_total", "gateway_target_queue_depth",
                   "gateway_target_queue_wait_seconds_bucket", "gateway_target_call_duration_seconds_bucket",
                   "gateway_target_circuit_open", "gateway_audit_append_duration_seconds_bucket",
                   "gateway_audit_rows_waiting", "gateway_mirror_lag_seconds",
                   "gateway_mirror_divergence_total", "gateway_syslog_backlog"):
        assert wanted in named, wanted


def test_the_shipped_files_are_the_ones_in_the_docs() -> None:
    text = OPERATIONS.read_text()
    for path in (DASHBOARD, RULES, RULE_TESTS):
        assert f"`{path.relative_to(REPO)}`" in text, path
    tested = {line.split(":", 1)[1].strip() for line in RULE_TESTS.read_text().splitlines()
              if line.strip().startswith("alertname:")}
    assert len(tested) >= 2 and tested <= {rule["alert"] for rule in alert_rules()}, tested
