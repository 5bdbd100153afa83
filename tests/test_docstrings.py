"""Docstrings across ``gateway/`` lead with one line and copy no measured figures (the house style).

What is checked, over every module of ``gateway/`` (read with ``ast``, nothing imported):

- Every module has a docstring whose first line is the whole summary: it is not blank, ends with a
  period, and is followed by a blank line or by nothing (the summary sentence does not wrap).
- Module docstrings average at most ``MAX_AVERAGE_LINES`` lines (``ast.get_docstring``'s text).
- At most ``MAX_TIMED`` docstrings (module, class or function) quote a measured timing. Figures live in
  bench/RESULTS.md; a docstring names the row instead of copying the number.

What counts as a measured timing (``timings``), after ````literal```` spans are removed:

- a duration, a number (or range such as ``17-83``) with ns, µs, us or ms (``4.2 ms``, ``4.2ms``), or
  with s, sec, seconds, min, minutes or hours after a space (so ``401s`` and ``30s`` are not);
  unless a word of configuration sits just before it (default, timeout, deadline, delay, interval,
  every, expiry, lifetime, backoff, retry, at most, up to, after, ...) or just after it (by default,
  apart, doubled, timeout). A measuring verb just before it (took, takes, measured, costs, spent)
  makes it a measurement whatever else is near. So "took 4.2 ms" and "in 130 ms on this machine"
  count; "timeout 30 s", "(5 s by default)" and "samples 20 s apart" do not.
- a ratio: ``2.1x``, ``3x``, "3x faster", "4 times slower" (faster, slower, quicker, cheaper, dearer).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import gateway

PACKAGE = Path(gateway.__file__).resolve().parent
MAX_AVERAGE_LINES = 6.0
MAX_TIMED = 5

_NUMBER = r"\d[\d,]*(?:\.\d+)?(?:\s*[-\u2013]\s*\d[\d,]*(?:\.\d+)?)?"
_DURATION = re.compile(
    rf"(?<![\w.]){_NUMBER}(?:\s*(?:ns|µs|μs|us|ms)|\s+(?:s|secs?|seconds?|min|minutes?|hours?))(?![\w])")
_RATIO = re.compile(
    r"(?<![\w.])(?:\d+\.\d+\s*[x\u00d7]|\d+[x\u00d7])(?![\w])"
    r"|(?<![\w.])\d+(?:\.\d+)?\s*(?:[x\u00d7]|times)\s+(?:faster|slower|quicker|cheaper|dearer)\b", re.I)
_LITERAL = re.compile(r"``.*?``", re.S)
_SETTING = (r"defaults?|timeouts?|deadlines?|delays?|intervals?|every|expiry|expires?|lifetimes?|ttl|"
            r"backoff|retry|retries|wait|waits|at\s+most|up\s+to|after|limit|max(?:imum)?|cap|within")
#: a setting's word right before the figure ("timeout 30 s", "delay: 1 s", "at most 300 s")
_CONFIG_BEFORE = re.compile(rf"\b(?:{_SETTING})\s*(?:[:=(]\s*|of\s+|is\s+)?(?:about\s+)?$", re.I)
#: or right after it ("5 s by default", "20 s apart", "1 s, doubled")
_CONFIG_AFTER = re.compile(r"^[\s,;:)]{0,3}(?:by\s+default|default|apart|doubled|timeout|deadline)\b", re.I)
_MEASURING = re.compile(r"\b(?:took|takes|taking|measured|measures|costs?|costing|spent|spends)\s+"
                        r"(?:about\s+|around\s+|only\s+|roughly\s+|~\s*)?$", re.I)


def timings(text: str) -> list[str]:
    """The measured timings ``text`` quotes, by the rule in this module's docstring."""
    text = _LITERAL.sub(" ", text)
    found = [m.group(0) for m in _RATIO.finditer(text)]
    for match in _DURATION.finditer(text):
        before = text[max(0, match.start() - 40):match.start()]
        after = text[match.end():match.end() + 20]
        measured = _MEASURING.search(before) is not None
        configured = _CONFIG_BEFORE.search(before) is not None or _CONFIG_AFTER.search(after) is not None
        if measured or not configured:
            found.append(match.group(0))
    return found


@dataclass(frozen=True)
class Doc:
    where: str
    text: str


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def _docs(path: Path) -> list[Doc]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module) and (text := ast.get_docstring(node)):
            docs.append(Doc(_name(path), text))
        elif isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and (
                text := ast.get_docstring(node)):
            docs.append(Doc(f"{_name(path)}:{node.lineno} {node.name}", text))
    return docs


def _module_doc(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))


def test_the_package_is_found() -> None:
    assert len(_modules()) > 100


@pytest.mark.parametrize("path", _modules(), ids=_name)
def test_every_module_leads_with_a_one_line_summary(path: Path) -> None:
    text = _module_doc(path)
    assert text, f"{_name(path)} has no module docstring"
    lines = text.splitlines()
    assert lines[0].strip() and lines[0] == lines[0].lstrip(), f"{_name(path)}: the first line is blank"
    assert lines[0].rstrip().endswith("."), f"{_name(path)}: the first line is not a sentence: {lines[0]!r}"
    assert len(lines) == 1 or not lines[1].strip(), f"{_name(path)}: the summary runs on: {lines[1]!r}"


def test_module_docstrings_average_at_most_six_lines() -> None:
    counts = {_name(path): len((_module_doc(path) or "").splitlines()) for path in _modules()}
    average = sum(counts.values()) / len(counts)
    longest = sorted(counts.items(), key=lambda item: -item[1])[:10]
    assert average <= MAX_AVERAGE_LINES, f"average {average:.2f} lines; longest: {longest}"


def test_at_most_five_docstrings_quote_a_timing() -> None:
    timed = {doc.where: found for path in _modules() for doc in _docs(path) if (found := timings(doc.text))}
    assert len(timed) <= MAX_TIMED, f"{len(timed)} quote timings (name the bench/RESULTS.md row): {timed}"


@pytest.mark.parametrize("text", [
    "Appending a row took 4.2 ms.",
    "The decode is 2.1x the floor.",
    "It answers in 130 ms on this machine.",
    "A regex alternation is 3x slower here.",
    "Full collections of 17-83 ms fell inside calls.",
    "A 6 MB answer: 1 ms, not 20.",
    "The check costs about 0.15ms per answer.",
    "It is 4 times cheaper than a table.",
])
def test_a_measurement_counts(text: str) -> None:
    assert timings(text), text


@pytest.mark.parametrize("text", [
    "Each attempt has a timeout 30 s.",
    "Locks are tried until the deadline (5 s by default).",
    "Samples 20 s apart.",
    "Reconnect delay: 1 s, doubled after each failure, at most 300 s.",
    "An age such as ``30s`` or 15m; 401s are refused.",
    "Sessions expire after idle expiry 30 min.",
    "Leaf hashing: SHA-256(0x00 || data).",
    "See bench/RESULTS.md, \"audit append\" rows.",
])
def test_a_setting_or_a_name_does_not_count(text: str) -> None:
    assert timings(text) == [], text
