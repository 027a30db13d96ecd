"""The audit report's content, on both backends, and the `eventstore report` command.

What a browser shows is checked in test_report_browser.py; here the page's text is
read back with the standard library's HTML parser.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from report_sessions import (
    DEMO_TURN2,
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
from typer.testing import CliRunner

from eventstore import (
    CompactedError,
    EventStore,
    InvalidEvent,
    SessionNotFound,
    VersionNotFound,
    generate_keypair,
)
from eventstore.core.turn_rules import INTERRUPTED
from eventstore_cli.app import app


class _Page(HTMLParser):
    """The text of a page, the tags it holds and the attributes of its <details>."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.tags: list[str] = []
        self.turns: list[dict[str, str | None]] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "details" and "turn" in (a.get("class") or "").split():
            self.turns.append(a)

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    @property
    def body(self) -> str:
        return "".join(self.text)


def test_demo_report_shows_every_turn_tool_and_outcome(store: EventStore) -> None:
    record_demo(store)
    page = store.report("demo")
    p = _Page(page)
    assert [t["data-turn"] for t in p.turns] == ["1", "2"]
    for name in ("search_products", "add_to_cart", "delegate_to_gift_advisor", "list_gift_cards", "checkout"):
        assert name in p.body
    assert "I need two coffee mugs, dishwasher safe." in p.body
    assert "Your order A-1042 is placed" in p.body
    assert "Couldn't reach the assistant." in p.body  # the network error before the retry
    assert "1 retry" in p.body
    assert "sub-agent run" in p.body
    assert f"versions 1–{DEMO_TURN2 - 1}" in p.body
    assert f"eventstore checkout demo@{DEMO_TURN2 - 1}" in p.body
    assert "eventstore checkout demo@51" in p.body
    assert "user:ada" in p.body and "model:demo" in p.body
    assert "hash chain and snapshots check out" in p.body
    # The reasoning is collapsed; the failed checkout stays readable behind the retry.
    assert re.search(r'<details class="reasoning"><summary>reasoning</summary>', page)
    assert "What the turn showed before the retry at v42" in p.body
    assert p.body.count("call-4") == 1  # the checkout the error cancelled
    # Nothing is fetched or run apart from the page's own script.
    assert p.tags.count("script") == 1
    assert not {"img", "link", "iframe", "object", "embed"} & set(p.tags)
    assert "default-src 'none'" in html.unescape(page)


def test_report_at_a_version_shows_the_session_as_it_was(store: EventStore) -> None:
    record_demo(store)
    p = _Page(store.report("demo", version=DEMO_TURN2 - 1))
    assert [t["data-turn"] for t in p.turns] == ["1"]
    assert f"as it was at v{DEMO_TURN2 - 1} (head is v51)" in p.body
    assert "checkout" not in re.sub(r"eventstore checkout", "", p.body)
    empty = _Page(store.report("demo", version=0))
    assert empty.turns == [] and "No events recorded up to this version." in empty.body


def test_nested_sub_agents_are_indented_with_their_errors(store: EventStore) -> None:
    record_nested(store)
    page = store.report("nested")
    assert page.count('<div class="agent">') == 2  # planner's run, and hotel_agent's inside it
    inner = page.index('<div class="agent">', page.index('<div class="agent">') + 1)
    assert page.index('<span class="tname">book_room') > inner
    assert "No rooms left" in _Page(page).body


def test_a_recovered_turn_is_marked_interrupted(store: EventStore) -> None:
    record_interrupted(store)
    p = _Page(store.report("crashed"))
    first, second = p.turns
    assert "interrupted" in (first["class"] or "").split()
    assert "interrupted" not in (second["class"] or "").split()
    assert "Interrupted." in p.body and INTERRUPTED in p.body
    assert "by model:demo, recovery" in p.body
    assert "stopped" in p.body  # turn 2 ends with a stop


def test_everything_from_the_log_is_escaped(store: EventStore) -> None:
    record_hostile(store)
    page = store.report(HOSTILE_ID)
    for raw in (HOSTILE_TEXT, HOSTILE_ACTOR, HOSTILE_TOOL, HOSTILE_ID, HOSTILE_OUTPUT, "<svg", "<iframe", "<style>b"):
        assert raw not in page
    p = _Page(page)
    for shown in (HOSTILE_TEXT, HOSTILE_ACTOR, HOSTILE_TOOL, HOSTILE_ID, HOSTILE_OUTPUT, "<svg onload="):
        assert shown in p.body
    assert '"<k>": "<script>window.__pwned=5</script>"' in p.body  # the tool input, as JSON text
    assert p.tags.count("script") == 1 and "img" not in p.tags and "iframe" not in p.tags
    assert p.tags.count("style") == 1


def test_bidi_overrides_and_controls_are_neutralised_as_in_the_cli(store: EventStore) -> None:
    from eventstore import visible
    from eventstore_cli.terminal import safe

    text = "Please \u202eapprove\u202c the \u2066refund\u2069\x1b[31m now\u200b"
    store.append("bidi", [{"type": "send", "id": "u-\u202e1", "text": text}], actor="ada\u202e")
    page = store.report("bidi")
    for raw in ("\u202e", "\u202c", "\u2066", "\u2069", "\x1b", "\u200b"):
        assert raw not in page
    body = _Page(page).body
    assert visible(text, multiline=True) in body  # shown as visible escapes...
    assert "Please \\u202eapprove" in body
    assert safe(text) == visible(text)  # ...by the one rule the CLI uses


def test_invisible_characters_are_spelled_out(store: EventStore) -> None:
    # A right-to-left override would reorder what follows it on the page; a zero-width space
    # or a NUL would hide. Each is shown as an escape; line breaks and ordinary text stay.
    text = "pay \u202eusd 0001\u202c now\n\u2066iso\u2069 zero\u200bwidth nul\x00 caf\u00e9 \u4e2d"
    store.append("bidi\u202e", [{"type": "send", "id": "u-1", "text": text}], actor="ada\u202e")
    page = store.report("bidi\u202e")
    assert not re.search("[\u202a-\u202e\u2066-\u2069\u200b\x00]", page)
    body = _Page(page).body
    assert "pay \\u202eusd 0001\\u202c now\n\\u2066iso\\u2069 zero\\u200bwidth nul\\x00 caf\u00e9 \u4e2d" in body
    assert "bidi\\u202e" in body and "ada\\u202e" in body


def test_long_outputs_fold_and_many_turns_start_collapsed(store: EventStore) -> None:
    big = {"rows": [{"n": i, "text": "x" * 40} for i in range(60)]}
    actions = []
    for t in range(45):
        actions += [
            {"type": "send", "id": f"u-{t}", "text": f"question {t}"},
            {"type": "part", "part": {"type": "message-start", "messageId": f"a-{t}"}},
            {"type": "part", "part": {"type": "tool-call", "messageId": f"a-{t}", "id": f"c-{t}", "name": "q", "input": {}}},
            {"type": "part", "part": {"type": "tool-result", "id": f"c-{t}", "output": big}},
            {"type": "part", "part": {"type": "finish"}},
        ]
    store.append("long", actions, expected_version=0)
    page = store.report("long")
    p = _Page(page)
    assert len(p.turns) == 45 and all("open" not in t for t in p.turns)
    assert page.count('<details class="fold"><summary>') == 45
    few = _Page(store.report("long", version=10))
    assert len(few.turns) == 2 and all("open" in t for t in few.turns)


def test_branch_tree_and_compacted_session(store: EventStore) -> None:
    record_demo(store)
    store.branch("demo", at=DEMO_TURN2 - 1, new_id="demo-alt")
    store.branch("demo-alt", at=5, new_id="demo-alt-2")
    p = _Page(store.report("demo-alt"))
    assert "demo head v51" in p.body
    assert f"demo-alt head v{DEMO_TURN2 - 1} forked at v{DEMO_TURN2 - 1} ← this report" in p.body
    assert "demo-alt-2 head v5 forked at v5" in p.body
    assert f"demo@{DEMO_TURN2 - 1}" in p.body  # forked from
    store.compact("demo", upto=30)
    c = _Page(store.report("demo"))
    assert [t["data-turn"] for t in c.turns] == ["2"]
    assert "partial: starts before the baseline" in c.body
    assert "Your order A-1042 is placed" in c.body
    with pytest.raises(CompactedError):
        store.report("demo", version=10)


def test_refused_calls_name_the_problem(store: EventStore) -> None:
    record_demo(store)
    with pytest.raises(SessionNotFound):
        store.report("nope")
    with pytest.raises(VersionNotFound):
        store.report("demo", version=52)
    with pytest.raises(VersionNotFound):
        store.report("demo", version=-1)
    with pytest.raises(InvalidEvent):
        store.report("demo", version="3")  # type: ignore[arg-type]
    with pytest.raises(SessionNotFound):
        store.report("demo", against=("nope", None))


def test_diff_report(store: EventStore) -> None:
    record_demo(store)
    store.branch("demo", at=DEMO_TURN2 - 1, new_id="alt")
    store.append(
        "alt", [{"type": "send", "id": "u-9", "text": "<b>tea</b> instead"}], expected_version=DEMO_TURN2 - 1
    )
    page = store.report("demo", against=("alt", None))
    p = _Page(page)
    assert "Diff demo@51 → alt@21" in p.body
    assert f"demo@{DEMO_TURN2 - 1}" in p.body  # the shared base
    assert "Only in A (removed on the way to B)" in p.body
    assert "<b>tea</b> instead" in p.body and "<b>tea</b>" not in page
    assert "Your order A-1042 is placed" in p.body  # a removed message, in full
    assert "Events on B since the base" in p.body


# -- the command ---------------------------------------------------------------------------


def test_cli_report_writes_the_page(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    with EventStore(db) as s:
        s.migrate()
        record_demo(s)
        s.branch("demo", at=DEMO_TURN2 - 1, new_id="alt")
    runner = CliRunner()
    out = tmp_path / "report.html"
    r = runner.invoke(app, ["--db", db, "report", "demo", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    assert f"wrote the report of demo to {out}" in r.stderr
    assert len(_Page(out.read_text(encoding="utf-8")).turns) == 2
    assert [f.name for f in tmp_path.iterdir() if f.name.endswith(".part")] == []

    r = runner.invoke(app, ["--db", db, "report", f"demo@{DEMO_TURN2 - 1}"])
    assert r.exit_code == 0 and r.stdout.startswith("<!DOCTYPE html>")
    assert len(_Page(r.stdout).turns) == 1
    r = runner.invoke(app, ["--db", db, "report", "demo", "--at", "3"])
    assert "as it was at v3" in _Page(r.stdout).body
    r = runner.invoke(app, ["--db", db, "report", "demo", "--diff", "alt"])
    assert r.exit_code == 0 and "Diff demo@51 → alt@20" in _Page(r.stdout).body

    for args, message in (
        (["report", "nope", "-o", str(tmp_path / "x.html")], "error: session 'nope' not found"),
        (["report", "demo@99", "-o", str(tmp_path / "x.html")], "error: session 'demo' has no version 99"),
        (["report", "demo", "-o", str(tmp_path / "missing" / "x.html")], "error: no such file"),
    ):
        r = runner.invoke(app, ["--db", db, *args])
        assert r.exit_code == 1 and r.stderr.startswith(message), r.stderr
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "x.html").exists()
    # A ref splits at '@' only before digits: "demo@x" is a session id of its own.
    r = runner.invoke(app, ["--db", db, "report", "demo@x"])
    assert r.exit_code == 1 and "demo@x" in r.stderr, r.stderr
    r = runner.invoke(app, ["--db", db, "report", "demo", "--at", "-1"])
    assert r.exit_code == 2


def test_the_header_names_the_checkpoint_the_verify_result_used(store: EventStore) -> None:
    record_demo(store)
    private, public = generate_keypair()
    cp = store.checkpoint(private)
    assert "none used" in store.report("demo")
    page = store.report("demo", checkpoint=cp, public_key=public)
    assert "signed checkpoint of" in page and ">extended<" in page and "not extended" not in page
    # Signed by someone else: the page says the database does not extend it.
    _, stranger = generate_keypair()
    assert "not extended" in store.report("demo", checkpoint=cp, public_key=stranger)


def test_cli_report_takes_a_checkpoint_and_its_public_key(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    with EventStore(db) as s:
        s.migrate()
        record_demo(s)
    runner = CliRunner()
    key = tmp_path / "k"
    assert runner.invoke(app, ["keygen", "--out", str(key)]).exit_code == 0
    cp = tmp_path / "cp.json"
    r = runner.invoke(app, ["--db", db, "checkpoint", "--key", str(key), "-o", str(cp)])
    assert r.exit_code == 0, r.stderr
    r = runner.invoke(app, ["--db", db, "report", "demo", "--checkpoint", str(cp), "--public-key", f"{key}.pub"])
    assert r.exit_code == 0, r.stderr
    assert "signed checkpoint of" in r.stdout and "not extended" not in r.stdout
    r = runner.invoke(app, ["--db", db, "report", "demo", "--checkpoint", str(cp)])
    assert r.exit_code == 2 and "go together" in r.stderr
