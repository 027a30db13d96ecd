"""The example server's chat page in headless Chromium: a person types, reads, stops, reloads.

Like the report's browser test, it FAILS (never skips) when Chromium cannot start
(scripts/ensure-chromium installs Debian's chromium and chromedriver; make test runs it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from test_example_server import STORY, serve
from test_report_browser import browser  # noqa: F401 - the module's one headless Chromium

from eventstore import EventStore
from eventstore.integrations.ai_sdk import to_ui_messages


def _until(check: Callable[[], Any], what: str, seconds: float = 30) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _reply(driver: Any) -> str:
    """The text of the last assistant message on the page."""
    return str(driver.execute_script(
        "const m = [...document.querySelectorAll('.msg.assistant')].pop();"
        "return m ? [...m.querySelectorAll('.text')].map((t) => t.textContent).join('') : '';"))


def _started(driver: Any, said: str) -> bool:
    """Whether the reply to the message starting with ``said`` shows its first words.

    Until the new reply's first text arrives, the last assistant message on the page is the
    previous reply: a word count alone is met at once by a long previous reply, and a reload
    made then can reach the server before the message it sent (the reloaded page reads an
    idle session and has nothing to resume).
    """
    reply = _reply(driver)
    return reply.startswith(f"You said: {said}") and len(reply.split(" ")) >= 6


def _say(driver: Any, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _until(lambda: driver.find_element(By.ID, "send").is_enabled(), "the page to be ready")
    box = driver.find_element(By.ID, "input")
    driver.execute_script("arguments[0].value = arguments[1];", box, text)  # long texts type slowly
    box.send_keys(Keys.END, " ", Keys.ENTER)


def test_the_chat_page_streams_stops_and_resumes_after_a_reload(db_url: str, browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    driver = browser
    with serve(db_url, CHAT_WORD_DELAY="0.03") as served:
        driver.get_log("performance")
        driver.get(f"{served.base}/#page-1")
        _until(lambda: driver.find_element(By.ID, "session").text == "page-1", "the page to load")

        _say(driver, "hello <b>browser</b>")
        _until(lambda: _reply(driver) == "You said: hello <b>browser</b>", "the streamed reply")
        assert driver.find_elements(By.CSS_SELECTOR, ".msg b") == []  # text, never markup

        _say(driver, f"a story: {STORY}")
        _until(lambda: _started(driver, "a story:"), "the reply to start")
        driver.find_element(By.ID, "stop").click()
        _until(lambda: driver.find_element(By.ID, "status").text == "Stopped.", "the stop")
        _until(lambda: driver.find_element(By.ID, "send").is_enabled(), "the page to be ready")
        stopped = _reply(driver)
        assert stopped.startswith("You said: a story:") and not stopped.endswith("word149")

        _say(driver, f"another story: {STORY}")
        _until(lambda: _started(driver, "another story:"), "the reply to start")
        cut = _reply(driver)
        driver.refresh()
        full = f"You said: another story: {STORY}"
        try:
            _until(lambda: _reply(driver) == full, "the reply to be resumed and finish", 30)
        except AssertionError:
            raise AssertionError((_reply(driver), driver.find_element(By.ID, "status").text,
                                  httpx.get(f"{served.base}/api/chat/page-1/messages").json()["status"],
                                  driver.get_log("browser"))) from None
        assert cut != full

        stored = httpx.get(f"{served.base}/api/chat/page-1/messages").json()
        texts = driver.execute_script(
            "return [...document.querySelectorAll('.msg')].map((m) => [m.className, m.textContent]);")
        requests = [
            json.loads(entry["message"])["message"]["params"]["request"]["url"]
            for entry in driver.get_log("performance")
            if json.loads(entry["message"])["message"]["method"] == "Network.requestWillBeSent"
        ]
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    assert requests and all(url.startswith(served.base + "/") for url in requests), requests
    with EventStore(db_url) as store:
        assert stored["messages"] == to_ui_messages(store.load("page-1"))
        assert [e.type for e in store.history("page-1") if e.type != "part"] == ["send", "send", "stop", "send"]
    shown = [(cls.split()[-1], text) for cls, text in texts]
    assert shown[0] == ("user", "hello <b>browser</b>")
    assert shown[-1] == ("assistant", full)
    assert stopped in [t for _, t in shown]
    assert "Traceback" not in served.output, served.output
