"""Typed, strictly loaded ``targets.yaml``.

Loading never guesses: an unknown key, a duplicate name, a wrong type or a missing credential is a
``ConfigProblem`` naming the file, the target and the fix. ``load_targets`` collects every problem
before raising, so ``gateway check`` can print them all at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.errors import ConfigError

_TARGET_KEYS = {
    "name",
    "host",
    "port",
    "credential_env_prefix",
    "insecure",
    "ca_file",
    "tags",
    "standalone_host",
    "pool_size",
    "timeout_seconds",
    "dry_run",
}


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class Target:
    """One vSphere endpoint (a vCenter or a standalone ESXi host) that calls name explicitly."""

    name: str
    host: str
    credential_env_prefix: str
    port: int = 443
    insecure: bool = False
    ca_file: str | None = None
    tags: tuple[str, ...] = ()
    standalone_host: bool = False
    pool_size: int = 2
    timeout_seconds: float = 60.0
    dry_run: bool | None = None

    @property
    def address(self) -> str:
        return self.host if self.port == 443 else f"{self.host}:{self.port}"

    def credentials(self, environ: Mapping[str, str]) -> Credentials:
        user = environ.get(f"{self.credential_env_prefix}_USER", "")
        password = environ.get(f"{self.credential_env_prefix}_PASSWORD", "")
        if not user or not password:
            raise ConfigError(
                f"target '{self.name}': credentials missing; set {self.credential_env_prefix}_USER and "
                f"{self.credential_env_prefix}_PASSWORD in the gateway's environment"
            )
        return Credentials(user, password)


class ConfigProblems(ConfigError):
    """Several problems found in one file; ``problems`` lists each as a full sentence."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems), problems=problems)
        self.problems = problems


def _check_type(problems: list[str], where: str, key: str, value: Any, kind: type | tuple[type, ...]) -> bool:
    ok = False if isinstance(value, bool) and kind in (int, float, (int, float)) else isinstance(value, kind)
    if not ok:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        problems.append(f"{where}: '{key}' must be {names}, got {type(value).__name__}")
    return ok


def parse_targets(data: Any, source: str, environ: Mapping[str, str] | None = None) -> tuple[Target, ...]:
    """Turn parsed YAML into targets; raise ``ConfigProblems`` listing every problem found."""
    problems: list[str] = []
    if isinstance(data, Mapping) and set(data) == {"targets"}:
        data = data["targets"]
    if not isinstance(data, list):
        raise ConfigProblems([f"{source}: expected a top-level 'targets:' list of target entries"])
    targets: list[Target] = []
    seen: set[str] = set()
    for index, entry in enumerate(data):
        where = f"{source}: target #{index + 1}"
        if not isinstance(entry, Mapping):
            problems.append(
                f"{where}: each target must be a mapping with at least name, host, credential_env_prefix"
            )
            continue
        name = entry.get("name")
        if isinstance(name, str) and name:
            where = f"{source}: target '{name}'"
        target = _parse_target(entry, where, problems, environ)
        if target is None:
            continue
        if target.name in seen:
            problems.append(f"{where}: duplicate name; every target needs a unique 'name'")
            continue
        seen.add(target.name)
        targets.append(target)
    if problems:
        raise ConfigProblems(problems)
    return tuple(targets)


def _parse_target(
    entry: Mapping[str, Any], where: str, problems: list[str], environ: Mapping[str, str] | None
) -> Target | None:
    before = len(problems)
    for key in sorted(set(entry) - _TARGET_KEYS):
        problems.append(f"{where}: unknown key '{key}'; allowed keys are {', '.join(sorted(_TARGET_KEYS))}")
    for key in ("name", "host", "credential_env_prefix"):
        if key not in entry:
            problems.append(f"{where}: missing required key '{key}'")
        else:
            _check_type(problems, where, key, entry[key], str)
    kinds: dict[str, type | tuple[type, ...]] = {
        "port": int,
        "insecure": bool,
        "ca_file": str,
        "standalone_host": bool,
        "pool_size": int,
        "timeout_seconds": (int, float),
        "dry_run": bool,
        "tags": list,
    }
    for key, kind in kinds.items():
        if key in entry and entry[key] is not None:
            _check_type(problems, where, key, entry[key], kind)
    if len(problems) > before:
        return None
    tags = entry.get("tags") or []
    if not all(isinstance(t, str) for t in tags):
        problems.append(f"{where}: 'tags' must be a list of strings")
        return None
    if entry.get("insecure") and entry.get("ca_file"):
        problems.append(f"{where}: set either 'insecure: true' or 'ca_file', not both")
    pool_size = entry.get("pool_size", 2)
    if not 1 <= pool_size <= 32:
        problems.append(f"{where}: 'pool_size' must be between 1 and 32")
    timeout = entry.get("timeout_seconds", 60.0)
    if timeout <= 0:
        problems.append(f"{where}: 'timeout_seconds' must be positive")
    target = Target(
        name=entry["name"],
        host=entry["host"],
        credential_env_prefix=entry["credential_env_prefix"],
        port=entry.get("port", 443),
        insecure=bool(entry.get("insecure", False)),
        ca_file=entry.get("ca_file"),
        tags=tuple(tags),
        standalone_host=bool(entry.get("standalone_host", False)),
        pool_size=pool_size,
        timeout_seconds=float(timeout),
        dry_run=entry.get("dry_run"),
    )
    if target.name in ("all", "*"):
        problems.append(f"{where}: '{target.name}' is reserved (it means every target); pick another name")
    if environ is not None:
        try:
            target.credentials(environ)
        except ConfigError as exc:
            problems.append(f"{where}: {exc.message}")
    return None if len(problems) > before else target


def load_targets(path: Path, environ: Mapping[str, str] | None = None) -> tuple[Target, ...]:
    """Load ``targets.yaml``; pass ``environ`` to also require every target's credentials."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigProblems(
            [
                f"{path}: cannot read targets file ({exc.strerror}); create it or set "
                "GATEWAY_TARGETS_FILE / --targets"
            ]
        ) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigProblems([f"{path}: not valid YAML: {exc}"]) from exc
    return parse_targets(data, str(path), environ if environ is not None else None)
