"""Erasure takes a session's rows before its events, as every other writer does.

The background sealer (and compaction) lock a session's row and then delete that session's
event rows; an erasure that deleted the events first and the session rows second waited on
the sealer while the sealer waited on it: PostgreSQL's deadlock detector then failed one of
them. PostgreSQL only: SQLite serializes writers on the database lock.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from eventstore import EventStore
from eventstore.samples import chat_session
from eventstore.storage import open_storage

from conftest import _psycopg_dsn, wait_until


class _RollBack(Exception):
    """Ends the holder's transaction without committing it."""


def test_an_erasure_waits_for_a_sealer_holding_the_session_instead_of_deadlocking(
    pg_schema: str,
) -> None:
    with EventStore(pg_schema, seal=False) as store:
        store.migrate()
        store.append("s1", chat_session(turns=2, seed=3))
        head = store.head("s1")
    storage = open_storage(pg_schema)
    try:
        with storage.read() as tx:
            row = storage.session(tx, id="s1")
        assert row is not None
        outcome: dict[str, Any] = {}

        def erase() -> None:
            try:
                with storage.write() as tx:
                    outcome["erasure"] = storage.erase_session(
                        tx, row.pk, erased_at=0, actor="ops", reason="request"
                    )
            except BaseException as exc:  # handed to the test's thread
                outcome["error"] = exc

        with psycopg.connect(_psycopg_dsn(pg_schema), autocommit=True) as watcher:
            def erasure_waits() -> bool:
                waiting = watcher.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                return waiting.fetchone()[0] > 0

            try:
                # What the sealer does: hold the session's row, then delete its events.
                with storage.write() as holder:
                    assert storage.session(holder, pk=row.pk, lock=True) is not None
                    eraser = threading.Thread(target=erase)
                    eraser.start()
                    wait_until(erasure_waits, "the erasure to wait for the session's row")
                    deleted = storage.compact(
                        holder, row.pk, upto=head - 1, keep_upto=0,
                        baseline_hash=bytes(32), baseline_turn=1,
                    )
                    assert deleted > 0
                    raise _RollBack
            except _RollBack:
                pass
            eraser.join(timeout=60)
            assert not eraser.is_alive()
    finally:
        storage.close()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["erasure"].events == head
