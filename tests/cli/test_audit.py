"""`gateway audit log|stats|verify` through gateway.cli.main against real log files."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import gateway.cli
from gateway.audit.file_sink import AuditSink
from gateway.audit.query import read_rows
from gateway.audit.signing import SIGNING_KEY_NAME
from gateway.cli import main
from gateway.cli.audit import parse_when

NOW = datetime.now(UTC)


@pytest.fixture(autouse=True)
def only_the_audit_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    # Other command groups are built in parallel; these tests exercise ours through the real main().
    monkeypatch.setattr(gateway.cli, "COMMAND_MODULES", ("audit",))


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "audit.jsonl"


@pytest.fixture
def history(log: Path) -> list[dict[str, Any]]:
    """Six rows, three hours ago to ten minutes ago."""
    moments = iter([NOW - timedelta(hours=3), NOW - timedelta(hours=2), NOW - timedelta(minutes=90),
                    NOW - timedelta(minutes=50), NOW - timedelta(minutes=20), NOW - timedelta(minutes=10)])
    events: list[dict[str, Any]] = [
        {"phase": "call", "tool": "list_vms", "target": "vc1", "caller": "ops", "correlation_id": "c1"},
        {"phase": "proposed", "tool": "delete_vm", "target": "vc1", "caller": "ops", "correlation_id": "c2",
         "proposal_id": "p-1"},
        {"phase": "denied", "tool": "delete_vm", "target": "vc2", "caller": "bot",
         "decision": {"allowed": False, "reason": "vm is protected", "rule": "protect-prod"}},
        {"phase": "executed", "tool": "delete_vm", "target": "vc1", "caller": "ops", "correlation_id": "c2",
         "outcome": "ok", "duration_ms": 812},
        {"phase": "failed", "tool": "power_on", "target": "vc2", "caller": "evil\x1b[31m", "outcome": "error",
         "error_code": "timeout"},
        {"phase": "token_created", "caller": "admin", "surface": "cli"},
    ]
    with AuditSink(log, durable=False, clock=lambda: next(moments)) as sink:
        return [sink.write(e) for e in events]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def table_seqs(out: str) -> list[int]:
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["TIME", "SEQ", "PHASE"]
    return [int(line.split()[2]) for line in lines[1:]]


# -- log ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("flags", "seqs"), [
    ([], [1, 2, 3, 4, 5, 6]),
    (["--last", "2"], [5, 6]),
    (["--target", "vc2"], [3, 5]),
    (["--tool", "delete_vm"], [2, 3, 4]),
    (["--phase", "executed"], [4]),
    (["--caller", "ops"], [1, 2, 4]),
    (["--correlation-id", "c2"], [2, 4]),
    (["--since", "1h"], [4, 5, 6]),
    (["--since", "100m", "--until", "15m"], [3, 4, 5]),
    (["--since", (NOW - timedelta(minutes=55)).isoformat(), "--phase", "failed"], [5]),
])
def test_log_filters(capsys: pytest.CaptureFixture[str], log: Path, history: list[dict[str, Any]],
                     flags: list[str], seqs: list[int]) -> None:
    code, out, _ = run(capsys, "audit", "log", "--audit-log", str(log), *flags)
    assert code == 0
    assert table_seqs(out) == seqs


def test_log_shows_the_newest_rows_unless_asked_for_more(capsys: pytest.CaptureFixture[str],
                                                         log: Path) -> None:
    with AuditSink(log, durable=False) as sink:
        for i in range(60):
            sink.write({"phase": "call", "caller": f"c{i}"})

    _, out, err = run(capsys, "audit", "log", "--audit-log", str(log))
    assert table_seqs(out) == list(range(11, 61)) and "--last 0 shows all" in err
    _, out, err = run(capsys, "audit", "log", "--audit-log", str(log), "--last", "0")
    assert table_seqs(out) == list(range(1, 61)) and err == ""
    _, out, _ = run(capsys, "audit", "log", "--audit-log", str(log), "--since", "1d")
    assert len(table_seqs(out)) == 60


def test_log_table_shows_what_happened(capsys: pytest.CaptureFixture[str], log: Path,
                                       history: list[dict[str, Any]]) -> None:
    _, out, _ = run(capsys, "audit", "log", "--audit-log", str(log))
    lines = out.splitlines()
    assert "rule=protect-prod; vm is protected" in lines[3]
    assert "ok; 812ms" in lines[4]
    assert "proposal=p-1" in lines[2]
    assert "\x1b" not in out and "evil?[31m" in lines[5]


def test_log_json_prints_the_rows(capsys: pytest.CaptureFixture[str], log: Path,
                                  history: list[dict[str, Any]]) -> None:
    code, out, _ = run(capsys, "audit", "log", "--audit-log", str(log), "--json", "--caller", "bot")
    assert code == 0
    assert [json.loads(line) for line in out.splitlines()] == [history[2]]


def test_log_with_no_match_says_so(capsys: pytest.CaptureFixture[str], log: Path,
                                   history: list[dict[str, Any]]) -> None:
    code, out, err = run(capsys, "audit", "log", "--audit-log", str(log), "--target", "nowhere")
    assert (code, out) == (0, "") and "no matching rows" in err


def test_log_rejects_an_unreadable_time(capsys: pytest.CaptureFixture[str], log: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["audit", "log", "--audit-log", str(log), "--since", "yesterday"])
    assert exited.value.code == 2
    assert "neither an ISO-8601 time" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "expected"), [
    ("30s", NOW - timedelta(seconds=30)), ("15m", NOW - timedelta(minutes=15)),
    ("2h", NOW - timedelta(hours=2)), ("2d", NOW - timedelta(days=2)), ("1w", NOW - timedelta(weeks=1)),
    ("2026-03-28", datetime(2026, 3, 28, tzinfo=UTC)),
    ("2026-03-28T14:00:00Z", datetime(2026, 3, 28, 14, tzinfo=UTC)),
    ("2026-03-28T14:00:00+02:00", datetime(2026, 3, 28, 12, tzinfo=UTC)),
])
def test_parse_when(text: str, expected: datetime) -> None:
    assert parse_when(text, now=NOW) == expected


# -- stats --------------------------------------------------------------------------------------------

def test_stats_text_and_json(capsys: pytest.CaptureFixture[str], log: Path,
                             history: list[dict[str, Any]]) -> None:
    code, out, _ = run(capsys, "audit", "stats", "--audit-log", str(log))
    assert code == 0 and out.startswith("6 rows\n")
    assert "tool:\n  delete_vm  3\n  list_vms   1\n  power_on   1" in out

    code, out, _ = run(capsys, "audit", "stats", "--audit-log", str(log), "--since", "1h", "--json")
    summary = json.loads(out)
    assert code == 0 and summary["rows"] == 3
    assert summary["by_phase"] == {"executed": 1, "failed": 1, "token_created": 1}


# -- verify -------------------------------------------------------------------------------------------

def test_verify_an_intact_log(capsys: pytest.CaptureFixture[str], log: Path,
                              history: list[dict[str, Any]]) -> None:
    code, out, _ = run(capsys, "audit", "verify", "--audit-log", str(log))
    assert code == 0
    assert out.startswith("OK: the audit chain is intact: 6 rows, seq 1..6, 1 file")


def test_verify_names_the_first_broken_line(capsys: pytest.CaptureFixture[str], log: Path,
                                            history: list[dict[str, Any]]) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b'"vc1"', b'"vc3"')
    log.write_bytes(b"".join(lines))

    code, out, err = run(capsys, "audit", "verify", "--audit-log", str(log))

    assert code == 1
    assert err.startswith("BROKEN:") and "tampered" in err  # a verdict scripts see apart from the output
    assert f"first broken line: {log}:4: hash_mismatch" in err
    assert "BROKEN" not in out


def test_verify_calls_a_torn_last_line_torn(capsys: pytest.CaptureFixture[str], log: Path,
                                            history: list[dict[str, Any]]) -> None:
    log.write_bytes(log.read_bytes()[:-25])

    code, out, _ = run(capsys, "audit", "verify", "--audit-log", str(log))

    assert code == 1
    assert out.startswith("TORN: the last line is incomplete") and f"{log}:6" in out
    assert "not tampering" in out and "BROKEN" not in out


def test_verify_of_a_missing_log_fails(capsys: pytest.CaptureFixture[str], log: Path) -> None:
    code, out, err = run(capsys, "audit", "verify", "--audit-log", str(log))
    assert (code, out) == (1, "") and f"no audit log at {log}" in err


def test_the_log_path_comes_from_the_environment(capsys: pytest.CaptureFixture[str], log: Path,
                                                 history: list[dict[str, Any]],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_AUDIT_LOG", str(log))
    code, out, _ = run(capsys, "audit", "log", "--json", "--last", "1")
    assert code == 0 and json.loads(out)["seq"] == 6
    assert read_rows(log, last=1)[0]["seq"] == 6


def test_an_unreadable_log_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    (tmp_path / "audit.jsonl").mkdir()
    code, _, err = run(capsys, "audit", "verify", "--audit-log", str(tmp_path / "audit.jsonl"))
    assert code == 1 and "cannot read the audit log" in err


# -- checkpoints --------------------------------------------------------------------------------------

def signed_log(home: Path, log: Path, rows: int = 8) -> None:
    with AuditSink(log, durable=False, key_file=home / SIGNING_KEY_NAME, checkpoint_rows=4) as sink:
        for i in range(rows):
            sink.write({"phase": "call", "tool": "list_vms", "args": {"i": i}})


def test_verify_checkpoint_passes_an_intact_log(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                log: Path) -> None:
    signed_log(tmp_path, log)
    code, out, _ = run(capsys, "audit", "verify", "--checkpoint", "--home", str(tmp_path),
                       "--audit-log", str(log))
    assert code == 0, out
    assert "OK: the audit chain is intact: 8 rows" in out
    assert "checkpoints: OK: 2 signed heads match (newest seq 8)" in out


def test_verify_checkpoint_detects_a_cut_tail(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                              log: Path) -> None:
    signed_log(tmp_path, log)
    log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:-2]))
    assert run(capsys, "audit", "verify", "--audit-log", str(log))[0] == 0  # the chain alone passes
    code, _, err = run(capsys, "audit", "verify", "--checkpoint", "--home", str(tmp_path),
                       "--audit-log", str(log))
    assert code == 1
    assert "checkpoints: FAILED" in err and "cut_tail: seq 8 was signed but the log ends at seq 6" in err


def test_audit_key_prints_the_public_key_and_verify_pins_it(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path, log: Path) -> None:
    signed_log(tmp_path, log)
    code, out, _ = run(capsys, "audit", "key", "--home", str(tmp_path))
    key = out.strip()
    assert code == 0 and key.startswith("ed25519:") and len(key) == 8 + 64
    pinned = run(capsys, "audit", "verify", "--checkpoint", "--public-key", key, "--audit-log", str(log))
    assert pinned[0] == 0
    other = "ed25519:" + "ab" * 32
    code, _, err = run(capsys, "audit", "verify", "--checkpoint", "--public-key", other,
                       "--audit-log", str(log))
    assert code == 1 and "key_mismatch" in err
    with pytest.raises(SystemExit) as exited:
        main(["audit", "verify", "--checkpoint", "--public-key", "nonsense", "--audit-log", str(log)])
    assert exited.value.code == 2 and "expected ed25519:<64 hex digits>" in capsys.readouterr().err


def test_audit_key_without_a_key_says_how_one_is_made(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    code, out, err = run(capsys, "audit", "key", "--home", str(tmp_path))
    assert code == 1 and out == "" and "no audit signing key" in err


# -- issue 25: aliases, --json, and the Merkle tree's commands -----------------------------------------

def test_log_status_is_the_phase_filter(capsys: pytest.CaptureFixture[str], log: Path,
                                        history: list[dict[str, Any]]) -> None:
    code, out, _ = run(capsys, "audit", "log", "--audit-log", str(log), "--status", "denied", "--json")
    assert code == 0 and [json.loads(line)["seq"] for line in out.splitlines()] == [3]


def test_stats_days_is_since_n_days(capsys: pytest.CaptureFixture[str], log: Path,
                                    history: list[dict[str, Any]]) -> None:
    code, out, _ = run(capsys, "audit", "stats", "--audit-log", str(log), "--days", "1", "--json")
    assert code == 0 and json.loads(out)["rows"] == 6
    with pytest.raises(SystemExit):
        main(["audit", "stats", "--audit-log", str(log), "--days", "1", "--since", "2d"])


def test_verify_json_reports_the_first_broken_line(capsys: pytest.CaptureFixture[str], log: Path,
                                                   history: list[dict[str, Any]]) -> None:
    code, out, _ = run(capsys, "audit", "verify", "--audit-log", str(log), "--json")
    assert code == 0 and json.loads(out)["ok"] is True and json.loads(out)["rows"] == 6
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:2] + lines[3:]))
    code, out, _ = run(capsys, "audit", "verify", "--audit-log", str(log), "--json")
    report = json.loads(out)
    assert code == 1 and report["ok"] is False
    assert report["first_broken_line"]["reason"] == "seq_gap" and report["first_broken_line"]["line"] == 3


def test_checkpoint_prove_and_verify_proof_offline(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_AUDIT_ORIGIN", "cli.example/audit")
    with AuditSink(log, durable=False, key_file=tmp_path / SIGNING_KEY_NAME, checkpoint_rows=4,
                   origin="cli.example/audit") as sink:
        for i in range(10):
            sink.write({"phase": "call", "tool": "list_vms", "args": {"i": i}})
    where = ("--home", str(tmp_path), "--audit-log", str(log))
    code, note, _ = run(capsys, "audit", "checkpoint", *where)
    entries = [json.loads(line) for line in (tmp_path / "audit.jsonl.checkpoints").read_text().splitlines()]
    assert code == 0 and note == entries[-1]["note"] and note.startswith("cli.example/audit\n10\n")
    code, vkey, _ = run(capsys, "audit", "key", "--note", *where)
    assert code == 0 and vkey.startswith("cli.example/audit+") and vkey.count("+") >= 2
    code, out, _ = run(capsys, "audit", "prove", "7", "--json", *where)
    proof = json.loads(out)
    assert code == 0 and set(proof) == {"index", "tree_size", "hashes"} and proof["index"] == 6
    (tmp_path / "note").write_text(note)
    (tmp_path / "proof.json").write_text(out)
    (tmp_path / "row").write_bytes(log.read_bytes().splitlines(keepends=True)[6])
    offline = ("audit", "verify-proof", "--public-key", vkey.strip(), "--checkpoint", str(tmp_path / "note"),
               "--proof", str(tmp_path / "proof.json"))
    code, out, _ = run(capsys, *offline, "--row", str(tmp_path / "row"))
    assert code == 0 and out.startswith("OK: row leaf 6 is in the signed tree of 10 rows")
    (tmp_path / "row").write_bytes(log.read_bytes().splitlines(keepends=True)[5])
    code, _, err = run(capsys, *offline, "--row", str(tmp_path / "row"))
    assert code == 1 and err.startswith("FAILED: the row is not leaf 6")

    code, out, _ = run(capsys, "audit", "prove", "--consistency", "4", "--json", *where)
    assert code == 0 and set(json.loads(out)) == {"old_size", "new_size", "hashes"}
    (tmp_path / "old").write_text(entries[0]["note"])
    (tmp_path / "proof.json").write_text(out)
    code, out, _ = run(capsys, *offline, "--old-checkpoint", str(tmp_path / "old"))
    assert code == 0 and "extends the signed tree of 4 rows" in out


def test_verify_witness_names_the_first_inconsistent_checkpoint(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path, log: Path) -> None:
    witness = tmp_path / "witness"
    with AuditSink(log, durable=False, key_file=tmp_path / SIGNING_KEY_NAME, checkpoint_rows=4,
                   witness_dir=witness) as sink:
        for i in range(12):
            sink.write({"phase": "call", "tool": "list_vms", "args": {"i": i}})
    where = ("--home", str(tmp_path), "--audit-log", str(log), "--witness", str(witness))
    code, out, _ = run(capsys, "audit", "verify", *where)
    assert code == 0 and "witness: OK: the log extends all 3 witnessed checkpoints" in out
    saved = tmp_path / "seen.note"  # an auditor keeps what `gateway audit checkpoint` printed
    saved.write_text(run(capsys, "audit", "checkpoint", *where[:4])[1])
    lines = log.read_bytes().splitlines(keepends=True)
    lines[5], lines[6] = lines[6], lines[5]
    log.write_bytes(b"".join(lines))
    code, out, err = run(capsys, "audit", "verify", *where)
    assert code == 1 and "witness: FAILED" in err
    assert f"first inconsistent checkpoint (and 1 more): {witness}/000000000008-" in err
    assert "seq 5..8" in err
    code, _, err = run(capsys, "audit", "verify", *where[:4], "--witness", str(saved))
    assert code == 1 and f"first inconsistent checkpoint: {saved}: inconsistent" in err
