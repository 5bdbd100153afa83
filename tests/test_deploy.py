"""The deployment recipes in deploy/, exercised for real where this machine can run them.

- systemd: ``systemd-analyze verify`` and an offline exposure score on the unit (ExecStart pointed at a
  binary that exists), and its command line accepted by ``gateway``'s own parser.
- nginx: Debian's nginx with deploy/nginx/gateway.conf terminating TLS in front of ``gateway serve
  --transport http``, and MCP calls through it: progress streams while a task runs, the proxy's
  X-Request-ID lands in the audit row, Host checks still refuse, and X-Forwarded-For is trusted.
- container and Kubernetes: parsed, cross-checked against each other and against the gateway's own
  configuration parsers (no container engine or cluster here; see deploy/README.md).

A tool this needs (systemd-analyze, nginx) that is missing skips its test with the package to install,
except under CI=true, where that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import subprocess
import sys
import time
import tomllib
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
from support.httpserver import FAST_HASH, GATEWAY_MAIN
from support.processes import NGINX_MAIN, free_port, local_nginx_recipe, need, stop, wait_for_port
from support.simulator import MakeSimulator, Simulator, wait_until, write_targets

from gateway.auth.roles import load_roles
from gateway.auth.tokens import create_token
from gateway.cli import build_parser
from gateway.config import parse_targets
from gateway.guard.policy.model import Policy
from gateway.guard.policy.store import PolicyStore
from gateway.server.edge.tls import create_certificate
from gateway.store.sqlite import SqliteStore

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"


def accepts_serve(argv: list[str]) -> None:
    """``gateway`` parses ``argv`` (a recipe's command line after the program name) as a serve command."""
    args = build_parser().parse_args(argv)
    assert args.command == "serve" and args.transport in ("https", "http")


# ------------------------------------------------------------------------------------------ systemd

UNIT = DEPLOY / "systemd" / "vsphere-mcp-gateway.service"


def unit_settings(text: str) -> dict[str, list[str]]:
    """``Key=value`` lines of a unit (continuation lines joined), each key with all its values."""
    settings: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", ";", "[")):
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_unit_is_hardened_and_runs_a_valid_command() -> None:
    settings = unit_settings(UNIT.read_text())
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes",
                       "ProtectHome": "yes", "StateDirectory": "vsphere-mcp-gateway"}.items():
        assert settings.get(key) == [value], key
    assert "GATEWAY_HOME=/var/lib/vsphere-mcp-gateway" in settings["Environment"]
    # systemctl reload sends SIGHUP, which the gateway handles (tests/server/edge/test_sighup.py); any other
    # exit brings it back (on-failure would leave it down after an exit by SIGHUP, SIGTERM or status 0)
    assert settings["ExecReload"] == ["/bin/kill -HUP $MAINPID"] and settings["Restart"] == ["always"]
    program, *argv = shlex.split(settings["ExecStart"][0])
    assert program.endswith("/bin/gateway")
    accepts_serve(argv)


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = need("systemd-analyze", "systemd")
    # verify checks that ExecStart's binary exists: point a copy at one that does
    text = re.sub(r"(?m)^ExecStart=\S+", "ExecStart=/bin/true", UNIT.read_text())
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr  # unknown keys only warn
    # exposure is scored 0-10 (0 best); --threshold takes tenths, so 20 means "at most 2.0"
    security = subprocess.run([analyze, "security", "--offline=yes", "--threshold=20", str(unit)],
                              capture_output=True, text=True, timeout=60, check=False)
    assert security.returncode == 0, security.stdout[-3000:] + security.stderr


# ------------------------------------------------------------------------------------------ nginx


def nginx_site(upstream_port: int, listen_port: int, cert: Path, key: Path) -> str:
    """deploy/nginx/gateway.conf with its addresses, name and certificate paths made local."""
    upstream = {"server 127.0.0.1:8080;": f"server 127.0.0.1:{upstream_port};"}
    return local_nginx_recipe("gateway.conf", upstream, listen_port, cert, key)


def serve_command_in(recipe: Path) -> list[str]:
    """The ``gateway serve ...`` command the recipe's comment shows after "runs with:"."""
    text = " ".join(line.lstrip("# ").rstrip("\\ ") for line in recipe.read_text().splitlines()
                    if line.startswith("#"))
    match = re.search(r"runs with:\s+gateway (serve .*?--forwarded-allow-ips \S+)", text)
    assert match, f"{recipe} no longer shows the gateway serve command"
    return shlex.split(match.group(1))


@dataclass
class Proxied:
    sim: Simulator
    token: str
    port: int
    cert: Path
    audit: Path
    serve_log: Path
    access_log: Path

    def request_ids(self) -> set[str]:
        """The $request_id of every request nginx logged."""
        return {line.split()[0] for line in self.access_log.read_text().splitlines() if line.strip()}


@pytest.fixture
def proxied(make_simulator: MakeSimulator, tmp_path: Path) -> Iterator[Proxied]:
    nginx = need("nginx", "nginx-light")
    sim = make_simulator()
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with SqliteStore(home / "state.db") as store:
        token, _ = create_token(store, "agent", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim})
    audit = tmp_path / "audit.jsonl"
    env.update({"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "GATEWAY_HOME": str(home),
                "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"), "GATEWAY_AUDIT_LOG": str(audit)})
    upstream, listen = free_port(), free_port()
    argv = serve_command_in(DEPLOY / "nginx" / "gateway.conf")
    argv[argv.index("--port") + 1] = str(upstream)
    argv[argv.index("--public-name") + 1] = "localhost"
    serve_log = tmp_path / "serve.log"
    with serve_log.open("wb") as sink:
        gateway = subprocess.Popen([sys.executable, "-c", GATEWAY_MAIN, *argv], env=env, cwd=REPO,
                                   stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for_port(upstream, gateway, serve_log)
        cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
        (tmp_path / "gateway.conf").write_text(nginx_site(upstream, listen, cert.cert, cert.key))
        (tmp_path / "nginx.conf").write_text(NGINX_MAIN.format(tmp=tmp_path))
        proxy_log = tmp_path / "nginx.out"
        with proxy_log.open("wb") as sink:
            proxy = subprocess.Popen([nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"),
                                      "-e", str(tmp_path / "error.log")],
                                     stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_for_port(listen, proxy, tmp_path / "error.log")
            yield Proxied(sim, token, listen, cert.cert, audit, serve_log, tmp_path / "access.log")
        finally:
            stop(proxy)
    finally:
        stop(gateway)


def https_client(proxied: Proxied, token: str | None, seen: list[str] | None = None,
                 local_address: str | None = None) -> httpx2.AsyncClient:
    """A client of the proxy; ``seen`` collects the correlation id of every response."""
    async def record(response: httpx2.Response) -> None:
        if seen is not None and "x-correlation-id" in response.headers:
            seen.append(response.headers["x-correlation-id"])

    verify = ssl.create_default_context(cafile=str(proxied.cert))
    transport = httpx2.AsyncHTTPTransport(verify=verify, local_address=local_address)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx2.AsyncClient(base_url=f"https://localhost:{proxied.port}", transport=transport,
                              headers=headers, timeout=60, event_hooks={"response": [record]})


async def power_off_through_the_proxy(proxied: Proxied, seen: list[str]) -> tuple[Any, list[str]]:
    """power_off_vm on a VM whose task runs slowly; returns the result and the VM's power state seen at
    each progress notification (still on means the notification came while the task was running)."""
    states: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        inventory: Mapping[str, Any] = await anyio.to_thread.run_sync(proxied.sim.inventory)
        states.extend(vm["power_state"] for vm in inventory["vms"] if vm["name"] == "DC0_C0_RP0_VM0")

    proxied.sim.control("/slow-task", {"method": "PowerOffVM_Task", "seconds": 3, "count": 1})
    http = https_client(proxied, proxied.token, seen)
    transport = streamable_http_client(f"https://localhost:{proxied.port}/mcp", http_client=http)
    async with http, Client(transport, mode="legacy") as client:
        result = await client.call_tool("power_off_vm", {"target": "vc1", "vm": "DC0_C0_RP0_VM0",
                                                         "guest_timeout_seconds": 0},
                                        progress_callback=on_progress)
    return result, states


def test_mcp_through_nginx_streams_progress_and_keeps_the_request_id(proxied: Proxied) -> None:
    seen: list[str] = []
    result, states = anyio.run(power_off_through_the_proxy, proxied, seen)
    assert not result.is_error, result.content
    assert states and states[0] == "poweredOn", "progress must stream while the task runs, not after it"
    rows = [json.loads(line) for line in proxied.audit.read_text().splitlines()]
    call = [row for row in rows if row.get("tool") == "power_off_vm"]
    assert call and all(row["correlation_id"] in seen for row in call), "echoed to the client"
    assert {row["correlation_id"] for row in call} <= proxied.request_ids(), "nginx's X-Request-ID"


async def edge_through_the_proxy(proxied: Proxied) -> dict[str, int]:
    statuses: dict[str, int] = {}
    async with https_client(proxied, proxied.token) as good:
        wrong_host = await good.get("/metrics", headers={"Host": "rebound.attacker.example"})
        statuses["wrong_host"] = wrong_host.status_code
    # failures from 127.0.0.2 behind the proxy throttle 127.0.0.2, not the proxy's own address
    async with https_client(proxied, "gwt_nonsense", local_address="127.0.0.2") as bad:
        for _ in range(20):
            statuses["bad"] = (await bad.get("/metrics")).status_code
            if statuses["bad"] == 429:
                break
    async with https_client(proxied, proxied.token) as good:
        statuses["good_after"] = (await good.get("/metrics")).status_code
    return statuses


def test_host_checks_and_forwarded_addresses_work_behind_nginx(proxied: Proxied) -> None:
    statuses = anyio.run(edge_through_the_proxy, proxied)
    assert statuses == {"wrong_host": 421, "bad": 429, "good_after": 200}
    # the forwarded client address, in the access line (a thread writes the log lines)
    wait_until(lambda: "127.0.0.2 GET /metrics 401" in proxied.serve_log.read_text(), timeout=30,
               what="the access line naming the forwarded client address")


# ------------------------------------------------------------------------------------------ container


def containerfile() -> dict[str, list[str]]:
    """Instructions of the Containerfile (continuations joined), each with all its arguments."""
    text = (DEPLOY / "container" / "Containerfile").read_text().replace("\\\n", " ")
    instructions: dict[str, list[str]] = {}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word and not word.startswith("#"):
            instructions.setdefault(word, []).append(rest.strip())
    return instructions


def test_container_recipe_runs_as_non_root_with_state_on_a_volume() -> None:
    image = containerfile()
    entrypoint, command = json.loads(image["ENTRYPOINT"][0]), json.loads(image["CMD"][0])
    assert entrypoint == ["gateway"]
    accepts_serve(command)
    assert image["USER"] == ["10001"] and image["VOLUME"] == ['["/var/lib/gateway"]']
    assert "GATEWAY_HOME=/var/lib/gateway" in image["ENV"][0] and "/healthz" in image["HEALTHCHECK"][0]


@pytest.mark.slow
def test_container_image_builds_with_buildah_and_runs_the_gateway_as_10001() -> None:
    """deploy/container/build.sh (buildah from Debian; the base made from Debian packages when no
    registry is reachable) builds the image; in it, ``gateway --version`` runs as uid 10001 and the
    first-token step is configured."""
    buildah = need("buildah", "buildah")
    need("mmdebstrap", "mmdebstrap")
    image = f"localhost/vsphere-mcp-gateway:test-{os.getpid()}"
    storage = [buildah, "--storage-driver", "vfs"]
    build = subprocess.run(["bash", str(DEPLOY / "container" / "build.sh"), image], cwd=REPO, timeout=900,
                           capture_output=True, text=True, check=False,
                           env={**os.environ, "PYTHON": sys.executable})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    container = ""

    def ran(*argv: str) -> str:  # vfs copies the whole image for a container: slow on a loaded machine
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
        assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        return done.stdout

    try:
        container = ran(*storage, "from", image).strip()

        def inside(*argv: str) -> str:
            return ran(*storage, "run", "--isolation", "chroot", container, "--", *argv)

        declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
        assert inside("gateway", "--version").strip() == f"gateway {declared}"
        assert inside("id", "-u").strip() == "10001" and inside("id", "-g").strip() == "10001"
        assert "GATEWAY_BOOTSTRAP_TOKEN_FILE=/var/lib/gateway/bootstrap-token" in inside("env")
    finally:
        if container:
            subprocess.run([*storage, "rm", container], capture_output=True, check=False, timeout=120)
        subprocess.run([*storage, "rmi", image], capture_output=True, check=False, timeout=120)


# ------------------------------------------------------------------------------------------ Kubernetes


def manifests() -> dict[str, dict[str, Any]]:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "gateway.yaml").read_text()))
    return {doc["kind"]: doc for doc in documents if doc}


def test_kubernetes_deployment_probes_secret_and_volume() -> None:
    docs = manifests()
    assert {"Secret", "ConfigMap", "PersistentVolumeClaim", "Deployment", "Service"} <= set(docs)
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"] for p in container["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        check = container[probe]["httpGet"]
        assert (check["path"], check["scheme"]) == (path, "HTTPS") and check["port"] in ports
    assert container["envFrom"] == [{"secretRef": {"name": docs["Secret"]["metadata"]["name"]}}]
    bootstrap = {"name": "GATEWAY_BOOTSTRAP_TOKEN_FILE", "value": "/var/run/gateway-bootstrap/token"}
    assert bootstrap in container["env"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    state = volumes[mounts["/var/lib/gateway"]]  # GATEWAY_HOME and the audit log in the image
    assert state["persistentVolumeClaim"]["claimName"] == docs["PersistentVolumeClaim"]["metadata"]["name"]
    config = volumes[mounts["/etc/gateway/config"]]
    assert config["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    assert container["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    assert docs["Deployment"]["spec"]["replicas"] == 1, "the SQLite store is single-writer"
    accepts_serve(container["args"])


KUBERNETES_VERSION = "1.33.0"  # a release clusters run today; the validator ships its schemas (offline)
RECIPES = ("gateway.yaml", "gateway-replicas.yaml")


def documents(recipe: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / recipe).read_text()) if doc]


@pytest.mark.parametrize("recipe", RECIPES)
def test_kubernetes_manifests_pass_strict_schema_validation(recipe: str) -> None:
    """kubernetes-validate (PyPI) with the API's own OpenAPI schemas, rejecting unknown fields."""
    import kubernetes_validate

    for doc in documents(recipe):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    planted = documents(recipe)[-1] | {"spce": {}}  # a typo'd key is refused: the check has teeth
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(planted, KUBERNETES_VERSION, strict=True)


def referenced_paths(docs: dict[str, dict[str, Any]], container: dict[str, Any]) -> set[str]:
    """Every file the gateway in ``container`` reads: environment paths, serve's --cert/--key, the
    Secret's PGSSLROOTCERT and each target's ca_file."""
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    secret = docs["Secret"].get("stringData", {})
    paths = {v for k, v in {**secret, **env}.items()
             if k.endswith(("_FILE", "ROOTCERT")) and v.startswith("/")}
    args = container["args"]
    paths |= {args[i + 1] for i, a in enumerate(args) if a in ("--cert", "--key")}
    targets = yaml.safe_load(docs["ConfigMap"]["data"]["targets.yaml"])["targets"]
    return paths | {t["ca_file"] for t in targets if t.get("ca_file")}


@pytest.mark.parametrize("recipe", RECIPES)
def test_kubernetes_mounts_everything_it_references(recipe: str) -> None:
    docs = {doc["kind"]: doc for doc in documents(recipe)}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    for path in referenced_paths(docs, container) | {"/etc/gateway/config/targets.yaml"}:
        holder = [m for m in mounts if path.startswith(m + "/")]
        assert holder, f"{recipe}: {path} is read but nothing is mounted there"
        volume = mounts[max(holder, key=len)]
        if "configMap" in volume:  # the file is one of the ConfigMap's keys
            assert path.rsplit("/", 1)[1] in docs["ConfigMap"]["data"], path
    for outer, volume in mounts.items():  # no mount inside a ConfigMap's read-only mount
        if "configMap" in volume:
            assert not [m for m in mounts if m.startswith(outer + "/")], f"{recipe}: a mount inside {outer}"
    security = pod["securityContext"]
    assert security["runAsUser"] == 10001 and security.get("fsGroup") in (None, 10001)


def test_kubernetes_replicas_signing_key_reaches_the_gateway_owner_only() -> None:
    """The 0440 root-owned Secret file (fsGroup 10001 lets uid 10001 read it) is copied 0400 by an init
    container running as the gateway's user into the memory volume GATEWAY_AUDIT_SIGNING_KEY_FILE names."""
    docs = {doc["kind"]: doc for doc in documents("gateway-replicas.yaml")}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"] == 10001
    init = {c["name"]: c for c in pod["initContainers"]}["audit-key"]
    (container,) = pod["containers"]
    key = {e["name"]: e["value"] for e in container["env"]}["GATEWAY_AUDIT_SIGNING_KEY_FILE"]
    assert init["command"][:3] == ["install", "-m", "0400"] and init["command"][-1] == key
    volumes = {v["name"]: v for v in pod["volumes"]}
    init_mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    source = init["command"][3]
    secret_volume = volumes[init_mounts[source.rsplit("/", 1)[0]]]
    assert secret_volume["secret"]["secretName"] == "gateway-audit-signing-key"
    copy = init_mounts[key.rsplit("/", 1)[0]]
    assert volumes[copy]["emptyDir"]["medium"] == "Memory"
    assert {m["mountPath"]: m["name"] for m in container["volumeMounts"]}[key.rsplit("/", 1)[0]] == copy


@pytest.mark.parametrize("manifest", ["gateway.yaml", "gateway-replicas.yaml"])
def test_kubernetes_bootstrap_token_reaches_the_gateway_owner_only(manifest: str, tmp_path: Path) -> None:
    """The gateway reads the first token as a secret (its user's file, owner-only), so the root-owned
    Secret file is copied 0400 by an init container into the memory volume GATEWAY_BOOTSTRAP_TOKEN_FILE
    names; the init command itself runs here on both paths (a Secret mounted, none: no copy, no error)."""
    docs = {doc["kind"]: doc for doc in documents(manifest)}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"] == 10001
    init = {c["name"]: c for c in pod["initContainers"]}["bootstrap-token"]
    (container,) = pod["containers"]
    path = {e["name"]: e["value"] for e in container["env"]}["GATEWAY_BOOTSTRAP_TOKEN_FILE"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    init_mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    copy = init_mounts[path.rsplit("/", 1)[0]]
    assert volumes[copy]["emptyDir"]["medium"] == "Memory"
    assert {m["mountPath"]: m["name"] for m in container["volumeMounts"]}[path.rsplit("/", 1)[0]] == copy
    (source_dir,) = [mount for mount, name in init_mounts.items() if "secret" in volumes[name]]
    assert volumes[init_mounts[source_dir]]["secret"]["secretName"] == "gateway-bootstrap-token"
    script = init["command"][2]
    assert init["command"][:2] == ["sh", "-c"]
    here = script.replace(source_dir, str(tmp_path / "secret")).replace(path.rsplit("/", 1)[0],
                                                                        str(tmp_path / "copy"))
    (tmp_path / "copy").mkdir()
    subprocess.run(["sh", "-c", here], check=True)  # no Secret mounted: nothing copied, no failure
    assert not (tmp_path / "copy" / "token").exists()
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "token").write_text("gwt_x\n")
    (tmp_path / "secret" / "token").chmod(0o440)
    subprocess.run(["sh", "-c", here], check=True)
    assert (tmp_path / "copy" / "token").stat().st_mode & 0o777 == 0o400


def test_kubernetes_configuration_is_what_the_gateway_accepts(tmp_path: Path) -> None:
    docs = manifests()
    config, secret = docs["ConfigMap"]["data"], docs["Secret"]["stringData"]
    targets = parse_targets(yaml.safe_load(config["targets.yaml"]), "configmap targets.yaml", secret)
    assert targets, "every target's credentials come from the Secret"
    load_roles(config["roles.yaml"].encode(), "configmap roles.yaml")
    (tmp_path / "rules.yaml").write_text(config["rules.yaml"])
    assert isinstance(PolicyStore(tmp_path / "rules.yaml").current(), Policy)


def test_deploy_readme_says_what_was_verified_here() -> None:
    readme = (DEPLOY / "README.md").read_text()
    for recipe in ("systemd", "nginx", "Containerfile", "gateway.yaml"):
        assert recipe in readme

