"""The README and the docs/ pages as a set: short front door, every link, anchor, path and name resolves."""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
#: the pages whose links and paths must resolve
PAGES = sorted([REPO / "README.md", REPO / "deploy" / "README.md", REPO / "bench" / "README.md",
                *DOCS.glob("*.md")])
#: a repository path as the pages write it in backticks
REPO_PATH = re.compile(r"^(?:gateway|tests|deploy|bench)/[\w./-]*$")
#: paths the pages name that are made when first used (git-ignored)
MADE_WHEN_USED = {"bench/.peer-venv"}
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
#: a code span, which may run over a line break
CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[(?:[^\]\n]*)\]\(([^)\s]+)\)")
#: how a page names a measured figure instead of copying it: the row "...", the rows starting "..."
ROW_NAME = re.compile(r'\brows? (?:starting )?"([^"]+)"')


def name(page: Path) -> str:
    return str(page.relative_to(REPO))


def prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return FENCE.sub("", page.read_text())


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose(page).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", prose(page))
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z]+:", target)]


def code_spans(page: Path) -> list[str]:
    return CODE_SPAN.findall(prose(page))


def test_the_readme_is_a_front_door_of_at_most_200_lines() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)


def test_docs_holds_at_least_five_pages_and_the_readme_links_each() -> None:
    pages = sorted(page.name for page in DOCS.glob("*.md"))
    assert len(pages) >= 5, pages
    linked = {Path(target.split("#", 1)[0]).name for target in links(REPO / "README.md")}
    assert set(pages) <= linked, sorted(set(pages) - linked)


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with this anchor in {name(linked)}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_repository_path_in_backticks_exists(page: Path) -> None:
    words = (word.rstrip(".,:;") for span in code_spans(page) for word in span.split())
    missing = sorted({word for word in words if REPO_PATH.match(word) and word not in MADE_WHEN_USED
                      and not (REPO / word).exists()})
    assert not missing, missing


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_dotted_gateway_name_in_backticks_imports(page: Path) -> None:
    """A name of two parts (``gateway.yaml``, the span ``gateway.decision``) is not checked."""
    dotted = {re.sub(r"\(.*\)$", "", span, flags=re.S) for span in code_spans(page)}
    names = sorted(ref for ref in dotted if re.fullmatch(r"gateway(\.\w+){2,}", ref))
    missing = [ref for ref in names if not resolves(ref)]
    assert not missing, missing


def resolves(ref: str) -> bool:
    """Whether ``ref`` is a module of the package, or a name defined in one."""
    parts = ref.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def results_rows() -> list[str]:
    """The first column of the table ``make bench`` writes to bench/RESULTS.md."""
    table = (REPO / "bench" / "RESULTS.md").read_text().split("\n| measurement |", 1)[1].split("\n\n", 1)[0]
    return [line.split("|")[1].strip() for line in table.splitlines()[2:]]


@pytest.mark.parametrize("page", [REPO / "README.md", *sorted(DOCS.glob("*.md"))], ids=name)
def test_every_measured_row_a_page_names_is_a_row_of_the_results(page: Path) -> None:
    rows = results_rows()
    named = ROW_NAME.findall(" ".join(prose(page).split()))
    unknown = [row for row in named if not any(r.startswith(row) for r in rows)]
    assert not unknown, unknown


@pytest.mark.parametrize("page", [REPO / "README.md", *sorted(DOCS.glob("*.md"))], ids=name)
def test_no_page_copies_a_measured_ratio_or_microseconds(page: Path) -> None:
    """Ratios and microseconds are what a benchmark prints: a page names its row instead."""
    copied = re.findall(r"\b\d+(?:\.\d+)?x\b|\b\d+(?:\.\d+)? ?(?:µs|us)\b", prose(page))
    assert not copied, copied


def test_the_readme_client_snippet_is_the_one_the_clients_page_runs() -> None:
    readme = re.findall(r"```json\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    clients = re.findall(r"```json\n(.*?)```", (DOCS / "clients.md").read_text(), re.S)
    assert len(readme) == 1 and readme[0] in clients


#: the words the project made up, each defined in the architecture page's glossary
PROJECT_WORDS = ("facts", "moves", "trail", "lane", "gate", "edge", "blast radius", "wing", "proposal",
                 "claim", "mirror", "sweep", "checkpoint", "witness", "caller key", "fair share",
                 "busy audit", "plan")


def test_the_architecture_page_follows_a_call_and_defines_the_project_words() -> None:
    text = (DOCS / "architecture.md").read_text()
    assert "\n## How a call flows\n" in text
    glossary = text.split("\n## Glossary\n", 1)[1].split("\n## ", 1)[0]
    defined = {word for line in glossary.splitlines() if line.startswith("| **")
               for word in re.findall(r"\*\*([^*]+)\*\*", line.split("|")[1])}
    missing = [word for word in PROJECT_WORDS if word not in defined]
    assert not missing, missing
