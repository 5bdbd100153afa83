"""The server's parts over plain values for its unit tests (``support.server_parts``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.server_parts import Parts, opened_parts


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    with opened_parts(tmp_path) as opened:
        yield opened
