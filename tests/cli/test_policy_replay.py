"""``gateway policy test`` and ``gateway check --replay`` on an audit of real calls: the simulator behind
the real gateway over HTTPS with the MCP client, the file audit and the PostgreSQL table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from support.answers import answer_of
from support.httpserver import audit_rows, build_gateway, mcp_client, serve
from support.simulator import MakeSimulator, complete_rules

from gateway.cli import main

pytestmark = pytest.mark.anyio

ALLOW_ALL = {"defaults": {"read": "allow", "write": "allow", "destructive": "allow"}}
NO_POWER_OFF = {**ALLOW_ALL, "rules": [{"name": "no-power-off", "action": "deny",
                                        "match": {"tools": ["power_off_vm"]}}]}


async def record_calls(tmp: Path, make_simulator: MakeSimulator, database_url: str | None = None) -> list[
        dict[str, Any]]:
    """Reads, power-ons, power-offs and a confirmed delete, made by an admin over HTTPS with the MCP
    client, under rules that allow everything; the audit rows they left."""
    sim = make_simulator(vms=3)
    first, second, doomed = sorted(sim.vm_names())[:3]
    gateway = build_gateway(tmp, sim, ALLOW_ALL, database_url=database_url)
    running = serve(tmp, gateway)
    try:
        async with mcp_client(running, running.tokens["alice"], "legacy") as client:
            answers = [
                await client.call_tool("list_vms", {"target": "vc1"}),
                await client.call_tool("list_vms", {"target": "all"}),
                await client.call_tool("power_off_vm", {"target": "vc1", "vm": first,
                                                        "guest_timeout_seconds": 0}),
                await client.call_tool("power_on_vm", {"target": "vc1", "vm": first}),
                await client.call_tool("get_vm_details", {"target": "vc1", "vm": first}),
                await client.call_tool("power_off_vm", {"target": "vc1", "vm": second,
                                                        "guest_timeout_seconds": 0}),
            ]
            proposed = answer_of(await client.call_tool("delete_vm", {"target": "vc1", "vm": doomed,
                                                                      "force_power_off": True}))
            answers.append(await client.call_tool("confirm_action", {"token": proposed["token"]}))
        rows = audit_rows(gateway)
    finally:
        running.stop()
        await gateway.close()
    assert not [answer_of(a) for a in answers if a.is_error]
    return rows


def write_rules(path: Path, rules: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(complete_rules(rules)))
    return path


def policy_test(tmp: Path, candidate: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[
        int, dict[str, Any]]:
    code = main(["policy", "test", "--home", str(tmp), "--rules", str(candidate), "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def power_offs(rows: list[dict[str, Any]]) -> list[int]:
    return [r["seq"] for r in rows if r.get("tool") == "power_off_vm" and r.get("phase") == "executing"]


async def test_a_candidate_denying_power_off_reports_exactly_the_power_off_calls(
    tmp_path: Path, make_simulator: MakeSimulator, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATEWAY_RULES_FILE", raising=False)
    rows = await record_calls(tmp_path, make_simulator)
    candidate = write_rules(tmp_path / "candidate.yaml", NO_POWER_OFF)

    code, report = policy_test(tmp_path, candidate, capsys)

    assert code == 1, report
    assert len(power_offs(rows)) == 2
    assert [(c["seq"], c["tool"], c["change"], c["candidate"]["rule"]) for c in report["changes"]] == [
        (seq, "power_off_vm", "allowed -> denied", "rule:no-power-off") for seq in power_offs(rows)]
    assert [(g["change"], g["rule"], g["count"]) for g in report["groups"]] == [
        ("allowed -> denied", "rule:no-power-off", 2)]
    assert report["not_replayed"] == 0 and report["unchanged"] >= 5  # 2 list_vms, power-on, details, delete
    assert report["audit"] == str(tmp_path / "audit.jsonl")


async def test_the_unchanged_rules_exit_0_and_a_broken_candidate_exits_2_with_file_and_line(
    tmp_path: Path, make_simulator: MakeSimulator, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATEWAY_RULES_FILE", raising=False)
    await record_calls(tmp_path, make_simulator)
    same = write_rules(tmp_path / "same.yaml", ALLOW_ALL)
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(complete_rules(NO_POWER_OFF)).replace("action: deny", "action: denyy"))

    code, report = policy_test(tmp_path, same, capsys)
    assert (code, report["changed"], report["not_replayed"]) == (0, 0, 0) and report["calls"] >= 7

    code = main(["policy", "test", "--home", str(tmp_path), "--rules", str(broken)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    line = next(n for n, text in enumerate(broken.read_text().splitlines(), 1) if "denyy" in text)
    assert f"{broken}:{line}:" in captured.err and "rules[0].action" in captured.err


async def test_gateway_check_replay_tests_the_rules_file_it_is_given(
    tmp_path: Path, make_simulator: MakeSimulator, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATEWAY_RULES_FILE", raising=False)
    rows = await record_calls(tmp_path, make_simulator)
    candidate = write_rules(tmp_path / "candidate.yaml", NO_POWER_OFF)

    code = main(["check", "--home", str(tmp_path), "--rules", str(candidate), "--replay", "--json"])
    report = json.loads(capsys.readouterr().out)

    assert code == 1 and report["problems"] == [], report
    assert [c["seq"] for c in report["replay"]["changes"]] == power_offs(rows)
    assert main(["check", "--home", str(tmp_path), "--replay"]) == 0  # rules.yaml against itself
    text = capsys.readouterr()
    assert "0 of " in text.out and "would be decided otherwise" in text.out


async def test_the_postgresql_audit_is_replayed_the_same_way(
    tmp_path: Path, make_simulator: MakeSimulator, pg_url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATEWAY_RULES_FILE", raising=False)
    rows = await record_calls(tmp_path, make_simulator, database_url=pg_url)
    monkeypatch.setenv("GATEWAY_DATABASE_URL", pg_url)
    candidate = write_rules(tmp_path / "candidate.yaml", NO_POWER_OFF)

    code, report = policy_test(tmp_path, candidate, capsys)

    assert code == 1, report
    assert report["audit"].endswith("(table audit_rows)"), report["audit"]
    password = urlsplit(pg_url).password
    assert password and password not in json.dumps(report)
    assert [(c["seq"], c["change"]) for c in report["changes"]] == [
        (seq, "allowed -> denied") for seq in power_offs(rows)]
    assert report["not_replayed"] == 0
