"""The audit log on real files: chain, tampering, torn lines, redaction, failures, concurrency, rotation."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

import gateway
from gateway.audit.chain import GENESIS, REPAIRED_PHASE, ROTATED_PHASE, canonical_json, row_hash
from gateway.audit.file_sink import AuditSink
from gateway.audit.files import checkpoint_path, log_files
from gateway.audit.query import read_rows, stats
from gateway.audit.redact import MASK, is_secret_key, redact, redact_text
from gateway.audit.signing import load_or_create_signing_key, public_key_text
from gateway.audit.verify import VerifyReport, verify
from gateway.errors import AuditUnavailable

REPO = Path(gateway.__file__).resolve().parents[1]
T0 = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)


def ticking_clock(start: datetime = T0, step: timedelta = timedelta(minutes=1)) -> Callable[[], datetime]:
    """A clock that advances ``step`` per reading, so rows get distinct, predictable timestamps."""
    moments: Iterator[datetime] = (start + i * step for i in itertools.count())
    return lambda: next(moments)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "audit.jsonl"


@pytest.fixture
def sink(path: Path) -> Iterator[AuditSink]:
    with AuditSink(path, durable=False, clock=ticking_clock()) as opened:
        yield opened


def write_calls(sink: AuditSink, count: int, **extra: Any) -> list[dict[str, Any]]:
    return [sink.write({"phase": "call", "tool": "list_vms", "target": f"vc{i % 3}", "caller": "ops",
                        "args": {"name": f"web-{i}"}, **extra}) for i in range(count)]


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


# -- stamping and the chain -------------------------------------------------------------------------

def test_rows_are_stamped_chained_and_written_as_returned(sink: AuditSink, path: Path) -> None:
    rows = write_calls(sink, 4)
    assert [r["seq"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["prev"] == GENESIS
    assert [r["prev"] for r in rows[1:]] == [r["hash"] for r in rows[:-1]]
    assert all(r["hash"] == row_hash(r) for r in rows)
    assert rows[0]["ts"] == "2026-03-28T12:00:00.000Z"
    assert [json.loads(line) for line in lines_of(path)] == rows
    report = verify(path)
    assert report.ok and report.rows == 4 and (report.first_seq, report.last_seq) == (1, 4)


def test_hash_covers_prev_and_canonical_form(sink: AuditSink) -> None:
    row = sink.write({"phase": "call", "b": 1, "a": "é"})
    body = {k: v for k, v in row.items() if k != "hash"}
    assert row["hash"] == hashlib.sha256(canonical_json(body)).hexdigest()
    assert row_hash({**row, "prev": "1" * 64}) != row["hash"]


def test_callers_cannot_set_the_stamp(sink: AuditSink, path: Path) -> None:
    row = sink.write({"phase": "call", "seq": 99, "prev": "f" * 64, "hash": "forged", "ts": "1999-01-01"})
    assert (row["seq"], row["prev"], row["ts"]) == (1, GENESIS, "2026-03-28T12:00:00.000Z")
    assert verify(path).ok


def test_values_that_are_not_json_are_logged_and_still_verify(sink: AuditSink, path: Path) -> None:
    class Mode(StrEnum):
        FAST = "fast"

    row = sink.write({"phase": "call", "args": {
        "when": T0, "mode": Mode.FAST, "tags": ("a", "b"), "ids": {7}, "blob": b"\x00\x01",
        "where": Path("/x"), "ratio": float("nan"), 3: "int key", "text": "caf\u00e9 \udc80",
    }})
    args = row["args"]
    assert args["when"] == T0.isoformat() and args["mode"] == "fast" and args["tags"] == ["a", "b"]
    assert args["ids"] == [7] and args["blob"] == "<2 bytes>" and args["where"] == "/x"
    assert args["ratio"] == "nan" and args["3"] == "int key"
    assert verify(path).ok


# -- tampering --------------------------------------------------------------------------------------

def _edit_field(lines: list[bytes]) -> None:
    lines[2] = lines[2].replace(b'"web-2"', b'"web-9"')


def _delete_line(lines: list[bytes]) -> None:
    del lines[2]


def _delete_first_line(lines: list[bytes]) -> None:
    del lines[0]


def _swap_lines(lines: list[bytes]) -> None:
    lines[2], lines[3] = lines[3], lines[2]


def _insert_copied_line(lines: list[bytes]) -> None:
    forged = json.loads(lines[1])
    forged["tool"] = "delete_vm"
    lines.insert(2, json.dumps(forged).encode() + b"\n")


def _forge(template: bytes, **changes: Any) -> bytes:
    """A self-consistent line: fields changed and the hash recomputed, as a careful forger would."""
    row = {**json.loads(template), **changes}
    row["hash"] = row_hash(row)
    return json.dumps(row).encode() + b"\n"


def _insert_rehashed_line(lines: list[bytes]) -> None:
    before = json.loads(lines[1])
    lines.insert(2, _forge(lines[1], seq=before["seq"] + 1, prev=before["hash"], tool="delete_vm"))


def _replace_with_rehashed_line(lines: list[bytes]) -> None:
    lines[2] = _forge(lines[2], tool="delete_vm")


def _insert_garbage(lines: list[bytes]) -> None:
    lines.insert(3, b"this is not json\n")


TAMPERING = [
    # how the file is changed, first broken line (1-based), reason
    pytest.param(_edit_field, 3, "hash_mismatch", id="edit-a-field"),
    pytest.param(_delete_line, 3, "seq_gap", id="delete-a-line"),
    pytest.param(_delete_first_line, 1, "seq_gap", id="delete-the-first-line"),
    pytest.param(_swap_lines, 3, "seq_gap", id="reorder-two-lines"),
    pytest.param(_insert_copied_line, 3, "hash_mismatch", id="insert-a-forged-line"),
    pytest.param(_insert_rehashed_line, 4, "seq_gap", id="insert-a-rehashed-forged-line"),
    pytest.param(_replace_with_rehashed_line, 4, "prev_mismatch", id="replace-with-a-rehashed-line"),
    pytest.param(_insert_garbage, 4, "not_json", id="insert-garbage"),
]


@pytest.mark.parametrize(("tamper", "line", "reason"), TAMPERING)
def test_tampering_is_detected_at_the_first_broken_line(
        sink: AuditSink, path: Path, tamper: Callable[[list[bytes]], None], line: int, reason: str) -> None:
    write_calls(sink, 6)
    assert verify(path).ok
    lines = lines_of(path)
    tamper(lines)
    path.write_bytes(b"".join(lines))

    report = verify(path)

    assert not report.ok and report.torn_last_line is None
    broken = report.first_broken_line
    assert broken is not None
    assert (broken.file, broken.line, broken.reason) == (path, line, reason)
    assert str(broken).startswith(f"{path}:{line}: {reason}: ")


def test_an_edit_is_reported_once_and_the_rest_of_the_chain_still_checks(sink: AuditSink, path: Path) -> None:
    write_calls(sink, 6)
    lines = lines_of(path)
    _edit_field(lines)
    path.write_bytes(b"".join(lines))
    report = verify(path)
    assert report.problems == 1 and report.rows == 6


# -- torn lines -------------------------------------------------------------------------------------

def test_a_line_cut_mid_write_is_torn_not_tampered(sink: AuditSink, path: Path) -> None:
    write_calls(sink, 3)
    data = path.read_bytes()
    cut = len(data) - 40
    path.write_bytes(data[:cut])

    report = verify(path)

    assert not report.ok and report.first_broken_line is None
    torn = report.torn_last_line
    assert torn is not None and (torn.file, torn.line, torn.reason) == (path, 3, "torn")
    assert report.rows == 2


def test_the_next_append_removes_a_torn_line_and_records_it(path: Path) -> None:
    with AuditSink(path, durable=False) as first:
        write_calls(first, 3)
    data = path.read_bytes()
    fragment = data[data.rindex(b"\n", 0, len(data) - 1) + 1:-30]
    path.write_bytes(data[:-30])

    with AuditSink(path, durable=False) as second:
        row = second.write({"phase": "call", "tool": "list_hosts"})

    rows = read_rows(path)
    assert [r["phase"] for r in rows] == ["call", "call", REPAIRED_PHASE, "call"]
    assert rows[2]["torn_bytes"] == len(fragment)
    assert rows[2]["torn_sha256"] == hashlib.sha256(fragment).hexdigest()
    assert row["seq"] == 4 and verify(path).ok


def test_a_complete_last_row_missing_only_its_newline_is_kept(path: Path) -> None:
    with AuditSink(path, durable=False) as first:
        write_calls(first, 2)
    path.write_bytes(path.read_bytes()[:-1])
    report = verify(path)
    assert report.torn_last_line is not None and report.rows == 2

    with AuditSink(path, durable=False) as second:
        second.write({"phase": "call"})

    assert [r["seq"] for r in read_rows(path)] == [1, 2, 3] and verify(path).ok


def test_garbage_after_the_last_row_breaks_the_chain_instead_of_being_cut(path: Path) -> None:
    with AuditSink(path, durable=False) as first:
        write_calls(first, 2)
    with path.open("ab") as handle:
        handle.write(b"not a row\n")

    with AuditSink(path, durable=False) as second:
        row = second.write({"phase": "call"})

    assert row["seq"] == 3
    broken = verify(path).first_broken_line
    assert broken is not None and (broken.line, broken.reason) == (3, "not_json")


def test_rows_larger_than_the_read_chunk_chain_and_read_back(path: Path) -> None:
    # The sink bounds its rows now, but a log written by an older version may hold huge ones.
    big = "x" * 200_000
    first = {"ts": "2026-03-28T12:00:00.000Z", "seq": 1, "phase": "call", "args": {"note": big},
             "prev": GENESIS}
    first["hash"] = row_hash(first)
    second = {"ts": "2026-03-28T12:01:00.000Z", "seq": 2, "phase": "call", "args": {"note": big},
              "prev": first["hash"]}
    second["hash"] = row_hash(second)
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in (first, second)))
    with AuditSink(path, durable=False) as sink:
        assert sink.write({"phase": "call"})["seq"] == 3
    assert verify(path).ok
    assert read_rows(path, last=2)[0]["args"]["note"] == big


# -- redaction --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "secret"), [
    ("password", True), ("Password", True), ("db_passwd", True), ("client_secret", True),
    ("X-Auth-Token", True), ("api-key", True), ("apiKey", True), ("Authorization", True),
    ("set-cookie", True), ("credentials", True), ("ssh_private_key", True), ("vmware_soap_session", True),
    ("token_id", False), ("token_name", False), ("secret_name", False), ("name", False), ("vm", False),
    ("author", False), ("keyboard", False),
])
def test_secret_keys(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_values_under_secret_keys_are_masked_at_any_depth() -> None:
    event = {"args": {"vm": "web-1", "auth": {"Password": "p4ss", "api-key": "k3y", "token_id": "abc",
                                              "nested": [{"client_secret": {"a": "s3cr3t"}}]},
                      "headers": {"Authorization": "Bearer xyz", "Cookie": "sid=1"}, "pwd": None}}
    assert redact(event) == {"args": {"vm": "web-1",
                                      "auth": {"Password": MASK, "api-key": MASK, "token_id": "abc",
                                               "nested": [{"client_secret": MASK}]},
                                      "headers": {"Authorization": MASK, "Cookie": MASK}, "pwd": None}}


@pytest.mark.parametrize(("text", "expected"), [
    ("token gwt_abc123_Zm9vYmFyYmF6cXV4MTIz rejected", "token gwt_abc123_*** rejected"),
    ("password=hunter2 user=bob", "password=*** user=bob"),
    ('{"password": "two words", "vm": "web-1"}', '{"password": "***", "vm": "web-1"}'),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
    ("sent Bearer xyz.abc-123 upstream", "sent Bearer *** upstream"),
    ("https://admin:pa55@vc1.example/sdk", "https://admin:***@vc1.example/sdk"),
    ("sig=QWxhZGRpbjpvcGVuIHNlc2FtZQ0123456789 ok", "sig=*** ok"),
    ("api_key: 0123456789abcdef0123456789abcdef", "api_key: ***"),
    ('body was {\\"password\\": \\"p w\\", \\"vm\\": 1}',
     'body was {\\"password\\": \\"***\\", \\"vm\\": 1}'),
    ("key: -----BEGIN RSA PRIVATE KEY-----\nMIIEow\nIBAAK=\n-----END RSA PRIVATE KEY----- end",
     "key: -----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY----- end"),
    ("cut -----BEGIN PRIVATE KEY-----\nMIIEow",
     "cut -----BEGIN PRIVATE KEY-----***-----END PRIVATE KEY-----"),
    ("license_key=AAAAA-BBBBB-CCCCC-DDDDD-EEEEE", "license_key=***"),
    ("vm=web-1 state=poweredOn moid=vm-42", "vm=web-1 state=poweredOn moid=vm-42"),
    ("phase token_created for ops", "phase token_created for ops"),
])
def test_credential_shaped_text_is_masked(text: str, expected: str) -> None:
    assert redact_text(text) == expected


_PEM = "-----BEGIN PRIVATE KEY-----"


@pytest.mark.parametrize(("shape", "expected"), [
    *[(text, text) for text in ("x" * 300_000, "a." * 150_000, "a:" * 150_000, 'a"=' * 100_000,
                                "http://" + "a" * 300_000, "a" * 150_000 + " " * 150_000)],
    (_PEM * 10_000, f"{_PEM}***-----END PRIVATE KEY-----" * 10_000),
])
def test_redaction_of_long_adversarial_text_completes(shape: str, expected: str) -> None:
    # Quadratic backtracking here would stall every append (pytest-timeout fails the test then).
    assert redact_text(shape) == expected


def test_no_secret_reaches_the_file(sink: AuditSink, path: Path) -> None:
    secrets = ["Zm9vYmFyYmF6cXV4MTIz", "hunter2", "s3cr3tvalue"]
    row = sink.write({
        "phase": "failed", "error_code": "auth_failed",
        "error": f"login with gwt_abc123_{secrets[0]} failed",
        "args": {"target": "vc1", "options": {"password": secrets[1]}, "note": f"token={secrets[2]}"},
    })
    raw = path.read_text()
    assert not [s for s in secrets if s in raw]
    assert row["error"] == "login with gwt_abc123_*** failed"


def test_a_result_is_stored_as_digest_and_size(sink: AuditSink, path: Path) -> None:
    result = [{"name": f"vm-{i}", "power": "on", "password": "never-stored", "note": "ü"}
              for i in range(5000)]
    # the answer text the caller receives: compact, UTF-8, keys in the tool's order
    canonical = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()

    row = sink.write({"phase": "call", "tool": "list_vms", "result": result})

    assert "result" not in row
    assert row["result_digest"] == hashlib.sha256(canonical).hexdigest()
    assert row["result_size"] == len(canonical)
    assert path.stat().st_size < 1000 and b"never-stored" not in path.read_bytes()


# -- failures ---------------------------------------------------------------------------------------

def _directory(tmp_path: Path) -> Path:
    target = tmp_path / "audit.jsonl"
    target.mkdir()
    return target


def _under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "plain").write_text("")
    return tmp_path / "plain" / "logs" / "audit.jsonl"


def _device(tmp_path: Path) -> Path:
    # /dev/null would accept every row and keep none: a device must be refused, not written to.
    link = tmp_path / "audit.jsonl"
    link.symlink_to(os.devnull)
    return link


@pytest.mark.parametrize(("make_path", "why"), [
    pytest.param(_directory, "EISDIR", id="path-is-a-directory"),
    pytest.param(_under_a_file, "ENOTDIR", id="parent-is-a-file"),
    pytest.param(_device, "not a regular file", id="device-dev-null"),
])
def test_an_unwritable_log_raises_audit_unavailable(
        tmp_path: Path, make_path: Callable[[Path], Path], why: str) -> None:
    target = make_path(tmp_path)
    with AuditSink(target) as broken:
        assert broken.writable() is False
        with pytest.raises(AuditUnavailable) as caught:
            broken.write({"phase": "call"})
    message = caught.value.message
    assert str(target) in message and why in message and "fix:" in message
    assert caught.value.code == "audit_unavailable"


_FILL_UP = """
import json, resource, signal, sys
from pathlib import Path
from gateway.errors import AuditUnavailable
from gateway.audit.file_sink import AuditSink
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
sink = AuditSink(Path(sys.argv[1]))
written = 0
try:
    while True:
        sink.write({"phase": "call", "args": {"note": "x" * 300}})
        written += 1
except AuditUnavailable as exc:
    print(json.dumps({"written": written, "message": exc.message}))
"""


def test_a_write_cut_short_by_a_full_file_leaves_no_partial_line(path: Path) -> None:
    # RLIMIT_FSIZE makes the kernel cut a write short and then fail it, as a full disk does; unlike
    # permission bits it also binds root.
    child = subprocess.run([sys.executable, "-c", _FILL_UP, str(path), "3000"], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    outcome = json.loads(child.stdout)
    assert "EFBIG" in outcome["message"] and str(path) in outcome["message"]
    report = verify(path)
    assert report.ok and report.rows == outcome["written"] > 0
    assert path.read_bytes().endswith(b"\n")


def test_a_closed_sink_refuses_writes(path: Path) -> None:
    sink = AuditSink(path, durable=False)
    sink.write({"phase": "call"})
    sink.close()
    sink.close()
    assert sink.writable() is False
    with pytest.raises(AuditUnavailable, match="closed"):
        sink.write({"phase": "call"})


def test_writable_creates_the_directory_and_reports_true(tmp_path: Path) -> None:
    target = tmp_path / "new" / "audit.jsonl"
    with AuditSink(target) as fresh:
        assert fresh.writable() is True
    assert target.parent.is_dir()


def test_a_log_replaced_under_a_running_writer_shows_as_a_gap(sink: AuditSink, path: Path) -> None:
    write_calls(sink, 3)
    path.unlink()
    row = sink.write({"phase": "call"})
    assert row["seq"] == 4
    broken = verify(path).first_broken_line
    assert broken is not None and (broken.line, broken.reason) == (1, "seq_gap")


# -- concurrency ------------------------------------------------------------------------------------

_APPENDER = """
import sys
from pathlib import Path
from gateway.audit.file_sink import AuditSink
path, name, count, max_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sink = AuditSink(Path(path), max_bytes=max_bytes, keep=1000)
print("ready", flush=True)
sys.stdin.read(1)
for i in range(count):
    sink.write({"phase": "call", "caller": name, "args": {"i": i, "pad": "y" * 100}})
sink.close()
"""


def run_appenders(path: Path, count: int, max_bytes: int,
                  meanwhile: Callable[[], None] = lambda: None) -> None:
    """Two processes append ``count`` rows each, released together once both are ready; ``meanwhile``
    runs repeatedly until both are done."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", _APPENDER, str(path)]
    children = [subprocess.Popen([*argv, name, str(count), str(max_bytes)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env) for name in ("a", "b")]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("g")
            child.stdin.close()
        deadline = time.monotonic() + 120
        while any(child.poll() is None for child in children) and time.monotonic() < deadline:
            meanwhile()
        assert [child.wait(timeout=120) for child in children] == [0, 0]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()


def assert_appenders_chained(path: Path, count: int) -> list[dict[str, Any]]:
    report = verify(path)
    assert report.ok, report.first_broken_line
    rows = read_rows(path)
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    for name in ("a", "b"):
        assert [r["args"]["i"] for r in rows if r.get("caller") == name] == list(range(count))
    return rows


def test_two_processes_appending_at_once_keep_one_chain(path: Path) -> None:
    run_appenders(path, 200, 50 * 1024 * 1024)
    rows = assert_appenders_chained(path, 200)
    assert len(rows) == 400


def test_two_processes_rotating_at_once_keep_one_chain(path: Path) -> None:
    reports: list[VerifyReport] = []
    run_appenders(path, 150, 8 * 1024, meanwhile=lambda: reports.append(verify(path)))
    # verify reads a consistent snapshot: appends and rotations under way never look like damage
    assert reports and [r for r in reports if not r.ok] == []
    rows = assert_appenders_chained(path, 150)
    files = log_files(path)
    assert len(files) > 5
    assert len([r for r in rows if r["phase"] == ROTATED_PHASE]) == len(files) - 1
    assert all(f.stat().st_size <= 8 * 1024 for f in files)


def test_threads_and_two_sinks_in_one_process_keep_one_chain(path: Path) -> None:
    sinks = [AuditSink(path, durable=False), AuditSink(path, durable=False)]
    start = threading.Barrier(4)

    def append(sink: AuditSink, name: str) -> None:
        start.wait(timeout=30)
        for i in range(50):
            sink.write({"phase": "call", "caller": name, "args": {"i": i}})

    threads = [threading.Thread(target=append, args=(sinks[n % 2], f"t{n}")) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for sink in sinks:
        sink.close()
    assert verify(path).ok
    assert [r["seq"] for r in read_rows(path)] == list(range(1, 201))


def test_a_writer_sees_rows_another_writer_appended(path: Path) -> None:
    with AuditSink(path, durable=False) as one, AuditSink(path, durable=False) as two:
        seqs = [(one if i % 2 else two).write({"phase": "call"})["seq"] for i in range(6)]
    assert seqs == [1, 2, 3, 4, 5, 6] and verify(path).ok


# -- rotation ---------------------------------------------------------------------------------------

def test_rotation_continues_the_chain_across_files(path: Path) -> None:
    with AuditSink(path, durable=False, max_bytes=1500, keep=50) as rotating:
        write_calls(rotating, 30)
    files = log_files(path)
    assert files[-1] == path and files[0].name == f"{path.name}.{len(files) - 1}" and len(files) > 3
    assert all(f.stat().st_size <= 1500 for f in files)
    for older, newer in itertools.pairwise(files):
        last = json.loads(lines_of(older)[-1])
        first = json.loads(lines_of(newer)[0])
        assert first["phase"] == ROTATED_PHASE
        assert (first["seq"], first["prev"]) == (last["seq"] + 1, last["hash"])
    report = verify(path)
    assert report.ok and report.first_seq == 1 and not report.starts_after_rotation
    assert len([r for r in read_rows(path) if r["phase"] == "call"]) == 30


def test_rotation_keeps_n_files_and_verify_starts_at_the_marker(path: Path) -> None:
    with AuditSink(path, durable=False, max_bytes=1500, keep=3, retain_seconds=0) as rotating:
        write_calls(rotating, 40)
    names = [f"{path.name}.3", f"{path.name}.2", f"{path.name}.1", path.name]
    assert [f.name for f in log_files(path)] == names
    report = verify(path)
    assert report.ok and report.starts_after_rotation
    assert report.first_seq is not None and report.first_seq > 1


def test_a_removed_middle_file_breaks_the_chain(path: Path) -> None:
    with AuditSink(path, durable=False, max_bytes=1500, keep=50) as rotating:
        write_calls(rotating, 30)
    path.with_name(f"{path.name}.2").unlink()
    broken = verify(path).first_broken_line
    assert broken is not None
    assert (broken.file, broken.line, broken.reason) == (path.with_name(f"{path.name}.1"), 1, "seq_gap")


def test_a_crash_between_rename_and_marker_is_completed_by_the_next_write(path: Path) -> None:
    with AuditSink(path, durable=False) as first:
        last = write_calls(first, 3)[-1]
    path.rename(path.with_name(f"{path.name}.1"))
    with AuditSink(path, durable=False) as second:
        second.write({"phase": "call"})
    marker = read_rows(path)[3]
    assert marker["phase"] == ROTATED_PHASE and marker["prev"] == last["hash"]
    assert verify(path).ok and verify(path).rows == 5


# -- reading ----------------------------------------------------------------------------------------

@pytest.fixture
def history(sink: AuditSink) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"phase": "call", "tool": "list_vms", "target": "vc1", "caller": "ops", "correlation_id": "c1"},
        {"phase": "proposed", "tool": "delete_vm", "target": "vc1", "caller": "ops", "correlation_id": "c2"},
        {"phase": "denied", "tool": "delete_vm", "target": "vc2", "caller": "bot", "correlation_id": "c3",
         "decision": {"allowed": False, "reason": "protected", "rule": "protect-prod"}},
        {"phase": "executed", "tool": "delete_vm", "target": "vc1", "caller": "ops", "correlation_id": "c2",
         "outcome": "ok"},
        {"phase": "failed", "tool": "power_on", "target": "vc2", "caller": "bot", "outcome": "error",
         "error_code": "timeout"},
        {"phase": "token_created", "caller": "admin", "surface": "cli"},
    ]
    return [sink.write(e) for e in events]


@pytest.mark.parametrize(("filters", "seqs"), [
    ({}, [1, 2, 3, 4, 5, 6]),
    ({"last": 2}, [5, 6]),
    ({"target": "vc1"}, [1, 2, 4]),
    ({"tool": "delete_vm"}, [2, 3, 4]),
    ({"phase": "denied"}, [3]),
    ({"caller": "bot"}, [3, 5]),
    ({"correlation_id": "c2"}, [2, 4]),
    ({"target": "vc1", "tool": "delete_vm", "last": 1}, [4]),
    ({"since": T0 + timedelta(minutes=2)}, [3, 4, 5, 6]),
    ({"until": T0 + timedelta(minutes=1)}, [1, 2]),
    ({"since": datetime(2026, 3, 28, 12, 1), "until": datetime(2026, 3, 28, 12, 3)}, [2, 3, 4]),
    ({"caller": "nobody"}, []),
    ({"last": 0}, []),
])
def test_read_rows_filters(history: list[dict[str, Any]], path: Path, filters: dict[str, Any],
                           seqs: list[int]) -> None:
    assert [r["seq"] for r in read_rows(path, **filters)] == seqs


def test_read_rows_spans_rotated_files_in_order_and_skips_junk(path: Path) -> None:
    with AuditSink(path, durable=False, max_bytes=1500, keep=50) as rotating:
        write_calls(rotating, 20)
    with path.open("ab") as handle:
        handle.write(b"junk\n{\"torn")
    calls = read_rows(path, phase="call")
    assert [r["args"]["name"] for r in calls] == [f"web-{i}" for i in range(20)]
    newest = read_rows(path, phase="call", last=3)
    assert [r["args"]["name"] for r in newest] == ["web-17", "web-18", "web-19"]


def test_read_rows_of_a_missing_log_is_empty(tmp_path: Path) -> None:
    assert read_rows(tmp_path / "none.jsonl") == []
    assert verify(tmp_path / "none.jsonl").files == ()


def test_stats_counts_by_field(history: list[dict[str, Any]], path: Path) -> None:
    summary = stats(path)
    assert summary["rows"] == 6
    assert summary["by_phase"] == {"call": 1, "proposed": 1, "denied": 1, "executed": 1, "failed": 1,
                                   "token_created": 1}
    assert summary["by_tool"] == {"delete_vm": 3, "list_vms": 1, "power_on": 1}
    assert next(iter(summary["by_tool"])) == "delete_vm"
    assert summary["by_target"] == {"vc1": 3, "vc2": 2}
    assert summary["by_caller"] == {"ops": 3, "bot": 2, "admin": 1}
    assert summary["by_outcome"] == {"ok": 1, "error": 1}
    assert (summary["first_ts"], summary["last_ts"]) == (history[0]["ts"], history[-1]["ts"])


def test_stats_since(history: list[dict[str, Any]], path: Path) -> None:
    summary = stats(path, since=T0 + timedelta(minutes=4))
    assert summary["rows"] == 2 and summary["by_caller"] == {"bot": 1, "admin": 1}
    assert re.fullmatch(r"2026-03-28T12:04:00\.000Z", summary["since"])


# -- bounded in time: a held lock never stalls a writer forever --------------------------------------

_LOCK_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_lock_held_by_another_process_fails_the_write_within_its_deadline(path: Path) -> None:
    lock_file = path.with_name(path.name + ".lock")
    holder = subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, str(lock_file)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    outcome: list[BaseException | dict[str, Any]] = []
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        sink = AuditSink(path, durable=False, lock_timeout=0.5)

        def write() -> None:
            try:
                outcome.append(sink.write({"phase": "call", "tool": "power_on_vm"}))
            except BaseException as exc:
                outcome.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(timeout=30)  # far past the 0.5 s deadline: only a write that never returns fails here
        assert not writer.is_alive(), "write() still blocked on the held lock after 30 s"
        assert len(outcome) == 1 and isinstance(outcome[0], AuditUnavailable)
        assert outcome[0].code == "audit_unavailable"
        assert str(lock_file) in outcome[0].message and "lock" in outcome[0].message
        assert not path.exists() or path.read_bytes() == b""
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        assert holder.stdout is not None
        holder.stdout.close()
    # once the other process lets go, the same sink writes again
    assert sink.write({"phase": "call"})["seq"] == 1
    sink.close()


def test_the_default_lock_deadline_is_bounded(path: Path) -> None:
    sink = AuditSink(path, durable=False)
    assert 0 < sink.lock_timeout <= 10
    sink.close()


# -- bounded in size: no caller can write a huge row --------------------------------------------------

def test_a_500_kb_target_name_is_stored_in_a_few_hundred_bytes(sink: AuditSink, path: Path) -> None:
    huge = "vm-" + "x" * 500_000
    row = sink.write({"phase": "call", "tool": "power_on_vm", "target": huge,
                      "args": {"vm": huge, "target": huge}})
    line = path.read_bytes()
    assert len(line) < 2_000, len(line)
    digest = hashlib.sha256(huge.encode()).hexdigest()
    assert row["target"]["size"] == len(huge.encode()) and row["target"]["sha256"] == digest
    assert row["target"]["cut"].startswith("vm-xxx")
    assert row["args"]["vm"]["sha256"] == digest
    assert verify(path).ok


def test_containers_are_bounded_in_items_and_depth(sink: AuditSink) -> None:
    nested: Any = "leaf"
    for _ in range(100):
        nested = {"n": nested}
    row = sink.write({"phase": "call", "args": {"vms": [f"vm-{i}" for i in range(5_000)],
                                                "map": {f"k{i}": i for i in range(5_000)}, "deep": nested}})
    vms = row["args"]["vms"]
    assert len(vms) <= 101 and vms[-1] == {"more_items": 5_000 - (len(vms) - 1)}
    assert len(row["args"]["map"]) <= 101 and "more_items" in row["args"]["map"]
    depth, node = 0, row["args"]["deep"]
    while isinstance(node, dict) and "n" in node:
        node, depth = node["n"], depth + 1
    assert depth < 20
    assert len(canonical_json(row)) < 20_000


def test_short_values_are_stored_unchanged(sink: AuditSink) -> None:
    args = {"vm": "web-1", "cpus": 4, "tags": ["a", "b"], "spec": {"memory_mb": 2048}}
    assert sink.write({"phase": "call", "args": args})["args"] == args


# -- honest retention ---------------------------------------------------------------------------------

def test_a_flood_of_reader_rows_cannot_rotate_a_young_admin_row_away(path: Path) -> None:
    with AuditSink(path, durable=False, max_bytes=2_000, keep=2) as sink:
        sink.write({"phase": "call", "caller": "admin", "tool": "power_off_vm", "target": "vc1"})
        for i in range(30):
            sink.write({"phase": "call", "caller": "reader", "tool": "list_vms",
                        "args": {"target": "x" * 500_000, "i": i}})
        counters = sink.stats()
    assert [r["tool"] for r in read_rows(path, caller="admin")] == ["power_off_vm"]
    assert counters["files_dropped"] == 0 and counters["files_kept_over_budget"] > 0
    assert counters["rotations"] == len(log_files(path)) - 1 and counters["rows_written"] == 31
    report = verify(path)
    assert report.ok and report.first_seq == 1


def test_retention_drops_old_files_loudly_and_counts_them(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ticking_clock(step=timedelta(hours=1))
    with AuditSink(path, durable=False, max_bytes=1500, keep=3, retain_seconds=3600 * 4,
                   clock=clock) as sink:
        write_calls(sink, 40)
        counters = sink.stats()
    drops = [r for r in caplog.records if "AUDIT RETENTION: dropping" in r.getMessage()]
    assert counters["files_dropped"] == len(drops) > 0
    markers = [r for r in read_rows(path) if r["phase"] == ROTATED_PHASE and r.get("dropped")]
    recorded = [d for m in markers for d in m["dropped"]]
    assert recorded and all(d["rows"] > 0 and d["first_seq"] <= d["last_seq"] for d in recorded)
    report = verify(path)
    assert report.ok and report.starts_after_rotation
    # every row ever written is either still on disk or counted as dropped
    assert report.last_seq is not None and counters["rows_dropped"] == report.last_seq - report.rows
    assert len(log_files(path)) <= 4


def test_retention_by_age_drops_files_older_than_max_age_even_within_the_budget(path: Path) -> None:
    clock = ticking_clock(step=timedelta(days=1))
    with AuditSink(path, durable=False, max_bytes=1500, keep=100, retain_seconds=0,
                   max_age_seconds=5 * 86400, clock=clock) as sink:
        write_calls(sink, 40)
        assert sink.stats()["files_dropped"] > 0
    oldest = read_rows(path)[0]
    assert oldest["phase"] == ROTATED_PHASE and verify(path).ok


def test_stats_count_rows_rotations_and_bytes(path: Path) -> None:
    with AuditSink(path, durable=False, max_bytes=1500, keep=50) as sink:
        assert sink.stats()["rows_written"] == 0
        write_calls(sink, 20)
        counters = sink.stats()
    assert counters["rows_written"] == 20
    assert counters["rotations"] == len(log_files(path)) - 1 > 0
    assert counters["bytes"] == sum(f.stat().st_size for f in log_files(path))


# -- checkpoints: a signed head detects a cut tail and a rewritten history --------------------------


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    return tmp_path / "state" / "audit-signing.key"


def checkpointed_log(path: Path, key_file: Path, rows: int = 12) -> list[dict[str, Any]]:
    with AuditSink(path, durable=False, key_file=key_file, checkpoint_rows=5) as sink:
        written = write_calls(sink, rows)
    return written


def _rechain(lines: list[bytes], edit: Callable[[dict[str, Any]], None]) -> list[bytes]:
    """Rewrite every row consistently (as a forger with the file would): edit, re-link, re-hash."""
    out: list[bytes] = []
    prev = GENESIS
    for raw in lines:
        row = json.loads(raw)
        edit(row)
        row["prev"] = prev
        row["hash"] = row_hash(row)
        prev = row["hash"]
        out.append(json.dumps(row).encode() + b"\n")
    return out


def test_an_intact_log_passes_the_checkpoint_check(path: Path, key_file: Path) -> None:
    checkpointed_log(path, key_file)
    report = verify(path, checkpoints=True)
    assert report.ok and report.checkpoint is not None
    assert report.checkpoint.checked == 3 and report.checkpoint.last_seq == 12  # seq 5, 10, and on close 12
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_a_cut_tail_is_detected_by_the_checkpoint(path: Path, key_file: Path) -> None:
    checkpointed_log(path, key_file)
    lines = lines_of(path)
    path.write_bytes(b"".join(lines[:-3]))
    assert verify(path).ok  # the chain alone cannot tell
    report = verify(path, checkpoints=True)
    assert not report.ok and report.checkpoint is not None
    fault = report.checkpoint.first_fault
    assert fault is not None and fault.reason == "cut_tail" and "ends at seq 9" in fault.detail


def test_a_rewritten_history_is_detected_by_the_checkpoint(path: Path, key_file: Path) -> None:
    checkpointed_log(path, key_file)

    def hide(row: dict[str, Any]) -> None:
        if row.get("seq") == 3:
            row["caller"] = "someone-else"

    path.write_bytes(b"".join(_rechain(lines_of(path), hide)))
    assert verify(path).ok  # consistently re-hashed: the chain alone cannot tell
    report = verify(path, checkpoints=True)
    assert not report.ok and report.checkpoint is not None
    fault = report.checkpoint.first_fault
    assert fault is not None and fault.reason == "rewritten"


@pytest.mark.parametrize("damage", ["edit_signed_seq", "missing_file", "other_key"])
def test_forged_or_missing_checkpoints_fail(path: Path, key_file: Path, tmp_path: Path, damage: str) -> None:
    checkpointed_log(path, key_file)
    cp = checkpoint_path(path)
    pinned = None
    if damage == "edit_signed_seq":
        entries = [json.loads(line) for line in cp.read_text().splitlines()]
        entries[-1]["seq"] = 7
        cp.write_text("".join(json.dumps(e) + "\n" for e in entries))
    elif damage == "missing_file":
        cp.unlink()
    else:
        pinned = load_or_create_signing_key(tmp_path / "other.key").public_key()
    report = verify(path, checkpoints=True, public_key=pinned)
    assert not report.ok and report.checkpoint is not None and report.checkpoint.first_fault is not None
    assert report.checkpoint.first_fault.reason == {"edit_signed_seq": "bad_signature",
                                                    "missing_file": "missing",
                                                    "other_key": "key_mismatch"}[damage]


def test_checkpoints_survive_rotation_and_retention(path: Path, key_file: Path) -> None:
    with AuditSink(path, durable=False, max_bytes=1500, keep=2, retain_seconds=0, key_file=key_file,
                   checkpoint_rows=1000) as sink:
        write_calls(sink, 40)
        assert sink.stats()["checkpoints"] >= sink.stats()["rotations"] > 0
    report = verify(path, checkpoints=True)
    assert report.ok and report.checkpoint is not None
    assert report.checkpoint.skipped > 0 and report.checkpoint.checked > 0


def test_the_signing_key_is_made_once_and_reused(key_file: Path) -> None:
    first = public_key_text(load_or_create_signing_key(key_file).public_key())
    assert public_key_text(load_or_create_signing_key(key_file).public_key()) == first
    assert first.startswith("ed25519:") and len(first) == len("ed25519:") + 64
    key_file.chmod(0o644)
    with pytest.raises(AuditUnavailable, match="chmod 600"):
        load_or_create_signing_key(key_file)
    key_file.write_text("not a key")
    key_file.chmod(0o600)
    with pytest.raises(AuditUnavailable, match="cannot be read as a private key"):
        load_or_create_signing_key(key_file)


# -- redaction by shape: secrets without a key name -----------------------------------------------------

_AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
_SSH_RSA = "AAAAB3NzaC1yc2EAAAADAQABAAABAQC7vbqajDhA8x9Kq3dL0F1wXW0lG5c2mYp"
_JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk"


@pytest.mark.parametrize(("text", "expected"), [
    (f"creds AKIAIOSFODNN7EXAMPLE {_AWS_SECRET} end", "creds AKIA*** *** end"),
    (f"aws secret {_AWS_SECRET}", "aws secret ***"),
    ("session ASIAY34FZKBOKMUTVV7A here", "session ASIA*** here"),
    (f"key ssh-rsa {_SSH_RSA} ops@host", "key ssh-rsa *** ops@host"),
    ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me",
     "ssh-ed25519 *** me"),
    ("confirm with gwc_Q2xvbmUgdGhlIFZNIG5vdyBwbGVhc2U now", "confirm with gwc_*** now"),
    ("clone from https://admin:pa55@vc1.example/sdk", "clone from https://admin:***@vc1.example/sdk"),
    ("the root pw is hunter2, call me", "the root pw is ***, call me"),
    ("password is Tr0ub4dor&3 ok", "password is *** ok"),
    ("pw: hunter2", "pw: ***"),
    (f"Authorization header {_JWT} seen", "Authorization header *** seen"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789 pushed", "token *** pushed"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123 x", "*** x"),
    ("slack xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx ok", "slack *** ok"),
    # not secrets: ids, hashes, names and prose stay readable
    ("vm=web-1 moid=vm-42 uuid=4203f1c2-9d0e-4b7f-8a1b-2c3d4e5f6a7b", None),
    ("sha1 da39a3ee5e6b4b0d3255bfef95601890afd80709 and " + "ab" * 32, None),
    ("the VM DC0_C0_RP0_VM0 is poweredOn on host DC0_C0_H0", None),
    ("the password field is required", "the password field is required"),
])
def test_secrets_are_masked_by_their_shape(text: str, expected: str | None) -> None:
    assert redact_text(text) == (text if expected is None else expected)


def test_shaped_secrets_in_values_are_masked_in_rows(sink: AuditSink, path: Path) -> None:
    sink.write({"phase": "call", "tool": "clone_vm",
                "args": {"vm": "web", "notes": f"use AKIAIOSFODNN7EXAMPLE / {_AWS_SECRET}",
                         "extra": [f"ssh-rsa {_SSH_RSA}", "root pw is hunter2"]}})
    text = path.read_text()
    for secret in ("AKIAIOSFODNN7EXAMPLE", _AWS_SECRET, _SSH_RSA, "hunter2"):
        assert secret not in text


_CIDS = ["0123456789abcdef0123456789abcdef", "4bf92f3577b34da6a3ce929d0e0e4736",
         "req-2026-11-30T21:00:00Z-ABCDEFabcdef0123456789xyzXYZ01234"]


@pytest.mark.parametrize("cid", _CIDS)
def test_correlation_ids_are_never_masked(cid: str) -> None:
    access = f"127.0.0.1 POST /mcp 200 3.1ms cid={cid} caller=ops"
    assert redact_text(access) == access
    for header in (f"X-Request-ID: {cid}", f"x-correlation-id={cid}", f'"correlation_id": "{cid}"'):
        assert redact_text(header) == header
    assert redact({"correlation_id": cid, "headers": {"X-Request-ID": cid}}) == {
        "correlation_id": cid, "headers": {"X-Request-ID": cid}}


def test_the_access_log_line_keeps_its_correlation_id() -> None:
    import io
    import logging

    from gateway.logs import RedactingTextFormatter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingTextFormatter())
    access = logging.getLogger("gateway.access.test")
    access.addHandler(handler)
    access.propagate = False
    try:
        access.warning("%s %s %s %d %.1fms cid=%s caller=%s", "127.0.0.1", "POST", "/mcp", 200, 3.1,
                       _CIDS[0], "ops")
    finally:
        access.removeHandler(handler)
    assert f"cid={_CIDS[0]} caller=ops" in stream.getvalue()


def test_the_gateways_sink_signs_with_the_key_in_its_state_directory(tmp_path: Path) -> None:
    from gateway.settings import Settings

    settings = Settings.from_env({}, home=str(tmp_path / "home"))
    with AuditSink.for_settings(settings, durable=False) as sink:
        write_calls(sink, 3)
    key = settings.home / "audit-signing.key"
    assert key.stat().st_mode & 0o777 == 0o600
    report = verify(settings.audit_log, checkpoints=True,
                    public_key=load_or_create_signing_key(key).public_key())
    assert report.ok and report.checkpoint is not None and report.checkpoint.last_seq == 3


def test_the_running_servers_access_log_shows_correlation_ids(sim_vc1: Any, tmp_path: Path) -> None:
    """End to end: `gateway serve --transport https` logs the request id a client sent, unmasked."""
    import ssl

    import httpx2
    from support.httpserver import run_serve
    from support.simulator import wait_until, write_targets

    from gateway.server.edge.tls import create_certificate
    from gateway.store.sqlite import SqliteStore

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim_vc1})
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml")})
    from gateway.auth.tokens import create_token

    with SqliteStore(home / "state.db") as store:
        create_token(store, "ops", "admin", expires_in=None, now=time.time())
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    command = run_serve(tmp_path, env, "--transport", "https", "--cert", str(cert.cert), "--key",
                        str(cert.key), "--public-name", "localhost", "--host", "127.0.0.1", "--port", "0")
    cid = "4bf92f3577b34da6a3ce929d0e0e4736"
    try:
        found = wait_until(lambda: command.process.poll() is not None or
                           re.search(r"running on https://127\.0\.0\.1:(\d+)", command.output()), timeout=60,
                           what="gateway serve to listen")
        assert isinstance(found, re.Match), command.output()
        before = command.output().count("GET /mcp 401")
        with httpx2.Client(verify=ssl.create_default_context(cafile=str(cert.cert)), timeout=30) as http:
            answer = http.get(f"https://localhost:{found.group(1)}/mcp", headers={"X-Request-ID": cid})
        assert answer.status_code == 401 and answer.headers["x-correlation-id"] == cid
        wait_until(lambda: command.output().count("GET /mcp 401") >= 1 + before, timeout=30,
                   what="the access log line of our request")
    finally:
        command.stop()
    access = [x for x in command.output().splitlines() if "gateway.access" in x]
    assert any("GET /mcp 401" in x and f"cid={cid}" in x for x in access), access
    assert not [x for x in access if "cid=***" in x]


def test_a_failing_checkpoint_never_fails_the_row_it_follows(path: Path, key_file: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    load_or_create_signing_key(key_file)
    key_file.chmod(0o644)  # refused for signing: anyone could read it
    with AuditSink(path, durable=False, key_file=key_file, checkpoint_rows=2) as sink:
        rows = write_calls(sink, 4)
        counters = sink.stats()
    assert [r["seq"] for r in read_rows(path)] == [r["seq"] for r in rows] == [1, 2, 3, 4]
    assert counters["checkpoint_failures"] >= 2 and counters["checkpoints"] == 0
    assert any("chmod 600" in r.getMessage() for r in caplog.records)


def test_two_writers_signing_one_log_keep_consistent_checkpoints(path: Path, key_file: Path) -> None:
    with AuditSink(path, durable=False, key_file=key_file, checkpoint_rows=3) as one, \
            AuditSink(path, durable=False, key_file=key_file, checkpoint_rows=3, max_bytes=2_000) as two:
        for i in range(30):
            (one if i % 3 else two).write({"phase": "call", "args": {"i": i}})
    report = verify(path, checkpoints=True)
    assert report.ok, report.checkpoint
    assert report.checkpoint is not None and report.checkpoint.checked + report.checkpoint.skipped >= 10


def test_checkpoints_also_come_by_time(path: Path, key_file: Path) -> None:
    # checkpoint_seconds=0: every write is at least that long after the previous checkpoint
    with AuditSink(path, durable=False, key_file=key_file, checkpoint_rows=1000,
                   checkpoint_seconds=0) as sink:
        write_calls(sink, 3)
        assert sink.stats()["checkpoints"] == 3
    with AuditSink(path, durable=False, key_file=key_file, checkpoint_rows=1000) as sink:
        write_calls(sink, 3)
        assert sink.stats()["checkpoints"] == 0  # neither 1000 rows nor 5 minutes yet
    assert sink.stats()["checkpoints"] == 1  # the closing one
    assert verify(path, checkpoints=True).ok


@pytest.mark.parametrize(("value", "expected"), [
    ("gwt_abc123_Zm9vYmFyYmF6cXV4MTIz", "gwt_abc123_***"),
    ("gwc_Q2xvbmUgdGhlIFZNIG5vdyBwbGVhc2U", "gwc_***"),
    ("AKIAIOSFODNN7EXAMPLE", "AKIA***"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "***"),
])
def test_a_token_passed_off_as_a_correlation_id_is_still_masked(value: str, expected: str) -> None:
    # Correlation ids are never masked, but a well-known token format is a token wherever it appears.
    assert redact_text(f"GET /mcp 401 cid={value} caller=-") == f"GET /mcp 401 cid={expected} caller=-"
    assert redact_text(f"X-Request-ID: {value}") == f"X-Request-ID: {expected}"
    assert redact({"correlation_id": value}) == {"correlation_id": expected}


# -- metrics: the sink's counters as Prometheus families ----------------------------------------------

def test_the_sinks_counters_are_prometheus_families(path: Path) -> None:
    from gateway.audit.metrics import audit_families
    from gateway.server.base.metrics import Metrics

    metrics = Metrics()
    with AuditSink(path, durable=False, max_bytes=1500, keep=2, retain_seconds=0) as sink:
        metrics.add_collector("audit", lambda: audit_families(sink))
        write_calls(sink, 30)
        counters = sink.stats()
        text = metrics.render()
    assert f"gateway_audit_rows_written_total {float(counters['rows_written'])}" in text
    assert f"gateway_audit_rotations_total {float(counters['rotations'])}" in text
    assert f"gateway_audit_files_dropped_total {float(counters['files_dropped'])}" in text
    assert counters["files_dropped"] > 0
    assert f"gateway_audit_bytes {float(counters['bytes'])}" in text
    assert "gateway_audit_lock_timeouts_total 0.0" in text


def test_a_sink_without_counters_adds_no_family() -> None:
    from gateway.audit.metrics import audit_families

    assert audit_families(None) == [] and audit_families(object()) == []


@pytest.mark.anyio
async def test_the_servers_metrics_show_the_audit_counters(sim_vc1: Any, tmp_path: Path) -> None:
    from support.httpserver import real_gateway, serve

    running = serve(tmp_path, real_gateway(sim_vc1, tmp_path))
    try:
        running.gateway.audit.write({"phase": "call", "tool": "list_vms"})
        async with running.http(running.tokens["alice"]) as http:
            answer = await http.get("/metrics")
        assert answer.status_code == 200
        assert "gateway_audit_rows_written_total" in answer.text
        assert "gateway_audit_files_dropped_total 0.0" in answer.text
    finally:
        running.stop()


# -- group commit (write_grouped: the rows of reads) ---------------------------------------------------


class FlushLog:
    """Every ``os.fdatasync`` of this process, by the name of the thread that made it (the real call is
    made: a spy, not a fake)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[str] = []
        real = os.fdatasync

        def recorded(fd: int) -> None:
            self.threads.append(threading.current_thread().name)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", recorded)

    def by(self, name: str) -> int:
        return sum(1 for t in self.threads if t == name)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def test_a_grouped_row_is_in_the_file_at_once_and_flushed_by_the_syncer_not_the_writer(
        path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flushes = FlushLog(monkeypatch)
    with AuditSink(path, durable=True) as sink:
        sink.write({"phase": "call", "tool": "list_vms"})  # opens the log (its directory synced once)
        me = threading.current_thread().name
        mine = flushes.by(me)
        row = sink.write_grouped({"phase": "call", "tool": "list_pending_actions"})
        assert json.loads(lines_of(path)[-1])["hash"] == row["hash"], "in the file when write returns"
        assert flushes.by(me) == mine, "the writer's thread made no flush for the grouped row"
        wait_for(lambda: sink.unsynced() == 0, "the group's flush")
        assert flushes.by("audit-group-commit") >= 1
    assert verify(path).ok


def test_a_durable_row_takes_the_grouped_rows_before_it_to_the_disk(path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with AuditSink(path, durable=True) as sink:
        # the syncer is held back (its flushes recorded, none made) so the rows stay unsynced until
        # the change's row
        held = threading.Event()
        monkeypatch.setattr(sink, "_wake_syncer", held.set)
        for i in range(5):
            sink.write_grouped({"phase": "call", "tool": "list_vms", "n": i})
        assert sink.unsynced() == 5 and held.is_set()
        flushes = FlushLog(monkeypatch)
        sink.write({"phase": "executing", "tool": "power_off_vm"})
        assert sink.unsynced() == 0, "one fdatasync for the change's row and every row before it"
        assert flushes.threads == [threading.current_thread().name]
    assert [r["seq"] for r in map(json.loads, lines_of(path))] == [1, 2, 3, 4, 5, 6]


def test_a_checkpoint_and_close_flush_the_grouped_rows_first(path: Path, key_file: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    sink = AuditSink(path, durable=True, key_file=key_file)
    monkeypatch.setattr(sink, "_wake_syncer", lambda: None)  # no syncer: only checkpoint and close flush
    sink.write_grouped({"phase": "call", "tool": "list_vms"})
    assert sink.unsynced() == 1
    assert sink.checkpoint() is not None
    assert sink.unsynced() == 0, "a checkpoint signs only rows on the disk"
    sink.write_grouped({"phase": "call", "tool": "list_vms"})
    flushes = FlushLog(monkeypatch)
    sink.close()
    assert flushes.threads, "close flushed the grouped row"
    assert sink.unsynced() == 0
    assert verify(path).ok


def test_grouped_rows_from_many_threads_chain_and_reach_the_disk(path: Path) -> None:
    with AuditSink(path, durable=True) as sink:
        def writer(k: int) -> None:
            for i in range(25):
                sink.write_grouped({"phase": "call", "tool": "list_vms", "w": k, "i": i})

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_for(lambda: sink.unsynced() == 0, "every group flushed")
    report = verify(path)
    assert report.ok and report.rows == 100


def test_a_failed_group_flush_is_counted_and_retried_by_the_next_durable_row(
        path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.fdatasync
    failing = threading.Event()
    failing.set()

    def fake_eio_in_the_syncer(fd: int) -> None:  # a disk error no real part produces on demand
        if failing.is_set() and threading.current_thread().name == "audit-group-commit":
            failing.clear()
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fake_eio_in_the_syncer)
    with AuditSink(path, durable=True) as sink:
        sink.write_grouped({"phase": "call", "tool": "list_vms"})
        wait_for(lambda: sink.group_sync_failures == 1, "the failed flush")
        assert sink.unsynced() >= 1, "still owed a flush"
        sink.write({"phase": "executing", "tool": "power_on_vm"})
        assert sink.unsynced() == 0
    assert verify(path).ok


def test_without_durable_a_grouped_row_is_a_plain_row(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flushes = FlushLog(monkeypatch)
    with AuditSink(path, durable=False) as sink:
        sink.write_grouped({"phase": "call", "tool": "list_vms"})
        assert sink.unsynced() == 0 and sink._syncer is None
    assert flushes.threads == []
