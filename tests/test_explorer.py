"""The explorer's routes over HTTP (Starlette's test client), on every backend.

What a reader of each page must see, what must never reach the page raw (markup, bidi
controls), the error pages, paging, the diff, the headers, the live event stream (over
a real loopback port) and the ``eventstore ui`` command.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from cli_helpers import EXE, run_cli
from explorer_server import free_port, running
from report_sessions import HOSTILE_ID, HOSTILE_OUTPUT, HOSTILE_TEXT, record_demo, record_hostile
from starlette.testclient import TestClient

from eventstore import EventStore
from eventstore.explorer import create_app
from eventstore.explorer.app import CSP


@pytest.fixture
def es(db_url: str) -> Iterator[EventStore]:
    with EventStore(db_url) as store:
        store.migrate()
        yield store


@pytest.fixture
def client(es: EventStore) -> TestClient:
    return TestClient(create_app(es))


def _send(i: int, text: str) -> dict[str, Any]:
    return {"type": "send", "id": f"u-{i}", "text": text}


def _reply(i: int, text: str) -> list[dict[str, Any]]:
    return [
        {"type": "part", "part": {"type": "message-start", "messageId": f"a-{i}"}},
        {"type": "part", "part": {"type": "text-delta", "messageId": f"a-{i}", "text": text}},
        {"type": "part", "part": {"type": "finish", "reason": "stop"}},
    ]


def _talk(store: EventStore, session: str, *texts: str) -> int:
    """One turn per text: the user sends it, the assistant answers ``re: TEXT``."""
    head = store.head(session) if any(s.id == session for s in store.sessions()) else 0
    for i, text in enumerate(texts, head // 4 + 1):
        head = store.append(session, [_send(i, text), *_reply(i, f"re: {text}")]).version
    return head


def _page(r: httpx.Response) -> str:
    assert r.headers["content-type"].startswith("text/html")
    return r.text


def _scripts(html: str) -> list[str]:
    return re.findall(r"<script[^>]*>", html)


def test_catalogue_search_and_paging(es: EventStore, client: TestClient) -> None:
    for n in range(5):
        _talk(es, f"chat-{n}", f"topic {n}")
    _talk(es, "mugs", "two coffee mugs")
    page = _page(client.get("/"))
    for n in range(5):
        assert f'href="/sessions/chat-{n}"' in page
    found = _page(client.get("/", params={"q": "mugs"}))
    assert 'href="/sessions/mugs"' in found and "chat-0" not in found
    assert "No session matches." in _page(client.get("/", params={"q": "nothing like this"}))
    assert "No session matches." in _page(client.get("/", params={"owner": "user:nobody"}))
    assert "No session matches." in _page(client.get("/", params={"status": "streaming"}))
    # Paging: every session exactly once, following each page's link.
    seen: list[str] = []
    url = "/?limit=2"
    while True:
        page = _page(client.get(url))
        seen += re.findall(r'class="sid" href="/sessions/([^"]+)"', page)
        more = re.search(r'id="next-page" href="([^"]+)"', page)
        if more is None:
            break
        url = more.group(1).replace("&amp;", "&")
    assert sorted(seen) == sorted(["mugs", *(f"chat-{n}" for n in range(5))])
    assert client.get("/", params={"limit": "0"}).status_code == 400
    assert client.get("/", params={"cursor": "not a cursor"}).status_code == 400


def test_session_page_and_versions(es: EventStore, client: TestClient) -> None:
    head = _talk(es, "s1", "first question", "second question", "third question")
    r = client.get("/sessions/s1")
    page = _page(r)
    assert r.headers["content-security-policy"] == CSP
    assert "default-src 'self'" in CSP and "'unsafe-inline'" not in CSP
    assert r.headers["x-content-type-options"] == "nosniff"
    assert _scripts(page) == ['<script src="/static/explorer.js" defer>']
    assert "<style" not in page and " style=" not in page
    assert "re: third question" in page and "first question" in page
    assert f'max="{head}"' in page and f'value="{head}"' in page
    assert 'href="/sessions/s1/report"' in page and 'href="/sessions/s1/history"' in page
    # The state at version 5: the second turn's send, no answer yet, no third turn.
    page = _page(client.get("/sessions/s1", params={"v": 5}))
    assert "second question" in page and "re: second question" not in page and "third" not in page
    assert 'value="5"' in page
    view = _page(client.get("/sessions/s1/view", params={"v": 4}))
    assert view.startswith('<div id="view" data-version="4">')
    assert "re: first question" in view and "second question" not in view
    assert "Nothing recorded" in _page(client.get("/sessions/s1/view", params={"v": 0}))
    verify = _page(client.get("/sessions/s1/verify"))
    assert 'id="verify"' in verify and "hash chain and snapshots check out" in verify
    # Once checked, the page shows the result at once.
    assert "hash chain and snapshots check out" in _page(client.get("/sessions/s1"))
    report = client.get("/sessions/s1/report")
    assert "Audit report" in report.text and "'unsafe-inline'" in report.headers["content-security-policy"]
    assert "as it was at v4" in client.get("/sessions/s1/report", params={"v": 4}).text


def test_errors_are_pages_not_tracebacks(es: EventStore, client: TestClient) -> None:
    _talk(es, "s1", "hello")
    cases = {
        "/sessions/missing": 404,
        "/sessions/missing/history": 404,
        "/sessions/missing/events": 404,
        "/sessions/s1?v=99": 404,
        "/sessions/s1?v=-1": 400,
        "/sessions/s1?v=abc": 400,
        "/sessions/s1/view?v=99": 404,
        "/sessions/s1/history?after=99": 404,
        "/sessions/s1/history?limit=0": 400,
        "/sessions/s1/nothing": 404,
        "/diff?a=s1&b=missing": 404,
        "/diff?a=s1@99&b=s1": 404,
        "/static/secrets.txt": 404,
        "/nowhere": 404,
    }
    for url, status in cases.items():
        r = client.get(url)
        assert r.status_code == status, url
        assert "Traceback" not in r.text and "<h1>" in r.text, url
        assert r.headers["content-security-policy"] == CSP, url


def test_hostile_text_is_escaped(es: EventStore, client: TestClient) -> None:
    record_hostile(es)
    bidi = "pay \u202eusd 0001\u202c now \u2066x\u2069 zero\u200bwidth nul\x00"
    es.append("bidi\u202eid", [_send(1, bidi), *_reply(1, "ok \u202e")])
    pages = [
        client.get(f"/sessions/{quote(HOSTILE_ID, safe='')}").text,
        client.get(f"/sessions/{quote(HOSTILE_ID, safe='')}/history").text,
        client.get("/").text,
    ]
    for page in pages:
        assert "<script>alert" not in page and "<img src=x" not in page and "onerror=\"window" not in page
        assert _scripts(page) == ['<script src="/static/explorer.js" defer>']
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[0]
    assert "&lt;/pre&gt;&lt;script&gt;" in pages[0]
    odd = quote("bidi\u202eid", safe="")
    page = client.get(f"/sessions/{odd}").text
    history = client.get(f"/sessions/{odd}/history").text
    for text in (page, history, client.get("/").text):
        assert not re.search("[\u202a-\u202e\u2066-\u2069\u200b\x00]", text)
    assert "pay \\u202eusd 0001\\u202c now \\u2066x\\u2069 zero\\u200bwidth nul\\x00" in page
    assert "bidi\\u202eid" in page


def test_history_pages(es: EventStore, client: TestClient) -> None:
    head = _talk(es, "s1", *(f"q{n}" for n in range(6)))
    versions: list[int] = []
    url = "/sessions/s1/history?limit=5"
    pages = 0
    while True:
        page = _page(client.get(url))
        pages += 1
        versions += [int(v) for v in re.findall(r'<details class="event" id="e(\d+)">', page)]
        more = re.search(r'id="next-page" href="([^"]+)"', page)
        if more is None:
            break
        url = more.group(1).replace("&amp;", "&")
    assert versions == list(range(1, head + 1)) and pages == (head + 4) // 5
    # Each event unfolds to its JSON: the action as recorded.
    page = _page(client.get("/sessions/s1/history", params={"after": 4, "limit": 1}))
    assert "&quot;text&quot;: &quot;q1&quot;" in page and 'id="prev-page"' in page
    assert '"version": 5' in page.replace("&quot;", '"')


def test_diff_of_two_refs(es: EventStore, client: TestClient) -> None:
    record_demo(es)
    es.branch("demo", at=20, new_id="alt")
    es.append("alt", [_send(9, "tea instead")], expected_version=20)
    page = _page(client.get("/diff", params={"a": "demo", "b": "alt"}))
    assert "Shared base" in page and "<code>demo@20</code>" in page
    assert "tea instead" in page and "Only in A (removed on the way to B)" in page
    page = _page(client.get("/diff", params={"a": "demo@20", "b": "alt@20"}))
    assert "The two states are identical." in page
    assert 'name="a"' in _page(client.get("/diff"))
    # The branch's page links its parent, the tree and the diff.
    page = _page(client.get("/sessions/alt"))
    assert 'href="/sessions/demo?v=20"' in page and 'href="/diff?a=demo&amp;b=alt"' in page
    assert "forked at v20" in page


def test_ids_with_slash_and_at(es: EventStore, client: TestClient) -> None:
    for sid in ("team/ada@example.com", "a/history"):
        _talk(es, sid, f"hello from {sid}")
        page = _page(client.get(f"/sessions/{quote(sid, safe='')}"))
        assert f"re: hello from {sid}" in page
        history = _page(client.get(f"/sessions/{quote(sid, safe='')}/history"))
        assert '<details class="event" id="e1">' in history
    page = _page(client.get("/diff", params={"a": "team/ada@example.com@1", "b": "a/history"}))
    assert "team/ada@example.com@1" in page


def test_only_loopback_host_names_are_answered(es: EventStore) -> None:
    app = create_app(es, allowed_hosts=["127.0.0.1", "localhost"])
    assert TestClient(app, base_url="http://127.0.0.1:8765").get("/").status_code == 200
    assert TestClient(app, base_url="http://attacker.example").get("/").status_code == 400


def test_live_events_stream(es: EventStore) -> None:
    _talk(es, "s1", "hello")
    got: list[dict[str, Any]] = []
    with running(es) as base, httpx.Client(base_url=base, timeout=10) as http:
        with http.stream("GET", "/sessions/s1/events", params={"after": 4}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            lines = r.iter_lines()
            assert next(lines).startswith("retry:")
            appended = threading.Event()

            def write() -> None:
                es.append("s1", [_send(2, "live one")])
                appended.set()

            started = time.monotonic()
            threading.Thread(target=write).start()
            for line in lines:
                if line.startswith("data:"):
                    got.append(json.loads(line[5:]))
                    break
            # The page can deliver the event before the writer's thread is back from append.
            assert appended.wait(10)
            assert time.monotonic() - started < 3
    assert got == [{"version": 5, "type": "send", "turn": 2}]


def _cli(*args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(EXE), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


def _wait_up(url: str, proc: subprocess.Popen[str]) -> httpx.Response:
    deadline = time.monotonic() + 20
    while True:
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_ui_command(es: EventStore, db_url: str) -> None:
    _talk(es, "s1", "hello over the command line")
    help_ = run_cli("ui", "--help")
    assert "NO authentication" in help_.stdout and "--port" in help_.stdout
    port = free_port()
    # --db after the command's name, as for every command; loopback: no warning.
    proc = _cli("ui", "--db", db_url, "--port", str(port))
    try:
        r = _wait_up(f"http://127.0.0.1:{port}/sessions/s1", proc)
        assert r.status_code == 200 and "re: hello over the command line" in r.text
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "warning" not in err and f"http://127.0.0.1:{port}/" in err
    port = free_port()
    proc = _cli("--db", db_url, "ui", "--host", "0.0.0.0", "--port", str(port))
    try:
        assert _wait_up(f"http://127.0.0.1:{port}/", proc).status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "warning: listening on '0.0.0.0', not loopback" in err and "no authentication" in err


def test_ui_needs_an_existing_database(tmp_path: Any) -> None:
    r = run_cli("ui", "--db", f"sqlite:///{tmp_path / 'none.db'}", code=1)
    assert r.stderr.startswith("error: no database")
