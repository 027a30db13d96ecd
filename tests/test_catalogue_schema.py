"""The catalogue's schema: revision 0007 backfills existing sessions, and on PostgreSQL a
page of sessions is an index scan, not a scan of every session."""

from __future__ import annotations

from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, text
from sqlalchemy.dialects import postgresql

from conftest import make_store
from eventstore.storage.catalogue import page_query
from eventstore.storage.migrate import alembic_config


def _infos(store: Any) -> list[tuple[Any, ...]]:
    return [(s.id, s.status, s.title, s.updated_at, s.turns) for s in store.sessions()]


@pytest.mark.migrations  # downgrades and upgrades: Alembic's own schema
def test_revision_0007_backfills_existing_sessions(db_url: str, raw_engine: Engine) -> None:
    with make_store(db_url, snapshot_every=3) as store:
        store.append("a", [{"type": "send", "id": "u1", "text": "first"}, {"type": "part", "part": {"type": "finish"}}])
        store.append("a", [{"type": "send", "id": "u2", "text": "second"}])
        store.append("b", [{"type": "part", "part": {"type": "message-start", "messageId": "m"}}])
        store.append("c", [{"type": "send", "id": "u1", "text": "x"}, {"type": "reset"}, {"type": "retry"}])
        store.branch("a", at=2, new_id="a-early")
        store.append("a-early", [{"type": "part", "part": {"type": "error", "error": "e"}}])
        store.branch("a", at=1, new_id="a-first")
        before = _infos(store)
    assert [(i[0], i[1], i[2]) for i in before] == [
        ("a", "streaming", "first"),
        ("b", "idle", None),
        ("c", "idle", None),
        ("a-early", "error", "first"),
        ("a-first", "streaming", "first"),
    ]
    with raw_engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0006_notify_after_commit")
    with make_store(db_url) as store:  # upgraded again: the columns are backfilled
        after = _infos(store)
    # A branch without events of its own is dated by its newest inherited event then.
    assert [i[:3] + i[4:] for i in after] == [i[:3] + i[4:] for i in before]
    assert [i[3] for i in after if i[0] in ("a", "b", "c", "a-early")] == [
        i[3] for i in before if i[0] in ("a", "b", "c", "a-early")
    ]


def _plan(engine: Engine, **listing: Any) -> str:
    args: dict[str, Any] = {
        "owner": None,
        "metadata": {},
        "query": None,
        "status": None,
        "order": "recent",
        "include_lines": False,
        "after": None,
        "limit": 51,
    }
    args.update(listing)
    _, stmt, params = page_query("postgresql", **args)
    sql = stmt.compile(dialect=postgresql.dialect())
    with engine.connect() as conn:
        explain = conn.exec_driver_sql(f"EXPLAIN {sql}", {**sql.params, **params})
        return "\n".join(r[0] for r in explain)


def test_a_page_is_an_index_scan_on_postgresql(pg_schema: str) -> None:
    from sqlalchemy import create_engine

    make_store(pg_schema).close()
    engine = create_engine(pg_schema)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO sessions (id, head, head_hash, head_turn, created_at, updated_at,"
                    " owner, status, first_text)"
                    " SELECT 's' || i, 0, '\\x00'::bytea, 0, i, (i * 7919) % 50000,"
                    " CASE WHEN i % 10 = 0 THEN 'user:big' ELSE 'user:' || (i % 900) END,"
                    " CASE WHEN i % 3 = 0 THEN 'idle' ELSE 'streaming' END, 'title ' || i"
                    " FROM generate_series(1, 50000) AS i"
                )
            )
            conn.execute(text("ANALYZE sessions"))
        # An owner with 50 sessions (PostgreSQL may fetch them by owner and sort them) and
        # one with 5,000: either way an index of the owner, never every session.
        cases = [
            ({"owner": "user:7"}, "ix_sessions_owner_"),
            ({"owner": "user:7", "order": "created"}, "ix_sessions_owner_"),
            ({"owner": "user:big"}, "ix_sessions_owner_recent"),
            ({"owner": "user:big", "after": (40000, "s9")}, "ix_sessions_owner_recent"),
            ({"owner": "user:big", "order": "created"}, "ix_sessions_"),  # either created index
            ({"owner": "user:big", "status": "idle", "query": "title"}, "ix_sessions_owner_"),
            ({"owner": "user:big", "metadata": {"tenant": '"acme"'}}, "ix_sessions_owner_"),
            ({}, "ix_sessions_recent"),
            ({"after": (40000, "s9")}, "ix_sessions_recent"),
            ({"order": "created", "after": (400, "s400")}, "ix_sessions_created"),
        ]
        for listing, index in cases:
            plan = _plan(engine, **listing)
            assert index in plan, (listing, plan)
            assert "Seq Scan on sessions" not in plan, (listing, plan)
    finally:
        engine.dispose()
