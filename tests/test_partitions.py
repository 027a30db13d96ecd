"""Session-keyed hash partitions of the event and snapshot tables (PostgreSQL only).

The whole store contract suite also runs on this schema (backend id
``postgresql-partitioned`` in tests/test_store_contract.py); these tests check the shape
of the schema, its guards, and the option's refusals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from eventstore.errors import ConcurrencyError, SchemaError, StorageError
from eventstore.samples import chat_session
from eventstore import EventStore


def _rows(url: str, sql: str) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql)).all())
    finally:
        engine.dispose()


def test_migrate_creates_partitions_keyed_by_session(pg_schema: str) -> None:
    with EventStore(pg_schema, partitions=4) as store:
        store.migrate()
        store.migrate()  # idempotent with the same count
        for i in range(12):
            store.append(f"s{i}", chat_session(1, seed=i, deltas=3), actor="t")
        store.branch("s1", at=2, new_id="s1-b")
        with pytest.raises(ConcurrencyError):
            store.append("s1", [{"type": "stop"}], expected_version=2)
        assert store.verify().ok
    parts = _rows(
        pg_schema,
        "SELECT p.relname, count(c.oid) FROM pg_class p "
        "JOIN pg_inherits i ON i.inhparent = p.oid JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE p.relkind = 'p' AND p.relnamespace = current_schema()::regnamespace "
        "GROUP BY p.relname ORDER BY 1",
    )
    assert parts == [("events", 4), ("snapshots", 4)]
    # Every unique key of a partitioned table includes the session column.
    keys = _rows(
        pg_schema,
        "SELECT t.relname, x.relname, a.attname = ANY(ARRAY['session_pk']) "
        "FROM pg_index ix JOIN pg_class x ON x.oid = ix.indexrelid "
        "JOIN pg_class t ON t.oid = ix.indrelid "
        "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = ix.indkey[0] "
        "WHERE ix.indisunique AND t.relname IN ('events', 'snapshots') "
        "AND t.relnamespace = current_schema()::regnamespace",
    )
    assert len(keys) == 3 and all(k[2] for k in keys)
    # One session's rows all live in one partition.
    spread = _rows(
        pg_schema,
        "SELECT session_pk, count(DISTINCT tableoid) FROM events GROUP BY session_pk",
    )
    assert len(spread) == 12 and {n for _, n in spread} == {1}


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events_p0 SET actor = 'mallory'",
        "DELETE FROM events_p1",
        "TRUNCATE events_p2",
        "TRUNCATE events CASCADE",
        "UPDATE events SET payload = payload",
    ],
)
def test_partitions_keep_the_events_immutable(pg_schema: str, statement: str) -> None:
    with EventStore(pg_schema, partitions=4) as store:
        store.migrate()
        for i in range(8):
            store.append(f"s{i}", [{"type": "send", "id": "u-1", "text": "hi"}])
    before = _rows(pg_schema, "SELECT count(*) FROM events")
    engine = create_engine(pg_schema)
    try:
        with pytest.raises(Exception, match="immutable"):
            with engine.begin() as conn:
                conn.execute(text(statement))
    finally:
        engine.dispose()
    assert _rows(pg_schema, "SELECT count(*) FROM events") == before == [(8,)]


def test_partitions_that_differ_from_the_existing_tables_are_refused(pg_schema: str) -> None:
    with EventStore(pg_schema) as plain:
        plain.migrate()
        plain.append("s1", [{"type": "send", "id": "u-1", "text": "hi"}])
    with EventStore(pg_schema, partitions=4) as store:
        with pytest.raises(SchemaError, match="no partitions, not 4"):
            store.migrate()
        assert store.head("s1") == 1  # nothing changed; the store still works
    other = pg_schema + "%20-ceventstore.partitions%3D8"
    with EventStore(other) as store:
        with pytest.raises(SchemaError, match="docs/scaling.md"):
            store.migrate()


@pytest.mark.parametrize("value", [-1, 1025, "4", 2.0, True])
def test_a_bad_partition_count_is_refused(value: Any) -> None:
    with pytest.raises(StorageError, match="partitions"):
        EventStore("postgresql+psycopg://u@127.0.0.1:1/db", partitions=value)


def test_a_bad_partition_setting_is_refused_by_migrate(pg_schema: str) -> None:
    with EventStore(pg_schema + "%20-ceventstore.partitions%3Dmany") as store:
        with pytest.raises(StorageError, match="eventstore.partitions"):
            store.migrate()
        with pytest.raises(SchemaError, match="no eventstore schema"):
            store.check_schema()


def test_partitions_on_sqlite_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="partitions needs PostgreSQL"):
        EventStore(f"sqlite:///{tmp_path / 'x.db'}", partitions=4)
    EventStore(f"sqlite:///{tmp_path / 'y.db'}", partitions=0).close()
