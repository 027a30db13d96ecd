"""Tamper evidence: whatever a superuser changes behind the library's back, ``verify`` names
the session and the version, and ``eventstore verify`` exits non-zero — on both backends.

The attacker here has full rights: on PostgreSQL a superuser who bypasses the immutability
triggers (``session_replication_role = replica``, which skips every ordinary trigger without
leaving a trace in the table definition); on SQLite someone with write access to the file who
drops the triggers. Every column of an event row is altered in turn, rows are deleted,
swapped and forged, and a hash is recomputed to hide an edit.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from typer.testing import CliRunner

from eventstore.samples import random_actions
import frozen_ddl
from eventstore import EventStore
from eventstore_cli.app import app

N = 30  # events in the tampered session
SNAPSHOT_EVERY = 8


@pytest.fixture
def tamper_store(db_url: str) -> Iterator[EventStore]:
    # Unsealed: these tests alter rows of `events`; tests/test_seal.py tampers with segments.
    with EventStore(db_url, snapshot_every=SNAPSHOT_EVERY, seal=False) as store:
        store.migrate()
        actions = random_actions(random.Random(66), N)
        store.append("victim", actions[:10], event_ids=[f"e{i}" for i in range(10)], actor="alice")
        store.append("victim", actions[10:], metadata={"client": "web"})
        store.append("bystander", actions[:5])
        store.branch("victim", at=20, new_id="fork")
        store.append("fork", [{"type": "retry"}])
        assert store.verify().ok
        yield store


@pytest.fixture
def admin(db_url: str) -> Iterator[Engine]:
    engine = create_engine(db_url)
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def _as_attacker(engine: Engine, backend: str) -> Iterator[Any]:
    """A transaction in which the immutability triggers do not fire."""
    with engine.begin() as conn:
        if backend == "postgresql":
            # Superuser only; affects this transaction alone and leaves no trace in the schema.
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            yield conn
        else:
            for stmt in frozen_ddl.sqlite_drop_immutability():
                conn.execute(text(stmt))
            yield conn
            for stmt in frozen_ddl.sqlite_immutability():
                conn.execute(text(stmt))


def _pk(conn: Any, session: str) -> int:
    return int(conn.execute(text("SELECT pk FROM sessions WHERE id = :s"), {"s": session}).scalar())


def _cli_verify(url: str, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, ["--db", url, "verify", *args])
    return r.exit_code, r.stdout, r.stderr


def _assert_found(store: EventStore, url: str, session: str, version: int, *, also: int | None = None) -> None:
    """verify names (session, version) — or, where noted, the next version — and the CLI fails."""
    report = store.verify(session)
    assert not report.ok
    wanted = {f"session {session!r} version {v}" for v in (version, also) if v is not None}
    assert any(any(p.message.startswith(w + ":") or p.message.startswith(w + " ") for w in wanted) for p in report.problems), (
        wanted,
        report.problems,
    )
    code, out, err = _cli_verify(url, session)
    assert code == 1 and err.startswith("error: ") and "Traceback" not in err
    assert f"version {version}" in out or (also is not None and f"version {also}" in out)
    code, out, _ = _cli_verify(url, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["problems"]
    # Sessions that do not read the altered row stay clean.
    assert store.verify("bystander").ok


COLUMN_EDITS = {
    "payload": ("payload", b'{"type":"stop"}'),
    "type": ("type", "reset"),
    "turn": ("turn", 99),
    "event_id": ("event_id", "forged"),
    "actor": ("actor", "mallory"),
    "metadata": ("metadata", b'{"client":"evil"}'),
    "recorded_at": ("recorded_at", 0),
    "hash": ("hash", b"\x00" * 32),
}


# Each column once, at the start, the middle (inherited by the branch) or the head.
@pytest.mark.parametrize(
    "column, version", [(c, (3, 17, N)[i % 3]) for i, c in enumerate(sorted(COLUMN_EDITS))]
)
def test_any_altered_column_is_named_with_session_and_version(
    tamper_store: EventStore, admin: Engine, db_url: str, backend: str, column: str, version: int
) -> None:
    name, value = COLUMN_EDITS[column]
    with _as_attacker(admin, backend) as conn:
        # Column names come from the fixed table above, not from input.
        n = conn.execute(
            text(f"UPDATE events SET {name} = :v WHERE session_pk = :pk AND version = :ver"),
            {"v": value, "pk": _pk(conn, "victim"), "ver": version},
        ).rowcount
        assert n == 1
    _assert_found(tamper_store, db_url, "victim", version)
    if version <= 20:  # the branch inherits the altered event and says where it lives
        problems = tamper_store.verify("fork").problems
        assert any(
            f"session 'victim' version {version}" in p.message and "inherited by 'fork'" in p.message
            for p in problems
        )


def test_the_triggers_are_back_and_still_refuse(tamper_store: EventStore, admin: Engine, backend: str) -> None:
    with _as_attacker(admin, backend) as conn:
        conn.execute(text("UPDATE events SET actor = 'mallory' WHERE version = 2"))
    for sql in ("UPDATE events SET actor = 'x'", "DELETE FROM events WHERE version = 1"):
        with pytest.raises(DBAPIError, match="immutable"):
            with admin.begin() as conn:
                conn.execute(text(sql))


@pytest.mark.parametrize("version", [1, 15, N])
def test_a_deleted_event_is_named(
    tamper_store: EventStore, admin: Engine, db_url: str, backend: str, version: int
) -> None:
    with _as_attacker(admin, backend) as conn:
        conn.execute(
            text("DELETE FROM events WHERE session_pk = :pk AND version = :v"),
            {"pk": _pk(conn, "victim"), "v": version},
        )
    # A gap is reported at the first missing version (or the next present one).
    _assert_found(tamper_store, db_url, "victim", version, also=version + 1)


def test_swapped_events_are_named(tamper_store: EventStore, admin: Engine, db_url: str, backend: str) -> None:
    with _as_attacker(admin, backend) as conn:
        pk = _pk(conn, "victim")
        for a, b in ((11, 1011), (12, 11), (1011, 12)):
            conn.execute(
                text("UPDATE events SET version = :b WHERE session_pk = :pk AND version = :a"),
                {"a": a, "b": b, "pk": pk},
            )
    _assert_found(tamper_store, db_url, "victim", 11)


def test_an_edit_with_a_recomputed_hash_still_breaks_the_chain(
    tamper_store: EventStore, admin: Engine, db_url: str, backend: str
) -> None:
    """An attacker who rewrites event 9 and recomputes *its* hash is caught at event 10:
    the next link no longer matches. (Rewriting the whole chain up to the head, head hash
    included, is only detectable against a head hash kept elsewhere: docs/security.md.)"""
    from eventstore.core.codec import chain_hash

    with _as_attacker(admin, backend) as conn:
        pk = _pk(conn, "victim")
        prev = bytes(conn.execute(text("SELECT hash FROM events WHERE session_pk = :pk AND version = 8"), {"pk": pk}).scalar())
        row = conn.execute(
            text("SELECT event_id, type, turn, recorded_at, actor, metadata FROM events WHERE session_pk = :pk AND version = 9"),
            {"pk": pk},
        ).one()
        payload = b'{"type":"stop"}'
        forged = chain_hash(
            prev, session_id="victim", version=9, event_id=row[0], type="stop", turn=row[2],
            payload=payload, recorded_at=row[3], actor=row[4], metadata=None if row[5] is None else bytes(row[5]),
        )
        conn.execute(
            text("UPDATE events SET payload = :p, type = 'stop', hash = :h WHERE session_pk = :pk AND version = 9"),
            {"p": payload, "h": forged, "pk": pk},
        )
    report = tamper_store.verify("victim")
    assert any(p.message.startswith("session 'victim' version 10:") for p in report.problems), report.problems
    _assert_found(tamper_store, db_url, "victim", 10)


def test_a_forged_head_event_is_named(tamper_store: EventStore, admin: Engine, db_url: str, backend: str) -> None:
    with _as_attacker(admin, backend) as conn:
        pk = _pk(conn, "victim")
        conn.execute(
            text("UPDATE events SET payload = :p, hash = :h WHERE session_pk = :pk AND version = :v"),
            {"p": b'{"type":"reset"}', "h": hashlib.sha256(b"x").digest(), "pk": pk, "v": N},
        )
    _assert_found(tamper_store, db_url, "victim", N)


def test_a_row_forged_past_the_head_is_named(
    tamper_store: EventStore, admin: Engine, db_url: str, backend: str
) -> None:
    # A plain INSERT needs no trigger bypass: the application role may insert.
    with admin.begin() as conn:
        pk = _pk(conn, "victim")
        conn.execute(
            text(
                "INSERT INTO events (session_pk, version, type, turn, payload, recorded_at, hash)"
                " VALUES (:pk, :v, 'stop', 0, :p, 0, :h)"
            ),
            {"pk": pk, "v": N + 1, "p": b'{"type":"stop"}', "h": hashlib.sha256(b"x").digest()},
        )
    _assert_found(tamper_store, db_url, "victim", N + 1)


def test_an_altered_snapshot_is_named(tamper_store: EventStore, admin: Engine, db_url: str, backend: str) -> None:
    with admin.begin() as conn:  # snapshots carry no trigger: verify is their guard
        n = conn.execute(
            text("UPDATE snapshots SET rest = :r WHERE session_pk = :pk AND version = 16"),
            {"r": b'{"status":"error"}', "pk": _pk(conn, "victim")},
        ).rowcount
        assert n == 1
    _assert_found(tamper_store, db_url, "victim", 16)


def test_a_clean_database_verifies_with_exit_0(tamper_store: EventStore, db_url: str) -> None:
    code, out, err = _cli_verify(db_url)
    assert code == 0, err
    code, out, _ = _cli_verify(db_url, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] is True and doc["problems"] == []
    assert doc["events"] == N + 5 + 21  # victim, bystander, fork (inherited 20 + 1)


def test_the_chain_hash_format_is_pinned() -> None:
    """Stored chains must verify after any upgrade: the envelope's bytes never change.

    The expected digests are SHA-256 over the documented layout, computed by hand here.
    """
    import hashlib

    from eventstore.core.codec import chain_hash

    prev = bytes(range(32))
    header = b'[1,"s",5,null,"part",1,123,null]'
    payload = b'{"type":"stop"}'
    meta = b'{"a":1}'
    body = len(header).to_bytes(4, "big") + header + len(payload).to_bytes(4, "big") + payload
    common = dict(session_id="s", version=5, event_id=None, type="part", turn=1, payload=payload, recorded_at=123, actor=None)
    assert chain_hash(prev, **common, metadata=None) == hashlib.sha256(prev + body + b"\xff" * 4).digest()  # type: ignore[arg-type]
    assert chain_hash(prev, **common, metadata=meta) == hashlib.sha256(  # type: ignore[arg-type]
        prev + body + len(meta).to_bytes(4, "big") + meta
    ).digest()
