"""The audit report in a real browser: headless Chromium driven by Selenium.

The browser is started by tests/chromium.py (Debian's chromium, never a download); if it
cannot start, every test of this module FAILS: a run without it can never pass as green.

One browser serves the whole module. Each page is opened from a file, checked for what
a reader sees, for scripts that must not have run and for requests that must not have
been made (the browser's own network log), and saved as a screenshot under the test's
temporary output folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import chromium
from report_sessions import (
    HOSTILE_ACTOR,
    HOSTILE_ID,
    HOSTILE_OUTPUT,
    HOSTILE_TEXT,
    HOSTILE_TOOL,
    record_demo,
    record_hostile,
    record_interrupted,
    record_nested,
)

from eventstore import EventStore
from eventstore.core.turn_rules import INTERRUPTED


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module, with its network log on."""
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: the test run's temporary output folder."""
    return tmp_path_factory.mktemp("report-screenshots")


Open = Callable[[str, str], Any]


@pytest.fixture
def open_report(browser: Any, shots: Path, tmp_path: Path) -> Open:
    """Write a page to a file, open it, check no request left it, save a screenshot."""

    def go(page: str, name: str) -> Any:
        path = tmp_path / f"{name}.html"
        path.write_text(page, encoding="utf-8")
        browser.get_log("performance")  # drop what earlier pages logged
        browser.get(path.as_uri())
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1280, max(900, min(int(height) + 40, 8000)))
        browser.save_screenshot(str(shots / f"{name}.png"))
        requests = [
            json.loads(entry["message"])["message"]["params"]["request"]["url"]
            for entry in browser.get_log("performance")
            if json.loads(entry["message"])["message"]["method"] == "Network.requestWillBeSent"
        ]
        assert requests == [path.as_uri()], requests
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
        assert (shots / f"{name}.png").stat().st_size > 10_000
        return browser

    return go


def _visible_text(browser: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.TAG_NAME, "body").text)


def _turns(browser: Any) -> int:
    return int(browser.execute_script("return document.querySelectorAll('details.turn').length"))


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[EventStore]:
    with EventStore(f"sqlite:///{tmp_path / 'browser.db'}") as store:
        store.migrate()
        yield store


def test_demo_report(sqlite_store: EventStore, open_report: Open) -> None:
    record_demo(sqlite_store)
    b = open_report(sqlite_store.report("demo"), "demo")
    assert b.title == "eventstore report: demo@51"
    assert _turns(b) == 2
    text = _visible_text(b)
    for name in ("search_products", "add_to_cart", "delegate_to_gift_advisor", "list_gift_cards", "checkout"):
        assert name in text
    assert "Couldn't reach the assistant." in text
    assert "I need two coffee mugs, dishwasher safe." in text
    assert "eventstore checkout demo@51" in text
    # The inline script ran (it is allowed by its hash): the buttons work.
    assert "reasoning" in text and "Budget 50; list gift cards." not in text
    b.find_element("id", "expand-all").click()
    assert "Budget 50; list gift cards." in _visible_text(b)
    b.find_element("id", "collapse-all").click()
    assert "Couldn't reach the assistant." not in _visible_text(b)
    assert "Couldn't reach the assistant." not in b.execute_script("return document.body.innerText")
    # Printed, every section shows, even with no script to open them.
    b.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    try:
        # innerText follows the rendering (Selenium's own text treats closed details as hidden).
        printed = b.execute_script("return document.body.innerText")
    finally:
        b.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})
    assert "Couldn't reach the assistant." in printed and "Budget 50; list gift cards." in printed
    assert "Expand all" not in printed


def test_readable_with_javascript_off(sqlite_store: EventStore, browser: Any, open_report: Open) -> None:
    record_demo(sqlite_store)
    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        b = open_report(sqlite_store.report("demo"), "demo-no-js")
        text = _visible_text(b)
    finally:
        browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})
    assert "I need two coffee mugs, dishwasher safe." in text and "Your order A-1042 is placed" in text
    assert "Expand all" not in text  # the buttons only appear when the script runs


def test_nested_sub_agent_report(sqlite_store: EventStore, open_report: Open) -> None:
    record_nested(sqlite_store)
    b = open_report(sqlite_store.report("nested"), "nested")
    assert _turns(b) == 1
    text = _visible_text(b)
    for name in ("planner", "hotel_agent", "book_room"):
        assert name in text
    assert "No rooms left" in text
    # Each level of sub-agent is indented further than its parent.
    lefts = b.execute_script(
        "return [...document.querySelectorAll('.tname')].map(e => e.getBoundingClientRect().left)"
    )
    assert lefts[0] < lefts[1] < lefts[2]


def test_recovered_turn_report(sqlite_store: EventStore, open_report: Open) -> None:
    record_interrupted(sqlite_store)
    b = open_report(sqlite_store.report("crashed"), "recovered")
    assert _turns(b) == 2
    text = _visible_text(b)
    assert "interrupted" in text and "Interrupted." in text and INTERRUPTED in text
    assert b.execute_script("return document.querySelectorAll('details.turn.interrupted').length") == 1
    assert "refund" in text


def test_hostile_text_is_shown_never_run(sqlite_store: EventStore, open_report: Open) -> None:
    record_hostile(sqlite_store)
    b = open_report(sqlite_store.report(HOSTILE_ID), "hostile")
    assert b.execute_script("return typeof window.__pwned") == "undefined"
    assert b.title == f"eventstore report: {HOSTILE_ID}@7"
    assert b.execute_script("return document.querySelectorAll('script').length") == 1
    assert b.execute_script("return document.querySelectorAll('img,iframe,link,svg,object').length") == 0
    b.find_element("id", "expand-all").click()
    text = _visible_text(b)
    for shown in (HOSTILE_TEXT, HOSTILE_ACTOR, HOSTILE_TOOL, HOSTILE_ID, HOSTILE_OUTPUT, "<svg onload="):
        assert shown in text
    assert b.execute_script("return typeof window.__pwned") == "undefined"


def test_diff_report_and_postgresql(db_url: str, backend: str, open_report: Open) -> None:
    with EventStore(db_url) as store:
        store.migrate()
        record_demo(store)
        store.branch("demo", at=20, new_id="alt")
        store.append("alt", [{"type": "send", "id": "u-9", "text": "tea instead"}], expected_version=20)
        b = open_report(store.report("demo"), f"demo-{backend}")
        assert _turns(b) == 2
        b = open_report(store.report("demo", against=("alt", None)), f"diff-{backend}")
    text = _visible_text(b)
    assert "Diff demo@51 → alt@21" in text
    assert "tea instead" in text and "Only in A (removed on the way to B)" in text
