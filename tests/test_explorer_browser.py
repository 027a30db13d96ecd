"""The explorer in a real browser: headless Chromium against a live server, on every backend.

The server runs in this process on a loopback port (tests/explorer_server.py); the browser
is Debian's chromium (tests/chromium.py: if it cannot start, these tests FAIL). Each page
is checked for what a reader sees, that its script works (scrubbing, keyboard, live
events), that text from the log is shown literally and nothing from it runs, and that
no request left the server (the browser's network log and its resource entries). With
``EVENTSTORE_SCREENSHOTS=1`` the SQLite run saves a screenshot of each page into
docs/explorer/ for docs/explorer.md; otherwise a test run never writes into the tree.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from chromium import chromium
from explorer_server import running
from report_sessions import HOSTILE_ACTOR, HOSTILE_ID, HOSTILE_OUTPUT, HOSTILE_TEXT, record_demo, record_hostile

from eventstore import EventStore

SHOTS = Path(__file__).resolve().parents[1] / "docs" / "explorer"
BIDI = "pay \u202eusd 0001\u202c now"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium(1200, 800) as driver:
        yield driver


@pytest.fixture
def served(db_url: str) -> Iterator[tuple[EventStore, str]]:
    with EventStore(db_url) as store:
        store.migrate()
        with running(store) as base:
            yield store, base


def _until(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _text(b: Any) -> str:
    return str(b.execute_script("return document.body.innerText"))


class Pages:
    """Opens explorer pages and checks what every page must satisfy."""

    def __init__(self, browser: Any, base: str, backend: str) -> None:
        self.b, self.base, self.backend = browser, base, backend

    def open(self, path: str) -> Any:
        self.b.get_log("performance")  # drop what earlier pages logged
        self.b.get(self.base + path)
        _until(lambda: self.b.execute_script("return document.readyState") == "complete", "the page")
        return self.b

    def check(self, shot: str | None = None) -> None:
        """No request left the server; nothing from the log ran; save the screenshot."""
        requests = [
            json.loads(e["message"])["message"]["params"]["request"]["url"]
            for e in self.b.get_log("performance")
            if json.loads(e["message"])["message"]["method"] == "Network.requestWillBeSent"
        ]
        assert requests and all(u.startswith(self.base + "/") for u in requests), requests
        entries = self.b.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert all(str(u).startswith(self.base + "/") for u in entries), entries
        assert self.b.execute_script("return typeof window.__pwned") == "undefined"
        if shot is not None and self.backend == "sqlite" and os.environ.get("EVENTSTORE_SCREENSHOTS") == "1":
            SHOTS.mkdir(parents=True, exist_ok=True)
            self.b.save_screenshot(str(SHOTS / f"{shot}.png"))


@pytest.fixture
def pages(browser: Any, served: tuple[EventStore, str], backend: str) -> Iterator[Pages]:
    yield Pages(browser, served[1], backend)
    browser.get("about:blank")  # closes the page's event stream before the server stops


def _chat(store: EventStore, session: str, *texts: str) -> int:
    head = 0
    for i, text in enumerate(texts, 1):
        head = store.append(
            session,
            [
                {"type": "send", "id": f"u-{i}", "text": text},
                {"type": "part", "part": {"type": "message-start", "messageId": f"a-{i}"}},
                {"type": "part", "part": {"type": "text-delta", "messageId": f"a-{i}", "text": f"re: {text}"}},
                {"type": "part", "part": {"type": "finish", "reason": "stop"}},
            ],
            actor="user:ada",
        ).version
    return head


def test_catalogue_search(served: tuple[EventStore, str], pages: Pages) -> None:
    store, _ = served
    record_demo(store)
    for n in range(3):
        _chat(store, f"support-{n}", f"question {n}")
    b = pages.open("/")
    assert "demo" in _text(b) and "support-2" in _text(b)
    box = b.find_element("id", "q")
    box.send_keys("question 1")  # a title: the first user text
    box.submit()
    _until(lambda: "q=question" in b.current_url, "the search")
    rows = b.execute_script("return [...document.querySelectorAll('a.sid')].map(a => a.textContent)")
    assert rows == ["support-1"]
    pages.open("/")
    pages.check("catalogue")
    b.find_element("link text", "demo").click()
    _until(lambda: b.current_url.endswith("/sessions/demo"), "the session page")


def test_session_page_scrub_and_keyboard(served: tuple[EventStore, str], pages: Pages) -> None:
    store, _ = served
    record_demo(store)
    head = store.head("demo")
    b = pages.open("/sessions/demo")
    text = _text(b)
    assert "I need two coffee mugs, dishwasher safe." in text and "checkout" in text
    _until(lambda: "hash chain and snapshots check out" in _text(b), "the verify result")
    pages.check("session")
    # Drag the slider to version 3: the view shows that version's state, the URL names it.
    b.execute_script(
        "const s = document.getElementById('scrub'); s.value = 3; s.dispatchEvent(new Event('input'))"
    )
    _until(lambda: b.execute_script("return document.getElementById('view').dataset.version") == "3", "v3")
    assert b.current_url.endswith("/sessions/demo?v=3")
    text = _text(b)
    assert "I need two coffee mugs, dishwasher safe." in text and "Your order A-1042" not in text
    # The keyboard steps one version at a time.
    body = b.find_element("tag name", "body")
    body.send_keys("\ue014")  # → (ArrowRight)
    body.send_keys("\ue014")
    body.send_keys("\ue012")  # ← (ArrowLeft)
    _until(lambda: b.execute_script("return document.getElementById('view').dataset.version") == "4", "v4")
    assert b.find_element("id", "shown").text == "v4"
    # ?v=N is a link: the server renders that version on its own.
    b = pages.open("/sessions/demo?v=3")
    assert b.execute_script("return document.getElementById('scrub').value") == "3"
    assert "Your order A-1042" not in _text(b)
    pages.check("scrub")
    b = pages.open(f"/sessions/demo?v={head}")
    assert "Your order A-1042" in _text(b)


def test_history_paging(served: tuple[EventStore, str], pages: Pages) -> None:
    store, _ = served
    head = _chat(store, "s1", *(f"q{n}" for n in range(10)))
    b = pages.open("/sessions/s1/history?limit=8")
    first = b.execute_script("return [...document.querySelectorAll('details.event')].map(d => d.id)")
    assert first == [f"e{v}" for v in range(1, 9)]
    b.find_element("id", "next-page").click()
    _until(lambda: "after=8" in b.current_url, "the next page")
    second = b.execute_script("return [...document.querySelectorAll('details.event')].map(d => d.id)")
    assert second == [f"e{v}" for v in range(9, 17)]
    # An event unfolds to its JSON.
    b.find_element("css selector", "#e9 > summary").click()
    assert '"text": "q2"' in b.find_element("css selector", "#e9 pre").text
    pages.check("history")
    assert head == 40


def test_diff(served: tuple[EventStore, str], pages: Pages) -> None:
    store, _ = served
    record_demo(store)
    store.branch("demo", at=20, new_id="alt")
    store.append("alt", [{"type": "send", "id": "u-9", "text": "tea instead"}], expected_version=20)
    b = pages.open("/sessions/alt")
    b.find_element("partial link text", "Diff against demo").click()
    _until(lambda: "/diff?" in b.current_url, "the diff")
    text = _text(b)
    assert "Diff demo@51 → alt@21" in text and "tea instead" in text and "demo@20" in text
    pages.check("diff")


def test_live_append_appears(served: tuple[EventStore, str], pages: Pages) -> None:
    store, _ = served
    head = _chat(store, "live", "hello")
    b = pages.open("/sessions/live")
    assert b.execute_script("return document.getElementById('live').checked") is True
    # Wait for the page's event stream to be open before writing.
    _until(lambda: b.execute_script("return document.querySelector('form.scrub').dataset.live") == "open", "the stream")
    start = time.monotonic()
    store.append("live", [{"type": "send", "id": "u-2", "text": "a message written live"}])
    _until(lambda: "a message written live" in _text(b), "the live event", timeout=5)
    took = time.monotonic() - start
    assert took < 2.0, took
    assert b.find_element("id", "of").text == f"v{head + 1}"
    assert b.find_element("id", "shown").text == f"v{head + 1}"
    pages.check("live")


def test_hostile_text_shown_never_run(served: tuple[EventStore, str], pages: Pages) -> None:
    store, _ = served
    record_hostile(store)
    store.append("bidi", [{"type": "send", "id": "u-1", "text": BIDI}])
    b = pages.open(f"/sessions/{quote(HOSTILE_ID, safe='')}")
    b.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
    text = _text(b)
    for shown in (HOSTILE_TEXT, HOSTILE_ACTOR, HOSTILE_ID, HOSTILE_OUTPUT, "<svg onload="):
        assert shown in text
    assert b.execute_script("return document.querySelectorAll('script').length") == 1
    assert b.execute_script("return document.querySelectorAll('main img, main iframe, main svg').length") == 0
    pages.check("hostile")
    b = pages.open("/sessions/bidi")
    text = _text(b)
    assert "pay \\u202eusd 0001\\u202c now" in text and "\u202e" not in text
    pages.check()
    b = pages.open(f"/sessions/{quote(HOSTILE_ID, safe='')}/history")
    b.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
    assert HOSTILE_TEXT in _text(b)
    pages.check()
