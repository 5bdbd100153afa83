"""``gateway doctor``: check a deployment from the operator's side and print what to fix.

One ``ok`` or ``FIX`` line per check (files, credentials, each target, the state, audit and key);
every check reuses the gateway's own code, so no rule has a second copy. Exit 1 when anything needs fixing.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from gateway.audit.signing import load_or_create_signing_key
from gateway.auth.roles import RoleBook
from gateway.backends import open_backends
from gateway.cli import add_path_flags, settings_from
from gateway.config import Target, load_targets
from gateway.errors import ConfigError, GatewayError
from gateway.guard.policy.store import PolicyStore
from gateway.settings import Settings
from gateway.vsphere.pool import SessionPool, tls_context

#: a target's clock further than this from ours makes token and proposal expiry times disagree
MAX_SKEW_SECONDS: Final = 30.0


@dataclass(frozen=True)
class Finding:
    check: str
    subject: str
    ok: bool
    detail: str
    fix: str = ""


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "doctor", help="check a deployment (files, credentials, targets, clock, audit, database)",
        description="Check this deployment as `gateway serve` would find it and print what to fix.")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--offline", action="store_true", help="do not contact the targets")
    add_path_flags(parser)
    parser.set_defaults(handler=run)


def file_findings(settings: Settings) -> Iterator[Finding]:
    files = (("targets", settings.targets_file, True), ("rules", settings.rules_file, False),
             ("roles", settings.roles_file, False))
    for name, path, required in files:
        if not path.exists():
            if required:
                yield Finding("file", str(path), False, f"{name}.yaml is missing",
                              f"create it (targets.example.yaml) or point --{name} at it")
            else:
                yield Finding("file", str(path), True, f"absent: the built-in {name} apply")
            continue
        if not os.access(path, os.R_OK):
            yield Finding("file", str(path), False, "not readable by this user",
                          f"chown or chmod it so the gateway's user can read {path}")
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        if name == "roles":  # its loader refuses a roles file others can write: reported once, below
            mode &= ~0o022
        if mode & 0o022:
            yield Finding("file", str(path), False, f"writable by group or others (mode {mode:o})",
                          f"chmod go-w {path}")
        problems = parse_problems(name, path)
        if problems:
            yield Finding("file", str(path), False, f"{len(problems)} problem(s): {problems[0]}",
                          f"run `gateway check --{name} {path}` and fix each line it prints")
        elif not mode & 0o022:
            yield Finding("file", str(path), True, "readable and valid")


def parse_problems(name: str, path: Path) -> list[str]:
    """What the loader ``serve`` uses finds wrong in the file (credentials not needed)."""
    try:
        if name == "targets":
            load_targets(path)
        elif name == "rules":
            PolicyStore(path).current()
        else:
            return RoleBook(path).check()
    except ConfigError as exc:
        return list(exc.details.get("problems") or [exc.message])
    return []


def target_findings(target: Target, settings: Settings, offline: bool) -> Iterator[Finding]:
    try:
        credentials = target.credentials(settings.credentials)
    except ConfigError as exc:
        yield Finding("credentials", target.name, False, exc.message,
                      f"set {target.credential_env_prefix}_USER and {target.credential_env_prefix}_PASSWORD "
                      "in the gateway's environment (the systemd EnvironmentFile, the Kubernetes Secret)")
        return
    yield Finding("credentials", target.name, True, f"{target.credential_env_prefix}_USER/_PASSWORD set")
    try:
        tls_context(target)
    except ConfigError as exc:
        yield Finding("certificate", target.name, False, exc.message,
                      "mount the CA bundle at the path ca_file names")
        return
    if offline:
        return
    pool = SessionPool(target, credentials)
    try:
        their_time = pool.run(lambda session: session.si.CurrentTime())
    except GatewayError as exc:
        check = "certificate" if "certificate" in exc.message else "reachable"
        yield Finding(check, target.name, False, exc.message, exc.message.rsplit("; ", 1)[-1])
        return
    finally:
        pool.close()
    yield Finding("reachable", target.name, True,
                  f"logged in at {target.address}" + ("" if target.insecure else ", certificate trusted"))
    if target.insecure:
        yield Finding("certificate", target.name, True, "not verified (insecure: true; labs only)")
    skew = their_time.timestamp() - time.time()
    yield Finding("clock", target.name, abs(skew) <= MAX_SKEW_SECONDS, f"{skew:+.1f}s from this machine",
                  "" if abs(skew) <= MAX_SKEW_SECONDS else "synchronise both clocks with NTP (chrony)")


def state_findings(settings: Settings) -> Iterator[Finding]:
    try:
        backends = open_backends(settings)
    except GatewayError as exc:
        yield Finding("database", settings.database_url or str(settings.home), False, exc.message,
                      "fix the state store named above (GATEWAY_DATABASE_URL or GATEWAY_HOME)")
        return
    try:
        where = settings.database_url or str(settings.home)
        up = backends.store.ping()
        yield Finding("database", where, up, "answers" if up else "does not answer",
                      "" if up else "start the database or fix GATEWAY_DATABASE_URL / GATEWAY_HOME")
        writable = backends.audit.writable()
        yield Finding("audit", str(settings.audit_log), writable, "writable" if writable else "not writable",
                      "" if writable else f"make {settings.audit_log}'s directory writable by the gateway's "
                                          "user, with free space")
        now = time.time()
        usable = sum(1 for record in backends.store.list_tokens() if record.usable(now))
        yield Finding("token", where, usable > 0, f"{usable} usable token(s)",
                      "" if usable else "`gateway token create NAME --role admin` (serve refuses to start "
                                        "without one)")
    finally:
        backends.close()
    key = settings.audit_signing_key_file
    if key is None:  # PostgreSQL without GATEWAY_AUDIT_SIGNING_KEY_FILE: nothing signed here
        return
    if not key.exists():
        yield Finding("signing_key", str(key), True, "absent: the gateway creates it at first start")
        return
    try:
        load_or_create_signing_key(key)  # exists: only read (refused when others can read it)
    except GatewayError as exc:
        yield Finding("signing_key", str(key), False, exc.message, "see the message")
    except OSError as exc:
        yield Finding("signing_key", str(key), False, f"cannot be read ({exc.strerror})",
                      f"give the gateway's user read access to {key} (mode 0400/0600; fsGroup in Kubernetes)")
    else:
        yield Finding("signing_key", str(key), True, "private and readable")


def findings(settings: Settings, offline: bool = False) -> list[Finding]:
    found = list(file_findings(settings))
    try:
        targets = load_targets(settings.targets_file)
    except ConfigError:
        targets = ()
    for target in targets:
        found += target_findings(target, settings, offline)
    found += state_findings(settings)
    return found


def run(args: argparse.Namespace) -> int:
    found = findings(settings_from(args), offline=args.offline)
    healthy = all(f.ok for f in found)
    if args.json:
        print(json.dumps({"ok": healthy, "checks": [asdict(f) for f in found]}, indent=2))
    else:
        for f in found:
            print(f"{'ok ' if f.ok else 'FIX'}  {f.check:<12} {f.subject}: {f.detail}")
            if not f.ok and f.fix:
                print(f"     fix: {f.fix}")
        print("gateway doctor: " + ("everything checked is in order" if healthy else
                                    f"{sum(not f.ok for f in found)} thing(s) to fix"),
              file=sys.stderr)
    return 0 if healthy else 1
