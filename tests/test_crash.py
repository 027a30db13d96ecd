"""Crash mid-append: a writer process killed with SIGKILL in the middle of a large batch
leaves no trace of the batch, and the same append retried with the same ``event_ids``
lands exactly once — on PostgreSQL and on SQLite.

The writer is a separate process (``python -c``) so that the kill is real: no ``finally``,
no rollback from the client, a half-written WAL on SQLite and a dead socket on PostgreSQL.
Two ways to pick the moment:

- *instrumented*: the database itself pauses the child's append right after a chosen row
  (half of the batch's events, or the 5th snapshot after the head moved) — a TEMP trigger
  calling back into the child on SQLite, a trigger running ``pg_sleep`` for the child's
  ``application_name`` only on PostgreSQL — and the child is killed there. Deterministic,
  and blind to how the storage layer issues its statements.
- *observed*: nothing in the child; the parent watches the database until the child holds
  its write lock (PostgreSQL: a RowExclusiveLock on ``events`` held by the child's backend;
  SQLite: the file's write lock), waits a random moment, and kills.
"""

from __future__ import annotations

import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from eventstore.core.reducer import fold
from eventstore.samples import chat_session, random_actions
from eventstore import EventStore

PREFIX = 10  # events already in the session before the big batch
BATCH = chat_session(turns=15, seed=6)  # ≈ 1,300 actions in one append
IDS = [f"batch-{i}" for i in range(len(BATCH))]

CHILD = r"""
import sqlite3, sqlite3.dbapi2, sys, time
from eventstore.samples import chat_session
from eventstore import EventStore

url, session, pause_table, pause_version = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if url.startswith("sqlite") and pause_table != "-":
    # Stop inside the transaction, after the row `pause_version` of `pause_table` was
    # inserted: a TEMP trigger of this connection calls back into Python, which sleeps.
    def pause(version):
        print("MID", flush=True)
        time.sleep(3600)

    _connect = sqlite3.connect

    def connect(*args, **kwargs):
        conn = _connect(*args, **kwargs)
        conn.create_function("es_pause", 1, pause)
        conn.execute(
            f"CREATE TEMP TRIGGER es_pause AFTER INSERT ON main.{pause_table} "
            f"WHEN NEW.version = {pause_version} BEGIN SELECT es_pause(NEW.version); END"
        )
        return conn

    sqlite3.connect = sqlite3.dbapi2.connect = connect  # SQLAlchemy calls the dbapi2 one
actions = chat_session(turns=15, seed=6)
ids = [f"batch-{i}" for i in range(len(actions))]
store = EventStore(url, snapshot_every=64)
store.head(session)  # connect before the parent starts watching
print("READY", flush=True)
r = store.append(session, actions, expected_version=%d, event_ids=ids)
print("DONE", r.version, flush=True)
""" % PREFIX

# PostgreSQL: the same pause as a trigger in the test's schema, firing only for the child's
# connection (its application_name), so the parent's retry goes through.
PG_PAUSE = """
CREATE FUNCTION es_pause() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('application_name') = TG_ARGV[0] AND NEW.version = TG_ARGV[1]::int THEN
        -- Long enough to be seen and killed; bounded, because a busy backend notices a
        -- dead client only when it next talks to it (client_connection_check_interval
        -- helps, but not reliably while pipelined input is still queued).
        PERFORM pg_sleep(2);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER es_pause AFTER INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION es_pause('{tag}', '{version}');
"""


def _url_for_child(db_url: str, backend: str, tag: str) -> str:
    if backend == "sqlite":
        return db_url
    # A dead client is noticed even while its backend is busy (PostgreSQL >= 14), so the
    # killed writer's transaction is rolled back at once instead of after the pause.
    # (libpq decodes %20, not '+', so the option is spliced in rather than re-rendered.)
    check = "-cclient_connection_check_interval%3D100"
    if "options=" in db_url:
        url = db_url.replace("options=", f"options={check}%20", 1)
    else:
        url = f"{db_url}{'&' if '?' in db_url else '?'}options={check}"
    return f"{url}&application_name={tag}"


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        pytest.fail(f"writer said nothing for {timeout}s; stderr: {proc.stderr.read() if proc.stderr else ''}")
    return proc.stdout.readline().strip()


def _spawn(url: str, session: str, pause_table: str = "-", pause_version: int = 0) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, session, pause_table, str(pause_version)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = _readline(proc, 60)
    assert line == "READY", (line, proc.stderr.read() if proc.stderr else "")
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def _assert_untouched(store: EventStore, db_url: str, backend: str, session: str) -> None:
    """Nothing of the batch is visible: head, history, raw rows, snapshots, integrity."""
    assert store.head(session) == PREFIX
    events = list(store.history(session))
    assert [e.version for e in events] == list(range(1, PREFIX + 1))
    assert all(e.event_id is None or not e.event_id.startswith("batch-") for e in events)
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            pk = conn.execute(text("SELECT pk FROM sessions WHERE id = :s"), {"s": session}).scalar()
            rows = conn.execute(text("SELECT count(*), max(version) FROM events WHERE session_pk = :pk"), {"pk": pk}).one()
            assert tuple(rows) == (PREFIX, PREFIX)
            snap = conn.execute(text("SELECT max(version) FROM snapshots WHERE session_pk = :pk"), {"pk": pk}).scalar()
            assert snap is None or snap <= PREFIX
            if backend == "sqlite":
                assert conn.execute(text("PRAGMA integrity_check")).scalar() == "ok"
                assert conn.execute(text("PRAGMA foreign_key_check")).all() == []
    finally:
        engine.dispose()
    assert store.verify(session).ok


def _retry_lands_once(store: EventStore, session: str, prefix: list[dict[str, Any]]) -> None:
    started = time.monotonic()
    first = store.append(session, BATCH, expected_version=PREFIX, event_ids=IDS)
    assert time.monotonic() - started < 20, "the killed writer's lock was held too long"
    assert not first.replayed
    assert (first.first_version, first.version) == (PREFIX + 1, PREFIX + len(BATCH))
    again = store.append(session, BATCH, expected_version=PREFIX, event_ids=IDS)
    assert again.replayed and again == first
    events = list(store.history(session))
    assert [e.version for e in events] == list(range(1, PREFIX + len(BATCH) + 1))
    assert [e.event_id for e in events[PREFIX:]] == IDS
    assert [e.action for e in events] == prefix + BATCH
    assert store.load(session).to_json() == fold(prefix + BATCH).to_json()
    assert store.verify(session).ok


@pytest.fixture
def prepared(db_url: str) -> Any:
    store = EventStore(db_url, snapshot_every=64)
    store.migrate()
    prefix = random_actions(random.Random(60), PREFIX)
    store.append("s", prefix, expected_version=0)
    yield store, prefix
    store.close()


def _paused_in_server(admin: Any, tag: str) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event = 'PgSleep'",
        (tag,),
    ).fetchone()
    return bool(row[0])


@pytest.mark.parametrize(
    "table, version",
    [("events", PREFIX + len(BATCH) // 2), ("snapshots", 5 * 64)],
    ids=["half-the-events-inserted", "events-head-and-5-snapshots-written"],
)
def test_sigkill_at_a_chosen_point_leaves_no_partial_batch(
    prepared: Any, db_url: str, backend: str, table: str, version: int
) -> None:
    store, prefix = prepared
    tag = f"crash-{uuid.uuid4().hex[:8]}"
    if backend == "postgresql":
        admin = _admin(db_url, backend)
        proc = None
        try:
            admin.execute(PG_PAUSE.format(table=table, tag=tag, version=version))
            proc = _spawn(_url_for_child(db_url, backend, tag), "s")
            deadline = time.monotonic() + 60
            while not _paused_in_server(admin, tag):
                assert proc.poll() is None, f"the writer finished before the pause: {proc.stdout.read() if proc.stdout else ''}"
                assert time.monotonic() < deadline, "the writer never reached the pause"
                time.sleep(0.005)
            _kill(proc)
            # The server notices the dead client by itself and rolls its transaction back.
            deadline = time.monotonic() + 15
            while True:
                left = admin.execute(
                    "SELECT pid, state, wait_event, query FROM pg_stat_activity WHERE application_name = %s",
                    (tag,),
                ).fetchall()
                if not left:
                    break
                assert time.monotonic() < deadline, f"the dead writer's backend lives on: {left}"
                time.sleep(0.02)
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
            # Never leave a paused backend behind (it would block the schema's teardown).
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (tag,))
            admin.close()
    else:
        proc = _spawn(_url_for_child(db_url, backend, tag), "s", table, version)
        assert _readline(proc, 60) == "MID"
        _kill(proc)
    _assert_untouched(store, db_url, backend, "s")
    _retry_lands_once(store, "s", prefix)


def _holds_write_lock(db_url: str, backend: str, tag: str, admin: Any) -> bool:
    if backend == "postgresql":
        return bool(
            admin.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "JOIN pg_class c ON c.oid = l.relation "
                "WHERE a.application_name = %s AND c.relname = 'events' "
                "AND l.mode = 'RowExclusiveLock' AND l.granted",
                (tag,),
            ).fetchone()[0]
        )
    try:
        admin.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        assert "locked" in str(exc)
        return True
    admin.execute("ROLLBACK")
    return False


def _admin(db_url: str, backend: str) -> Any:
    if backend == "postgresql":
        import psycopg

        return psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    conn = sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=0, isolation_level=None)
    return conn


def test_sigkill_at_an_observed_moment_leaves_no_partial_batch(prepared: Any, db_url: str, backend: str) -> None:
    """No instrumentation: kill as soon as the writer is seen holding its write lock (after
    a short random delay), a few times; each kill leaves all of the batch or none of it."""
    store, prefix = prepared
    admin = _admin(db_url, backend)
    killed_mid = 0
    try:
        for delay in (0.0, 0.0, 0.003, 0.01):
            tag = f"crash-{uuid.uuid4().hex[:8]}"
            proc = _spawn(_url_for_child(db_url, backend, tag), "s")
            deadline = time.monotonic() + 30
            while not _holds_write_lock(db_url, backend, tag, admin):
                if proc.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.0005)
            time.sleep(delay)
            if proc.poll() is None:
                _kill(proc)
            head = store.head("s")
            assert head in (PREFIX, PREFIX + len(BATCH)), f"a partial batch: head {head}"
            if head == PREFIX:
                killed_mid += 1
                _assert_untouched(store, db_url, backend, "s")
            else:  # it committed before the kill: then all of it is there, once
                break
    finally:
        admin.close()
    assert killed_mid >= 1, "the writer always committed before the kill"
    if store.head("s") == PREFIX:
        _retry_lands_once(store, "s", prefix)
    else:
        assert [e.event_id for e in store.history("s")][PREFIX:] == IDS
        again = store.append("s", BATCH, expected_version=PREFIX, event_ids=IDS)
        assert again.replayed and store.head("s") == PREFIX + len(BATCH)
        assert store.verify("s").ok
