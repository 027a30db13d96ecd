"""Headless Chromium for the browser tests (Debian's chromium and chromium-driver).

`make test` installs both first (scripts/ensure-chromium); nothing is downloaded here. If
the browser cannot be started the calling test FAILS: a run without it never passes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

# Selenium Manager must never fetch a browser or driver.
os.environ["SE_OFFLINE"] = "true"


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """One headless Chromium with its network log on; quit when the block ends."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in (
            "--headless=new",
            "--no-sandbox",  # CI runs as root
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--window-size={width},{height}",
            "--hide-scrollbars",
        ):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    except Exception as exc:  # any reason at all: the browser test must not pass without a browser
        pytest.fail(
            f"headless Chromium could not be started ({CHROMIUM}, {CHROMEDRIVER}): {exc}. "
            "Run scripts/ensure-chromium (make test does).",
            pytrace=False,
        )
    try:
        yield driver
    finally:
        driver.quit()
