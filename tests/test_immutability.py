"""The database itself refuses to change recorded events, and verify() catches tampering."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from conftest import make_store
from eventstore.samples import random_actions
import frozen_ddl
from eventstore import EventStore

# These tests edit and delete rows of `events` directly: every event stays a row.
pytestmark = pytest.mark.unsealed


def _fill(store: EventStore) -> list[dict[str, Any]]:
    actions = random_actions(random.Random(11), 40)
    store.append("s1", actions[:20])
    store.append("s1", actions[20:])
    return actions


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE events SET payload = payload WHERE version = 3",
        "UPDATE events SET actor = 'mallory'",
        "UPDATE events SET version = version + 1000 WHERE version = 40",
        "DELETE FROM events WHERE version = 40",
        "DELETE FROM events",
    ],
)
def test_raw_update_and_delete_are_refused_by_the_database(
    store: EventStore, raw_engine: Engine, sql: str
) -> None:
    _fill(store)
    before = [e.to_json() for e in store.history("s1")]
    with pytest.raises(DBAPIError, match="immutable"):
        with raw_engine.begin() as conn:
            conn.execute(text(sql))
    assert [e.to_json() for e in store.history("s1")] == before
    assert store.verify("s1").ok


def test_truncate_is_refused_on_postgresql(
    store: EventStore, raw_engine: Engine, backend: str
) -> None:
    _fill(store)
    if backend == "postgresql":
        with pytest.raises(DBAPIError, match="immutable"):
            with raw_engine.begin() as conn:
                conn.execute(text("TRUNCATE events CASCADE"))
    else:  # SQLite has no TRUNCATE; its "DELETE FROM events" is refused above.
        with pytest.raises(DBAPIError):
            with raw_engine.begin() as conn:
                conn.execute(text("TRUNCATE events"))
    assert store.head("s1") == 40 and len(list(store.history("s1"))) == 40


def test_a_forged_permit_outside_compaction_is_still_needed_per_session(
    store: EventStore, raw_engine: Engine
) -> None:
    # The permit is the only door: a permit for another session does not open this one.
    _fill(store)
    store.append("other", [{"type": "stop"}])
    with pytest.raises(DBAPIError, match="immutable"):
        with raw_engine.begin() as conn:
            pk = conn.execute(text("SELECT pk FROM sessions WHERE id = 'other'")).scalar()
            conn.execute(text("INSERT INTO compaction_permits VALUES (:pk, 1000)"), {"pk": pk})
            conn.execute(
                text(
                    "DELETE FROM events WHERE session_pk = (SELECT pk FROM sessions WHERE id = 's1')"
                )
            )
    assert store.head("s1") == 40 and len(list(store.history("s1"))) == 40


@contextmanager
def _triggers_off(engine: Engine, backend: str) -> Iterator[Any]:
    """Tamper as an attacker with DDL rights would: switch the guard off, then back on."""
    with engine.begin() as conn:
        if backend == "postgresql":
            conn.execute(text("ALTER TABLE events DISABLE TRIGGER USER"))
        else:
            for stmt in frozen_ddl.sqlite_drop_immutability():
                conn.execute(text(stmt))
        yield conn
        if backend == "postgresql":
            conn.execute(text("ALTER TABLE events ENABLE TRIGGER USER"))
        else:
            for stmt in frozen_ddl.sqlite_immutability():
                conn.execute(text(stmt))


def test_verify_is_ok_on_good_data_and_names_the_tampered_event(
    store: EventStore, raw_engine: Engine, backend: str
) -> None:
    _fill(store)
    store.branch("s1", at=30, new_id="b")
    store.append("b", [{"type": "retry"}, {"type": "stop"}])
    report = store.verify()
    assert report.ok and report.problems == [] and report.events == 40 + 32
    with _triggers_off(raw_engine, backend) as conn:
        conn.execute(
            text(
                "UPDATE events SET payload = :p WHERE version = 7 "
                "AND session_pk = (SELECT pk FROM sessions WHERE id = 's1')"
            ),
            {"p": b'{"type":"stop"}'},
        )
    report = store.verify("s1")
    assert not report.ok
    assert [p.to_json() for p in report.problems] == [
        {
            "session": "s1",
            "version": 7,
            "kind": "hash-mismatch",
            "message": "session 's1' version 7: hash mismatch (the event or its chain was altered)",
        }
    ]
    # The branch inherits version 7 and says so.
    branch_report = store.verify("b")
    assert len(branch_report.problems) == 1
    found = branch_report.problems[0]
    assert (found.session, found.version, found.kind) == ("b", 7, "hash-mismatch")
    assert "session 's1' version 7" in found.message and "inherited by 'b'" in found.message
    with pytest.raises(DBAPIError, match="immutable"):  # and the guard is back on
        with raw_engine.begin() as conn2:
            conn2.execute(text("UPDATE events SET actor = 'x'"))


def test_verify_detects_a_deleted_event_and_a_rewritten_timestamp(
    store: EventStore, raw_engine: Engine, backend: str
) -> None:
    _fill(store)
    with _triggers_off(raw_engine, backend) as conn:
        conn.execute(text("DELETE FROM events WHERE version = 12"))
        conn.execute(text("UPDATE events SET recorded_at = recorded_at + 1 WHERE version = 30"))
    problems = store.verify("s1").problems
    assert any(p.version == 13 and p.kind == "missing-events" and "missing" in str(p) for p in problems), problems
    assert any(p.version == 30 and p.kind == "hash-mismatch" and "hash mismatch" in str(p) for p in problems), problems


def test_verify_detects_a_snapshot_that_is_not_the_fold_of_its_events(
    db_url: str, raw_engine: Engine
) -> None:
    with make_store(db_url, snapshot_every=10) as store:
        _fill(store)
        assert store.verify("s1").snapshots == 4
        with raw_engine.begin() as conn:
            conn.execute(
                text("UPDATE snapshots SET rest = :r WHERE version = 20"),
                {"r": b'{"status":"error"}'},
            )
        report = store.verify("s1")
    assert [(p.session, p.version, p.kind, p.message) for p in report.problems] == [
        ("s1", 20, "snapshot-mismatch", "session 's1' version 20: snapshot differs from the fold of its events")
    ]
