"""Headless Chromium for the web page tests (Debian's chromium driven by Playwright); the ``browser``
fixture in conftest.py launches it once per test module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import Browser, sync_playwright

from support import tier
from support.httpserver import REPO
from support.processes import unavailable

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
               "--disable-component-update", "--disable-sync"]
#: screenshots and traces the browser tests leave for a person to look at
ARTIFACTS = REPO / "test-artifacts" / "web"


@contextlib.contextmanager
def launched_chromium() -> Iterator[Browser]:
    """Chromium, or the test fails (skips outside CI) naming the package to install."""
    tier.start("browser")
    if not CHROMIUM.is_file():
        unavailable(f"{CHROMIUM} is missing: apt-get install -y chromium")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            yield launched
        finally:
            launched.close()
