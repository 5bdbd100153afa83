"""``Gateway.build``: the composition root over a home with one target (never reached): its parts
composed once, every configuration load one audit row through the one writer (a CLI run only the news),
readiness saying why the process should not take traffic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from support.server_parts import PERMISSIVE
from support.simulator import complete_rules

from gateway.audit.query import read_rows
from gateway.server.runtime import Gateway
from gateway.settings import Settings

TARGETS = {"targets": [{"name": "vc1", "host": "127.0.0.1", "credential_env_prefix": "VC1"}]}


def settings_in(home: Path) -> Settings:
    (home / "targets.yaml").write_text(yaml.safe_dump(TARGETS))
    if not (home / "rules.yaml").exists():
        (home / "rules.yaml").write_text(yaml.safe_dump(complete_rules(PERMISSIVE)))
    return Settings.from_env({"GATEWAY_HOME": str(home)})


def built(home: Path, **options: Any) -> Gateway:
    return Gateway.build(settings_in(home), credentials_required=False, **options)


def loads(home: Path) -> list[tuple[str, str]]:
    return [(r["file"], r["outcome"]) for r in read_rows(home / "audit.jsonl", phase="config_reload")]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    gw = built(tmp_path)
    try:
        yield gw
    finally:
        anyio.run(gw.close)


def test_the_surfaces_reach_the_composed_parts(gateway: Gateway) -> None:
    path = gateway.path
    assert (gateway.calls, gateway.moves, gateway.trail) == (path.calls, path.moves, path.trail)
    assert (gateway.proposals, gateway.actions) == (path.proposing.flow, path.proposing.actions)
    assert gateway.facts is path.calls.facts is path.gate.facts


def test_every_configuration_load_is_one_row(tmp_path: Path, gateway: Gateway) -> None:
    assert [f for f, _ in loads(tmp_path)] == ["targets", "notifications", "rules"]
    assert {o for _, o in loads(tmp_path)} == {"loaded"}


def test_a_changed_rules_file_is_read_again_on_reload_and_audited(tmp_path: Path, gateway: Gateway) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(complete_rules(
        {"defaults": {**PERMISSIVE["defaults"], "destructive": "deny"}})))
    gateway.reload_files()
    (_targets, _notifications, first, again) = read_rows(tmp_path / "audit.jsonl", phase="config_reload")
    assert (first["file"], again["file"], again["outcome"]) == ("rules", "rules", "loaded")
    assert again["sha256"] != first["sha256"] and again["changed"]


def test_a_cli_run_audits_a_load_only_when_it_is_news(tmp_path: Path, gateway: Gateway) -> None:
    before = loads(tmp_path)
    second = built(tmp_path, cli=True)
    anyio.run(second.close)
    assert loads(tmp_path) == before


def test_readiness_says_why_not(gateway: Gateway) -> None:
    assert gateway.readiness() == []
    gateway.draining = True
    gateway.audit.close()
    assert gateway.readiness() == ["shutting down", "audit log not writable"]
