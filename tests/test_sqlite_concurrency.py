"""SQLite under concurrency: several processes writing one file get success or a clear,
retryable "busy" ``StorageError`` once the busy timeout has passed — never corruption, never
a lost or doubled acknowledged event (``PRAGMA integrity_check`` is ``ok`` afterwards)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventstore.errors import StorageError
from eventstore import EventStore

WORKER = r"""
import json, sys, time
from eventstore.errors import ConcurrencyError, StorageError
from eventstore import EventStore

url, me, batches, busy_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store = EventStore(url, snapshot_every=8, busy_timeout_ms=busy_ms)
acked, busy, conflicts, other, messages = [], 0, 0, [], set()
for i in range(batches):
    # Half of the batches go to a session every worker shares (with expected_version, so
    # they race for versions), half to the worker's own session.
    shared = i % 2 == 0
    session = "shared" if shared else f"own-{me}"
    n = 1 + i % 4
    ids = [f"w{me}-{i}-{k}" for k in range(n)]
    actions = [{"type": "send", "id": ids[k], "text": f"{me}.{i}.{k}"} for k in range(n)]
    while True:
        try:
            expected = store.head(session) if shared else None
        except StorageError as exc:
            if not exc.retryable:
                other.append(repr(exc)); break
            busy += 1; messages.add(str(exc).split(":")[-1].strip()); continue
        except Exception as exc:  # SessionNotFound for a new session
            expected = 0 if type(exc).__name__ == "SessionNotFound" else None
            if expected is None:
                other.append(repr(exc)); break
        try:
            store.append(session, actions, expected_version=expected, event_ids=ids)
            acked.append([session, ids]); break
        except ConcurrencyError:
            conflicts += 1
        except StorageError as exc:
            if not exc.retryable:
                other.append(repr(exc)); break
            busy += 1
            messages.add(str(exc).split(":")[-1].strip())
        except Exception as exc:
            other.append(repr(exc)); break
print(json.dumps({"acked": acked, "busy": busy, "conflicts": conflicts, "other": other, "messages": sorted(messages)}))
"""


def _integrity(path: Path) -> None:
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert con.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        con.close()


def test_processes_writing_one_file_never_corrupt_it(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    url = f"sqlite:///{path}"
    with EventStore(url) as store:
        store.migrate()
    workers, batches = 4, 40
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, str(w), str(batches), "20"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        reports.append(json.loads(out))
    assert all(r["other"] == [] for r in reports), [r["other"] for r in reports]
    # Busy errors are expected with a 20 ms timeout; each is the clear, retryable kind.
    for r in reports:
        assert all("locked" in m or "busy" in m for m in r["messages"]), r["messages"]
    _integrity(path)
    with EventStore(url) as store:
        assert store.verify().ok
        for session in ["shared"] + [f"own-{w}" for w in range(workers)]:
            expected = [i for r in reports for s, ids in r["acked"] if s == session for i in ids]
            got = [e.event_id for e in store.history(session)]
            assert sorted(got) == sorted(expected)  # every acknowledged event, exactly once
            assert len(set(got)) == len(got)
            assert [e.version for e in store.history(session)] == list(range(1, len(got) + 1))
        assert sum(len(r["acked"]) for r in reports) == workers * batches
    print({"busy": [r["busy"] for r in reports], "conflicts": [r["conflicts"] for r in reports]})


def test_a_held_write_lock_gives_a_clear_busy_error_after_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}"
    with EventStore(url, busy_timeout_ms=300) as store:
        store.migrate()
        store.append("s", [{"type": "stop"}])
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process's writer, stuck
        try:
            started = time.monotonic()
            with pytest.raises(StorageError) as info:
                store.append("s", [{"type": "retry"}], event_ids=["r1"])
            waited = time.monotonic() - started
            assert 0.25 <= waited < 10, waited
            exc = info.value
            assert exc.retryable is True
            assert "locked" in str(exc) or "busy" in str(exc), str(exc)
            assert "try again" in str(exc) and str(path) in str(exc)
            # Readers are not blocked by a writer (WAL): they see the last commit.
            assert store.head("s") == 1 and store.load("s").status == "idle"
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        # The lock is gone: the same append with the same id lands once.
        assert store.append("s", [{"type": "retry"}], event_ids=["r1"]).version == 2
        assert store.append("s", [{"type": "retry"}], event_ids=["r1"]).replayed
        assert store.verify("s").ok
    _integrity(path)


def test_a_writer_killed_while_holding_the_lock_frees_the_file(tmp_path: Path) -> None:
    path = tmp_path / "killed.db"
    url = f"sqlite:///{path}"
    with EventStore(url, busy_timeout_ms=5_000) as store:
        store.migrate()
        store.append("s", [{"type": "stop"}])
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
         "c.execute('BEGIN IMMEDIATE'); c.execute('INSERT INTO snapshot_blobs (digest, body) VALUES (?, ?)', (b'0', b'0')); "
         "print('LOCKED', flush=True); time.sleep(3600)", str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "LOCKED"
    holder.kill()
    holder.wait(30)
    with EventStore(url, busy_timeout_ms=5_000) as store:
        assert store.append("s", [{"type": "retry"}]).version == 2
        assert store.verify("s").ok
    _integrity(path)
