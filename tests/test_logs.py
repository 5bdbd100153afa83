"""Log output: JSON lines for pipelines and plain text, both with secrets masked."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.logs import LogWriter, cli_log_level, configure_logging, flush_logs, parse_level

REPO = Path(__file__).resolve().parent.parent
TOKEN = "gwt_abcdefghijkl_" + "S3cr3t" * 7 + "x"
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The root logger writing into a buffer; its handlers and level are restored afterwards."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buffer = io.StringIO()
    try:
        yield buffer
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            if handler not in saved[0]:
                handler.close()
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])


def lines(buffer: io.StringIO) -> list[str]:
    assert flush_logs(), "the log writer wrote what was logged"
    return buffer.getvalue().splitlines()


def test_json_lines_carry_the_fields_and_the_extras(captured: io.StringIO) -> None:
    configure_logging("json", "info", stream=captured)
    logging.getLogger("gateway.test").info("called %s on %s", "list_vms", "vc-1",
                                           extra={"target": "vc-1", "duration_ms": 12.5})
    (line,) = lines(captured)
    event = json.loads(line)
    assert TS.fullmatch(event.pop("ts"))
    assert event == {"level": "INFO", "logger": "gateway.test", "message": "called list_vms on vc-1",
                     "target": "vc-1", "duration_ms": 12.5}


def test_json_lines_never_carry_secrets(captured: io.StringIO) -> None:
    configure_logging("json", "INFO", stream=captured)
    log = logging.getLogger("gateway.test")
    log.warning("client sent Authorization: Bearer %s", TOKEN, extra={"password": "hunter2-pw"})
    try:
        raise ValueError(f"login failed with password=hunter2-pw and {TOKEN}")
    except ValueError:
        log.exception("call failed")
    assert flush_logs()
    output = captured.getvalue()
    assert "hunter2-pw" not in output and "S3cr3t" not in output
    first, second = (json.loads(line) for line in lines(captured))
    assert first["password"] == "***" and first["message"] == "client sent Authorization: Bearer ***"
    assert second["level"] == "ERROR" and "ValueError" in second["exc"]
    assert "gwt_abcdefghijkl_***" in second["exc"]  # a bare token keeps its id, which names it


def test_text_lines_are_masked_too(captured: io.StringIO) -> None:
    configure_logging("text", "DEBUG", stream=captured)
    logging.getLogger("gateway.test").debug("token %s", TOKEN)
    (line,) = lines(captured)
    assert "DEBUG gateway.test: token gwt_abcdefghijkl_" in line and "S3cr3t" not in line


def test_records_below_the_level_are_dropped(captured: io.StringIO) -> None:
    configure_logging("json", "warning", stream=captured)
    log = logging.getLogger("gateway.test")
    log.info("quiet")
    log.warning("loud")
    assert [json.loads(line)["message"] for line in lines(captured)] == ["loud"]


@pytest.mark.parametrize(("fmt", "level", "names"), [
    ("xml", "INFO", "text or json"),
    ("json", "chatty", "DEBUG, INFO, WARNING"),
])
def test_unknown_format_or_level_is_refused_before_anything_changes(
    captured: io.StringIO, fmt: str, level: str, names: str,
) -> None:
    configure_logging("text", "INFO", stream=captured)
    with pytest.raises(ConfigError, match=names):
        configure_logging(fmt, level, stream=io.StringIO())
    logging.getLogger("gateway.test").info("still here")
    assert lines(captured)[-1].endswith("gateway.test: still here")


def test_parse_level_accepts_any_case() -> None:
    assert parse_level(" debug ") == logging.DEBUG and parse_level("ERROR") == logging.ERROR


def test_the_gateway_command_logs_json_lines_when_asked(tmp_path: Path) -> None:
    """End to end: GATEWAY_LOG_FORMAT=json makes the `gateway` command's log lines JSON (the settings
    warning about an unparseable switch is one such line)."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "GATEWAY_HOME": str(tmp_path),
           "GATEWAY_LOG_FORMAT": "json", "GATEWAY_READ_ONLY": "perhaps"}
    done = subprocess.run([sys.executable, "-c", "from gateway.cli import main; raise SystemExit(main())",
                           "token", "list"], env=env, capture_output=True, text=True, timeout=60, check=False)
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert any(e["level"] == "WARNING" and e["logger"] == "gateway.settings"
               and "GATEWAY_READ_ONLY" in e["message"] for e in events), done.stderr


@pytest.mark.parametrize(("command", "verbose", "environ", "level"), [
    ("check", False, {}, None),
    ("policy", False, {}, None),
    ("check", True, {}, "INFO"),
    ("check", False, {"GATEWAY_LOG_LEVEL": "debug"}, "debug"),
    ("pending", False, {"GATEWAY_LOG_FORMAT": "json"}, "INFO"),
    ("serve", False, {}, "INFO"),
    ("serve", False, {"GATEWAY_LOG_LEVEL": "WARNING"}, "WARNING"),
])
def test_cli_commands_log_only_when_asked(command: str, verbose: bool, environ: dict[str, str],
                                          level: str | None) -> None:
    assert cli_log_level(command, verbose, environ) == level


def test_no_level_logs_nothing(captured: io.StringIO) -> None:
    configure_logging("text", None, stream=captured)
    logging.getLogger("gateway.test").critical("not shown")
    assert flush_logs()
    assert captured.getvalue() == ""


def test_a_stalled_stream_never_blocks_a_logging_call_and_every_record_is_written_or_counted() -> None:
    """The stream is a pipe nobody reads: the calls return at once; once the writer's queue is full
    records are dropped and counted, and when the pipe is read again the writer says how many."""
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w", encoding="utf-8")
    target = logging.StreamHandler(stream)
    target.setFormatter(logging.Formatter("%(message)s"))
    writer = LogWriter(target, capacity=10)
    log = logging.getLogger("gateway.test.stalled")
    log.addHandler(writer)
    log.propagate = False
    chunks: list[bytes] = []
    try:
        def flood() -> None:
            for i in range(3000):
                log.warning("record %d %s", i, "x" * 100)

        caller = threading.Thread(target=flood)
        caller.start()
        caller.join(30)
        assert not caller.is_alive(), "a logging call waited on the stalled stream"
        drain = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_end, 65536), b"")))
        drain.start()
        assert writer.flush(), "the writer caught up once the pipe was read"
        log.warning("after")
        writer.close()  # writes what waits, stops the thread
        stream.close()  # the reader sees its end
        drain.join(30)
        assert not drain.is_alive()
    finally:
        log.removeHandler(writer)
        os.close(read_end)
    out = b"".join(chunks).decode().splitlines()
    written = [line for line in out if line.startswith("record ")]
    said = [int(m.group(1)) for line in out if (m := re.match(r"(\d+) log records were dropped", line))]
    assert said and sum(said) + len(written) == 3000, (said, len(written))
    assert out[-1] == "after"
