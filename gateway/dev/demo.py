"""``python -m gateway.dev.demo`` (``make run``): the whole gateway on one machine in one command.

Simulated vCenters, a configuration, a certificate and tokens in a demo folder, then ``gateway serve
--transport https --web``. Nothing it starts outlives it, not even after a SIGKILL. The folder is locked
(a second demo refuses) and emptied on each run; a non-empty folder it did not make is never deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

from gateway.audit.file_sink import AuditSink
from gateway.auth.local import os_person
from gateway.auth.tokens import create_token
from gateway.dev.simulators import REPO, VCSIM_BIN, SimulatorProcess, start_simulator, write_targets
from gateway.private_files import DIR_MODE, FILE_MODE, make_private_dirs, open_private, write_private
from gateway.server.edge.tls import create_certificate
from gateway.store.sqlite import SqliteStore
from gateway.vocabulary import Kind

DEFAULT_PORT: Final = 8443
MARKER: Final = ".gateway-demo"
LOCK: Final = ".demo.lock"
GATEWAY_MAIN: Final = "from gateway.cli import main; raise SystemExit(main())"
PACKAGE_ROOT: Final = Path(__file__).resolve().parents[2]
STARTUP_SECONDS: Final = 90.0
#: the MCP Inspector release docs/clients.md's commands were verified with
INSPECTOR: Final = "@modelcontextprotocol/inspector@2.12.0"
STOP_SECONDS: Final = 30.0

#: name -> start_simulator options: two vCenters and a standalone ESXi host, a few VMs each
SIMULATORS: Final[dict[str, dict[str, Any]]] = {
    "vc-1": {"model": "vpx", "clusters": 1, "hosts_per_cluster": 2, "standalone_hosts": 1, "vms": 3},
    "vc-2": {"model": "vpx", "clusters": 1, "hosts_per_cluster": 2, "standalone_hosts": 0, "vms": 4},
    "esx-1": {"model": "esx", "vms": 3},
}
TARGET_TAGS: Final = {"vc-1": ["env:lab"], "vc-2": ["env:staging"], "esx-1": ["env:lab"]}
#: extra targets.yaml keys: proposals on the gated vc-2 wait 15 minutes for a human
TARGET_EXTRA: Final[dict[str, dict[str, Any]]] = {"vc-2": {"proposal_ttl_seconds": 900}}

RULES: Final = """\
# Demo policy (the full syntax is in rules.example.yaml). Every section is present, empty ones as []
# or {}: a file cut at a section boundary is refused instead of read as fewer rules.
# Reads and writes are allowed everywhere. Destructive calls are allowed too, but each one is first
# proposed and must be confirmed with confirm_action; on vc-2 a person must also approve it on the
# web page before it can be confirmed.
defaults:
  read: allow
  write: allow
  destructive: allow
protected:
  - name: demo-protected-vm
    vm_patterns: ["DC0_H0_VM0"]
    reason: shows a protected VM; no destructive call may touch it
rules: []
targets:
  vc-2:
    require_web_approval: true
maintenance_windows: []
"""

ROLES: Final = """\
# Demo custom roles (the full syntax is in roles.example.yaml); reader and admin are built in.
roles:
  lab-operator:
    tools: read
    allow_write: [power_on_vm, power_off_vm, reset_vm, create_snapshot]
    allow_destructive: [delete_snapshot]
    targets: ["vc-1", "esx-1"]
    approve: none
  approver:
    tools: read
    allow_write: []
    allow_destructive: []
    targets: "*"
    approve: any          # any proposal but the approver's own (nobody approves their own)
    audit: all
"""

#: token name -> (role, kind), created on every run: MCP clients get agents' tokens, which can never
#: approve (not even through the page: it signs in people only); the page gets a person's token
TOKENS: Final[Mapping[str, tuple[str, Kind]]] = {
    "demo-admin": ("admin", Kind.AGENT),
    "demo-reader": ("reader", Kind.AGENT),
    "demo-person": ("approver", Kind.PERSON),
}
#: what each kind of demo token is for, in the banner
_USES: Final = {Kind.AGENT: "an agent's, for MCP clients: it cannot approve",
                Kind.PERSON: "a person's, to sign in to the web page and approve"}


@dataclass(frozen=True)
class DemoFiles:
    """Where the demo keeps everything, all inside one folder."""

    folder: Path

    @property
    def home(self) -> Path:
        return self.folder / "home"

    @property
    def targets(self) -> Path:
        return self.home / "targets.yaml"

    @property
    def rules(self) -> Path:
        return self.home / "rules.yaml"

    @property
    def roles(self) -> Path:
        return self.home / "roles.yaml"

    @property
    def audit_log(self) -> Path:
        return self.home / "audit.jsonl"

    @property
    def tls(self) -> Path:
        return self.folder / "tls"

    @property
    def env_file(self) -> Path:
        return self.folder / "gateway.env"

    @property
    def stdio_script(self) -> Path:
        return self.folder / "stdio.sh"

    @property
    def log(self) -> Path:
        return self.folder / "gateway.log"

    def environment(self) -> dict[str, str]:
        """The GATEWAY_* settings every gateway command of the demo runs with: every file is at its
        default place inside GATEWAY_HOME, so GATEWAY_HOME alone (plus credentials) is enough."""
        return {"GATEWAY_HOME": str(self.home), "GATEWAY_ENABLE_DESTRUCTIVE": "true"}


class DemoError(Exception):
    """The demo cannot start; the message says why and what to do."""


# ------------------------------------------------------------------------------------------ the folder


def _check_ours(folder: Path) -> None:
    """Refuse a folder that exists, holds something and was not made by the demo."""
    if folder.is_dir() and not (folder / MARKER).is_file() and any(
        entry.name != LOCK for entry in folder.iterdir()
    ):
        raise DemoError(f"{folder} exists, is not empty and was not made by the demo; "
                        "remove it or pass --dir with another folder")


def lock_folder(folder: Path, stack: contextlib.ExitStack) -> int:
    """Hold an exclusive ``flock`` on ``folder/.demo.lock`` until ``stack`` closes (or the process dies);
    returns the lock's descriptor, which the gateway child inherits so that the folder stays locked
    until the last process writing into it is gone.

    DemoError, before anything in the folder is touched, when another demo holds it."""
    folder = folder.resolve()
    _check_ours(folder)
    make_private_dirs(folder)
    fd = open_private(folder / LOCK, os.O_RDWR)
    stack.callback(os.close, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        raise DemoError(f"another demo (pid {holder}) is running with the folder {folder}; stop it first "
                        "(Ctrl-C in its terminal) or pass --dir with another folder") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def prepare_folder(folder: Path) -> DemoFiles:
    """Empty (or create) ``folder`` for a new run, keeping its lock file; refuse a non-empty folder the
    demo did not make. Call it only while holding ``lock_folder``."""
    folder = folder.resolve()
    _check_ours(folder)
    make_private_dirs(folder)
    for entry in folder.iterdir():
        if entry.name == LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    write_private(folder / MARKER, b"made by `python -m gateway.dev.demo`; emptied on every run\n")
    return DemoFiles(folder)


def _write_private(path: Path, text: str, mode: int = FILE_MODE) -> None:
    """Write ``text`` to a file only its owner can read (never briefly readable by others)."""
    write_private(path, text.encode(), mode=mode)


def write_configuration(files: DemoFiles, sims: Mapping[str, SimulatorProcess]) -> dict[str, str]:
    """targets.yaml, rules.yaml, roles.yaml, gateway.env and stdio.sh; returns the gateway's environment
    (settings and the simulators' credentials)."""
    make_private_dirs(files.home)
    extra = {name: {"tags": TARGET_TAGS.get(name, []), **TARGET_EXTRA.get(name, {})} for name in sims}
    credentials = write_targets(files.targets, sims, extra)
    _write_private(files.rules, RULES)
    _write_private(files.roles, ROLES)
    env = {**files.environment(), **credentials}
    lines = [f"{key}={shlex.quote(value)}" for key, value in env.items()]
    _write_private(files.env_file, "# the demo gateway's environment (simulator credentials included)\n"
                   + "\n".join(lines) + "\n")
    _write_private(files.stdio_script, stdio_script(files), mode=DIR_MODE)  # a script its owner runs
    return env


def stdio_script(files: DemoFiles) -> str:
    """A launcher a desktop MCP client can run: the demo's settings, then ``gateway serve`` over stdio."""
    return (
        "#!/bin/sh\n"
        "# Serves the demo gateway over stdio (for desktop MCP clients) while the demo's simulators run.\n"
        f"set -a; . {shlex.quote(str(files.env_file))}; set +a\n"
        f"export PYTHONPATH={shlex.quote(str(PACKAGE_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f"exec {shlex.quote(sys.executable)} -c {shlex.quote(GATEWAY_MAIN)} serve --transport stdio\n"
    )


def create_tokens(files: DemoFiles) -> dict[str, str]:
    """One token per ``TOKENS`` entry (plaintext returned, only hashes stored), each audited."""
    make_private_dirs(files.home)
    tokens: dict[str, str] = {}
    by = os_person()  # whoever runs the demo, as ``gateway token create`` names them
    with SqliteStore(files.home / "state.db") as store, AuditSink(files.audit_log) as audit:
        for name, (role, kind) in TOKENS.items():
            token, record = create_token(store, name, role, expires_in=None, now=time.time(), kind=kind)
            audit.write({"phase": "token_created", "caller": by.name, "kind": by.kind.value, "surface": "cli",
                         "token_name": name, "token_id": record.token_id, "role": role,
                         "token_kind": kind.value, "expires_at": None})
            tokens[name] = token
    return tokens


# ----------------------------------------------------------------------------------------- processes


def start_simulators(stack: contextlib.ExitStack, binary: Path) -> dict[str, SimulatorProcess]:
    """Start every ``SIMULATORS`` entry; each is stopped when ``stack`` closes."""
    sims: dict[str, SimulatorProcess] = {}
    for name, options in SIMULATORS.items():
        sim = start_simulator(binary=binary, **options)
        stack.callback(sim.stop)
        sims[name] = sim
    return sims


def web_available() -> bool:
    """Whether this build has the approval page (``gateway.web.app``)."""
    try:
        return importlib.util.find_spec("gateway.web.app") is not None
    except ModuleNotFoundError:
        return False


def serve_argv(files: DemoFiles, port: int, web: bool) -> list[str]:
    """The ``gateway serve`` arguments the demo runs (no secret among them)."""
    argv = ["serve", "--transport", "https", "--cert", str(files.tls / "cert.pem"),
            "--key", str(files.tls / "key.pem"), "--public-name", "127.0.0.1", "--public-name", "localhost",
            "--host", "127.0.0.1", "--port", str(port), "--enable-destructive", "--grace-seconds", "5"]
    return [*argv, "--web"] if web else argv


PR_SET_PDEATHSIG: Final = 1


def _die_with_parent(parent: int) -> Any:
    """A ``preexec_fn``: the kernel sends the child SIGTERM (its orderly stop) when the demo dies, even by
    SIGKILL; a demo already gone before the request took effect ends the child at once."""
    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            os._exit(70)
        if os.getppid() != parent:
            os._exit(70)

    return arm


def start_gateway(files: DemoFiles, env: Mapping[str, str], argv: list[str],
                  lock_fd: int | None = None) -> subprocess.Popen[bytes]:
    """``gateway serve`` as a child process logging to the demo folder's gateway.log, bound to the demo's
    life, holding the folder's lock (``lock_fd``) too."""
    child_env = {**os.environ, **env}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
    with os.fdopen(open_private(files.log, os.O_WRONLY | os.O_APPEND), "ab") as log:
        return subprocess.Popen([sys.executable, "-c", GATEWAY_MAIN, *argv], env=child_env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent(os.getpid()),
                                pass_fds=() if lock_fd is None else (lock_fd,))


def reserve_port(port: int, host: str = "127.0.0.1") -> socket.socket:
    """Bind ``host:port`` (as uvicorn will) and hold it, so that nothing started meanwhile (the simulators
    take ephemeral ports) can take it; the caller closes it just before the gateway binds. DemoError
    naming the cause in one line when the port cannot be had."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((host, port))
    except OSError as exc:
        probe.close()
        if exc.errno == errno.EADDRINUSE:
            raise DemoError(f"port {port} is in use (Errno {exc.errno}): another program listens on "
                            f"{host}:{port}; stop it or choose another port with --port N "
                            "(make run PORT=N)") from None
        raise DemoError(f"cannot listen on {host}:{port} (Errno {exc.errno}: {exc.strerror}); choose "
                        "another port with --port N (make run PORT=N)") from None
    return probe


def startup_cause(path: Path) -> str:
    """The one log line that says why the gateway stopped while starting (an ERROR line, else the last)."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    errors = [line for line in lines if " ERROR " in line or line.startswith("gateway: ")]
    return (errors or lines or ["(empty log)"])[-1]


def wait_ready(process: subprocess.Popen[bytes], url: str, cafile: Path, timeout: float, log: Path) -> None:
    """Poll ``url`` (/readyz) until it answers 200; DemoError if the process exits or time runs out."""
    context = ssl.create_default_context(cafile=str(cafile))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DemoError(f"the gateway exited with status {process.returncode} while starting: "
                            f"{startup_cause(log)}")
        try:
            with urllib.request.urlopen(url, context=context, timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise DemoError(f"the gateway did not become ready within {timeout:.0f}s")


def stop_process(process: subprocess.Popen[bytes], timeout: float = STOP_SECONDS) -> None:
    """SIGTERM (the gateway's orderly stop), SIGKILL after ``timeout``; always reaped."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ------------------------------------------------------------------------------------------ the banner


def gateway_command() -> str:
    """How to run the ``gateway`` command from a shell on this machine."""
    script = Path(sys.executable).parent / "gateway"
    if script.is_file():
        return str(script)
    return f"PYTHONPATH={PACKAGE_ROOT} {sys.executable} -c '{GATEWAY_MAIN}'"


def client_configs(base: str, admin_token: str, files: DemoFiles) -> tuple[str, str]:
    """(HTTPS client configuration, stdio client configuration), as JSON to paste."""
    https = {"mcpServers": {"vsphere-gateway": {
        "type": "http", "url": f"{base}/mcp", "headers": {"Authorization": f"Bearer {admin_token}"}}}}
    stdio = {"mcpServers": {"vsphere-gateway": {"command": str(files.stdio_script)}}}
    return json.dumps(https, indent=2), json.dumps(stdio, indent=2)


def banner(files: DemoFiles, sims: Mapping[str, SimulatorProcess], tokens: Mapping[str, str], base: str,
           web: bool) -> str:
    """What the demo prints once the gateway is ready (the only place tokens are ever shown)."""
    https_config, stdio_config = client_configs(base, tokens["demo-admin"], files)
    kinds = {"vpx": "vCenter", "esx": "ESXi host"}
    out = ["", "vSphere MCP Gateway demo", "", "Simulated targets (loopback):"]
    out += [f"  {name:<7} {kinds.get(sim.model, sim.model):<10} {sim.url}" for name, sim in sims.items()]
    out += ["", "Tokens (shown only now; only their hashes are stored):"]
    out += [f"  {name} ({role}): {tokens[name]}  ({_USES[kind]})" for name, (role, kind) in TOKENS.items()
            if name in tokens]
    out += ["", f"MCP endpoint:  {base}/mcp"]
    if web:
        out += [f"Web page:      {base}/ui  (sign in with the demo-person token; proposals on vc-2 wait "
                "for a person's approval there)"]
    else:
        out += ["Web page:      not part of this build yet (gateway.web.app is missing)"]
    out += [
        f"Demo folder:   {files.folder}  (home/ holds the configuration and audit.jsonl; tls/, gateway.log)",
        f"Certificate:   {files.tls / 'cert.pem'}  (self-signed: make your client trust it, e.g.",
        f"               NODE_EXTRA_CA_CERTS={files.tls / 'cert.pem'} or SSL_CERT_FILE=...)",
        "", "MCP client over HTTPS (bearer token in a header):", https_config,
        "", "Desktop client over stdio (runs on this machine, as you):", stdio_config,
        "", "MCP Inspector CLI (Node.js 22.19+; Node 20 works with warnings):",
        f"  NODE_EXTRA_CA_CERTS={files.tls / 'cert.pem'} \\",
        f"  npx -y {INSPECTOR} --cli {base}/mcp --transport http \\",
        f"    --header 'Authorization: Bearer {tokens['demo-admin']}' --method tools/list",
        "", "More tokens, e.g. an agent's for the custom role lab-operator, or a person's to approve:",
        f"  (set -a; . {files.env_file}; {gateway_command()} token create ci --role lab-operator)",
        f"  (set -a; . {files.env_file}; {gateway_command()} token create alice --role approver "
        "--kind person)",
        "",
    ]
    return "\n".join(out)


# -------------------------------------------------------------------------------------------- main


def _stop_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(folder: Path, port: int, binary: Path) -> int:
    """Start everything, print the banner, wait for Ctrl-C (or the gateway exiting); stop everything."""
    with contextlib.ExitStack() as stack:
        reservation = stack.enter_context(reserve_port(port))
        lock_fd = lock_folder(folder, stack)
        files = prepare_folder(folder)
        print(f"starting simulators ({', '.join(SIMULATORS)}) ...", flush=True)
        sims = start_simulators(stack, binary)
        env = write_configuration(files, sims)
        create_certificate(files.tls, ["localhost"], ["127.0.0.1"])
        tokens = create_tokens(files)
        web = web_available()
        base = f"https://127.0.0.1:{port}"
        print(f"starting the gateway on {base} (log: {files.log}) ...", flush=True)
        reservation.close()
        gateway = start_gateway(files, env, serve_argv(files, port, web), lock_fd)
        stack.callback(stop_process, gateway)
        # runs first when the stack unwinds: a second Ctrl-C must not cut the clean-up short
        stack.callback(signal.signal, signal.SIGINT, signal.SIG_IGN)
        try:
            wait_ready(gateway, f"{base}/readyz", files.tls / "cert.pem", STARTUP_SECONDS, files.log)
        except DemoError as exc:
            print(f"demo: {exc} (full log: {files.log})", file=sys.stderr)
            return 1
        print(banner(files, sims, tokens, base, web))
        print(f"Ready: {base}/mcp  (Ctrl-C stops the gateway and the simulators)", flush=True)
        code = gateway.wait()
        print(f"the gateway exited with status {code}; the end of {files.log}:\n{log_tail(files.log)}",
              file=sys.stderr)
        return 1


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1-65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: it must be between 1 and 65535")
    return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.dev.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                        help=f"HTTPS port (default {DEFAULT_PORT})")
    parser.add_argument("--dir", type=Path, default=REPO / "demo", help="demo folder (default: demo/)")
    parser.add_argument("--vcsim", type=Path, default=VCSIM_BIN,
                        help="the simulator launcher (default: deploy/vcsim/bin/vcsim-gw; `make vcsim`)")
    args = parser.parse_args(argv)
    if not args.vcsim.is_file():
        parser.error(f"--vcsim: {args.vcsim} is missing; build it with: make vcsim")
    # Ctrl-C must stop the demo however it was started: a shell starting it in the background (a script,
    # `make run &`, a CI step) hands it SIGINT ignored, and Python then leaves it ignored, so a SIGINT to the
    # process group stopped the gateway alone (status 0) while the demo went on waiting, or ignored it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        return run(args.dir, args.port, args.vcsim)
    except KeyboardInterrupt:
        print("\nstopped: the gateway and the simulators are down", flush=True)
        return 0
    except (DemoError, RuntimeError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
