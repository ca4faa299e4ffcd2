"""Headless Chromium for the browser tests, and the folder their screenshots are kept in.

A browser test is skipped with a reason when Chromium is not installed, except under CI (env var
CI set), where a missing browser fails the test: there, `make` installs it (`apt-get install -y
chromium`). Screenshots are kept as test artifacts under tests/artifacts/, whichever subfolder of
tests/ the test lives in.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dashboard import browser

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def find_chromium() -> str:
    """The browser's path; fails under CI and skips elsewhere when none is installed."""
    path = browser.find_browser()
    if path:
        return path
    message = "headless Chromium is not installed (apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; it is required when CI is set")
    pytest.skip(message)
