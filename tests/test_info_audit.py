"""Who set a session's title, owner or metadata, and when: shown by verify, the report and
`history --json`, across rewinds — on both backends (the store methods on both twins)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli_helpers import run_cli
from conftest import make_store
from eventstore import EventStore

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin")]


def send(i: int | str, text: str = "hello") -> dict[str, Any]:
    return {"type": "send", "id": f"u-{i}", "text": text}


STOP = {"type": "stop"}


def _conversation(store: EventStore) -> str:
    """s1 titled by ada, rewound (kept s1~1), then re-tagged by bob; returns the kept id."""
    store.append("s1", [send(1, "first"), STOP, send(2, "second"), STOP])
    store.set_info("s1", title="<b>Mugs</b>", owner="user:ada", actor="user:ada")
    kept = store.rewind("s1", to=2, actor="user:ada", reason="edit")
    assert kept == "s1~1"
    store.set_info("s1", metadata={"tenant": "acme"}, actor="admin:bob")
    store.append("s1", [send(3, "second, edited"), STOP])
    return kept


def test_info_changes_of_a_session_survive_its_rewinds(store: EventStore) -> None:
    kept = _conversation(store)
    changes = store.info_changes("s1")
    # The change made before the rewind was made to s1: it stays s1's, though the row
    # it was recorded on now holds the kept line.
    assert [(c.session, c.actor, c.changes) for c in changes] == [
        ("s1", "user:ada", {"title": "<b>Mugs</b>", "owner": "user:ada"}),
        ("s1", "admin:bob", {"metadata": {"tenant": "acme"}}),
    ]
    assert changes[0].changed_at < changes[1].changed_at
    # The kept line carries the title ada set, and says so.
    assert store.info(kept).title == "<b>Mugs</b>"
    assert [(c.session, c.actor) for c in store.info_changes(kept)] == [("s1", "user:ada")]
    store.set_info(kept, title="old try", actor="user:ada")
    assert [(c.session, c.changes) for c in store.info_changes(kept)][-1] == (kept, {"title": "old try"})
    assert len(store.info_changes("s1")) == 2


def test_verify_reports_every_recorded_info_change(store: EventStore) -> None:
    kept = _conversation(store)
    store.append("other", [send(1)])
    store.set_info("other", owner="user:cy", actor="user:cy")
    one = store.verify("s1")
    assert one.ok
    assert [(c.session, c.actor) for c in one.info_changes] == [("s1", "user:ada"), ("s1", "admin:bob")]
    doc = one.to_json()
    assert [c["changes"] for c in doc["info_changes"]] == [
        {"title": "<b>Mugs</b>", "owner": "user:ada"},
        {"metadata": {"tenant": "acme"}},
    ]
    assert all(c["changed_at"].endswith("Z") for c in doc["info_changes"])
    # The JSON keeps every key it had.
    assert {"ok", "problems", "sessions", "events", "snapshots", "notices", "checkpoint"} <= set(doc)
    every = store.verify()
    assert every.ok
    assert sorted((c.session, c.actor) for c in every.info_changes) == [
        ("other", "user:cy"), ("s1", "admin:bob"), ("s1", "user:ada"),
    ]
    assert [(c.session, c.actor) for c in store.verify(kept).info_changes] == [("s1", "user:ada")]
    # Erasure takes the record with it (a title is user text).
    store.erase("other", reason="request")
    assert all(c.session != "other" for c in store.verify().info_changes)


@pytest.mark.parametrize(
    ("target", "column", "value"),
    [
        ("s1", "title", "'Forged'"),
        ("s1", "owner", "NULL"),
        ("s1~1", "metadata", "'{\"tenant\":\"evil\"}'"),
        ("s1~1", "title", "NULL"),
    ],
)
def test_verify_reports_info_columns_edited_behind_its_back(
    store: EventStore, raw_engine: Any, target: str, column: str, value: str
) -> None:
    # After set_info calls, a rewind (which carries the info to the new row) and a
    # set_info after it, the columns are what the records say: no finding.
    kept = _conversation(store)
    store.set_info(kept, metadata={"tenant": "old"}, actor="user:ada")
    store.append("plain", [send(1)])
    assert store.verify().ok
    # Then the database owner edits one column directly.
    from sqlalchemy import text

    with raw_engine.begin() as conn:
        conn.execute(text(f"UPDATE sessions SET {column} = {value} WHERE id = :id"), {"id": target})
    for report in (store.verify(), store.verify(target)):
        assert not report.ok
        found = [(p.session, p.kind) for p in report.problems]
        assert found == [(target, "info-edited")]
        assert column in report.problems[0].message
    other = "s1" if target == kept else kept
    assert store.verify(other).ok and store.verify("plain").ok


def test_the_report_shows_who_set_the_info_escaped(store: EventStore) -> None:
    _conversation(store)
    store.set_info("s1", title="\u202eevil", actor="user:\u200bada")
    page = store.report("s1")
    assert "Title, owner or metadata set" in page
    assert "&lt;b&gt;Mugs&lt;/b&gt;" in page and "<b>Mugs</b>" not in page
    assert "admin:bob" in page and "tenant" in page
    # Invisible and reordering characters are shown as escapes, never passed through.
    assert "\u202e" not in page and "\\u202e" in page
    assert "\u200b" not in page and "\\u200b" in page


def test_history_json_places_info_changes_among_the_events(db_url: str, twin: str) -> None:
    if twin == "async":
        pytest.skip("the CLI has one store")
    with make_store(db_url) as store:
        _conversation(store)
    doc = json.loads(run_cli("history", "s1", "--json", db=db_url).stdout)
    events = [e for e in doc if "record" not in e]
    # The events are exactly what they were, every key kept.
    with make_store(db_url) as store:
        assert events == [e.to_json() for e in store.history("s1")]
    rows = [(e.get("record", "event"), e["version"], e.get("actor")) for e in doc]
    assert rows == [
        ("event", 1, None), ("event", 2, None),
        ("info", 2, "user:ada"), ("info", 2, "admin:bob"),
        ("event", 3, None), ("event", 4, None),
    ]
    info = doc[2]
    assert info["type"] == "set_info" and info["session"] == "s1"
    assert info["changes"] == {"title": "<b>Mugs</b>", "owner": "user:ada"}
    assert info["recorded_at"].endswith("Z")
    # A window of the history shows the changes made within it only.
    assert [e.get("record", "event") for e in json.loads(run_cli("history", "s1@1", "--json", db=db_url).stdout)] == ["event"]
    window = json.loads(run_cli("history", "s1", "--from", "2", "-n", "1", "--json", db=db_url).stdout)
    assert [e.get("record", "event") for e in window] == ["event"]
    tail = json.loads(run_cli("history", "s1", "-n", "3", "--last", "--json", db=db_url).stdout)
    assert [(e.get("record", "event"), e["version"]) for e in tail] == [
        ("event", 2), ("info", 2), ("info", 2), ("event", 3), ("event", 4),
    ]
    # verify --json carries them too; its human output names who and what.
    v = json.loads(run_cli("verify", "s1", "--json", db=db_url).stdout)
    assert [c["actor"] for c in v["info_changes"]] == ["user:ada", "admin:bob"]
    human = run_cli("verify", "s1", db=db_url).stdout
    assert "info: set by 'admin:bob'" in human and "rewound:" in human


def test_interleave_info_keeps_changes_before_the_first_event_and_after_the_last() -> None:
    from eventstore import interleave_info
    from eventstore.core.records import InfoChange, RecordedEvent, to_datetime

    def ev(v: int, at: int) -> RecordedEvent:
        return RecordedEvent(
            session_id="s", version=v, event_id=None, type="stop", action={"type": "stop"}, turn=0,
            recorded_at=to_datetime(at), actor=None, metadata=None, hash="00",
        )

    changes = [InfoChange("s", t, None, {"title": str(t)}) for t in (5, 10, 15, 25, 30)]
    listed = interleave_info([ev(1, 10), ev(2, 20)], changes, start=0)
    assert [(e.get("record", "event"), e["version"]) for e in listed] == [
        ("info", 0), ("event", 1), ("info", 1), ("info", 1), ("event", 2), ("info", 2), ("info", 2),
    ]
    # A window holds the changes made while the head was one of its versions.
    window = interleave_info([ev(2, 20)], changes, start=1, since=to_datetime(20), until=to_datetime(30))
    assert [(e.get("record", "event"), e["version"], e.get("changes")) for e in window] == [
        ("event", 2, None), ("info", 2, {"title": "25"}),
    ]
