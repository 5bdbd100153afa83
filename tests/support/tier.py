"""What a test may start besides Python, or build, each with its marker; the fast tier starts none.

A fixture that starts a part says so under its ``@pytest.fixture`` with ``@needs("postgres")``; every
test whose fixture closure holds that fixture gets the marker (tests/conftest.py). A fixture parametrised
over engines marks the parameter that starts one: ``pytest.param("postgres", marks=pytest.mark.postgres)``.
Each such fixture, and every helper that starts a part, calls ``start(marker)`` first: under the fast tier
(``TEST_TIER=fast``, what ``make test-fast`` sets) that fails the test; otherwise a test that started a
part without its marker fails once it has run (tests/conftest.py), and only that test.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

#: marker -> what it stands for (the markers are declared in pyproject.toml)
PARTS = {
    "simulator": "the vSphere simulator (deploy/vcsim)",
    "postgres": "a PostgreSQL server",
    "browser": "headless Chromium",
    "oidc": "Node's oidc-provider",
    "node": "Node and the MCP conformance suite (tests/conformance)",
    "slow": "a build or a soak (the container image, the man page, the wheel, a Go program)",
}
TIER_VARIABLE = "TEST_TIER"
NEEDS_ATTRIBUTE = "needs_parts"

F = TypeVar("F", bound=Callable[..., Any])

#: the test being run (set by tests/conftest.py around each test), whose markers ``start`` checks
running: pytest.Item | None = None
#: what the running test started without its marker
unmarked: list[str] = []


def fast_tier() -> bool:
    """Whether this run is the fast tier, which starts none of the parts."""
    return os.environ.get(TIER_VARIABLE) == "fast"


def needs(*markers: str) -> Callable[[F], F]:
    """Declare on a fixture function (under ``@pytest.fixture``) the parts it starts."""
    unknown = set(markers) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; known: {sorted(PARTS)}")

    def declare(fixture: F) -> F:
        if inspect.iscoroutinefunction(fixture) or inspect.isasyncgenfunction(fixture):
            raise TypeError(f"needs() takes plain and generator fixtures, not {fixture.__name__}")
        if inspect.isgeneratorfunction(fixture):
            @functools.wraps(fixture)
            def started_then_yields(*args: Any, **kwargs: Any) -> Iterator[Any]:
                for marker in markers:
                    start(marker)
                yield from fixture(*args, **kwargs)

            wrapped: Callable[..., Any] = started_then_yields
        else:
            @functools.wraps(fixture)
            def started(*args: Any, **kwargs: Any) -> Any:
                for marker in markers:
                    start(marker)
                return fixture(*args, **kwargs)

            wrapped = started
        setattr(wrapped, NEEDS_ATTRIBUTE, (*needed_by(fixture), *markers))
        return wrapped  # type: ignore[return-value]

    return declare


def needed_by(fixture: Callable[..., Any]) -> tuple[str, ...]:
    """The markers ``needs`` declared on a fixture function (none for any other)."""
    return tuple(getattr(fixture, NEEDS_ATTRIBUTE, ()))


def start(marker: str) -> None:
    """Called before a part starts: fail the test under the fast tier; note it when it lacks the marker."""
    what = PARTS[marker]
    if fast_tier():
        pytest.fail(f"the fast tier ({TIER_VARIABLE}=fast, make test-fast) does not start {what}: the test "
                    f"or a fixture it uses must carry the `{marker}` marker", pytrace=False)
    item = running
    if item is not None and item.get_closest_marker(marker) is None:
        found = (f"{item.nodeid} started {what} without the `{marker}` marker: declare it on the fixture "
                 f"(@needs({marker!r})), the parameter (pytest.param(..., marks=pytest.mark.{marker})) "
                 "or the test")
        if found not in unmarked:
            unmarked.append(found)
