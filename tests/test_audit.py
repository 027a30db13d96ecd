"""The audit trail against the people who run the database: compaction records checked by
``verify``, strict and bounded imports, turn numbers, signed checkpoints and erasure.

Attackers here write the database directly. The application role may INSERT events,
sessions, snapshots and blobs and UPDATE a session's head and a snapshot's content (see
docs/security.md); the owner and a superuser may do anything (on PostgreSQL the tests
switch the triggers off with ``session_replication_role = replica``, on SQLite they drop
them). Every store test runs on both backends and on both twins.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from conftest import make_store
from eventstore.core.codec import pack_blob, unpack_blob
from eventstore import (
    Checkpoint,
    CheckpointError,
    EventStore,
    InvalidEvent,
    SessionErased,
    SessionNotFound,
    generate_keypair,
)
from eventstore.core.codec import recorded_hash, state_digest
from eventstore.samples import chat_session
import frozen_ddl
from eventstore.core.rows import ZERO_HASH, EventRow
from eventstore_cli.app import app

pytestmark = pytest.mark.twins

KEYS = generate_keypair()
OTHER_KEYS = generate_keypair()


@contextmanager
def attacker(raw_engine: Engine, backend: str) -> Iterator[Any]:
    """A transaction in which the immutability triggers do not fire (owner or superuser)."""
    with raw_engine.begin() as conn:
        if backend == "postgresql":
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            yield conn
        else:
            for stmt in (*frozen_ddl.sqlite_drop_immutability(), *frozen_ddl.sqlite_drop_audit()):
                conn.execute(text(stmt))
            yield conn
            for stmt in frozen_ddl.sqlite_immutability():
                conn.execute(text(stmt))


def _pk(conn: Any, session: str) -> int:
    return int(conn.execute(text("SELECT pk FROM sessions WHERE id = :s"), {"s": session}).scalar())


def _kinds(report: Any) -> set[tuple[str, str]]:
    return {(p.session, p.kind) for p in report.problems}


# -- break 1: the baseline snapshot is bound to the chain ----------------------------------


def _forge_baseline(raw_engine: Engine, session: str, version: int) -> None:
    """What the application role can do: a new blob and an UPDATE of the snapshot row."""
    with raw_engine.begin() as conn:
        pk = _pk(conn, session)
        md = bytes(
            conn.execute(
                text("SELECT message_digests FROM snapshots WHERE session_pk = :p AND version = :v"),
                {"p": pk, "v": version},
            ).scalar()
        )
        last = md[-16:]
        stored = bytes(conn.execute(text("SELECT body FROM snapshot_blobs WHERE digest = :d"), {"d": last}).scalar())
        body = unpack_blob(stored)
        assert b'"text":"' in body
        forged = pack_blob(body.replace(b'"text":"', b'"text":"FORGED ', 1))
        digest = hashlib.sha256(forged).digest()[:16]
        conn.execute(text("INSERT INTO snapshot_blobs (digest, body) VALUES (:d, :b)"), {"d": digest, "b": forged})
        conn.execute(
            text("UPDATE snapshots SET message_digests = :m WHERE session_pk = :p AND version = :v"),
            {"m": md[:-16] + digest, "p": pk, "v": version},
        )


def test_a_rewritten_baseline_snapshot_fails_verify(store: EventStore, raw_engine: Engine) -> None:
    # Fewer events than snapshot_every: no later snapshot is folded from the baseline.
    store.append("s", chat_session(turns=1, seed=5))
    store.compact("s", upto=24)
    assert store.verify().ok
    _forge_baseline(raw_engine, "s", 24)
    assert "FORGED" in json.dumps(store.load("s", version=24).to_json())  # the forgery is served...
    report = store.verify()
    assert not report.ok  # ...and verify says so
    assert ("s", "baseline-mismatch") in _kinds(report)
    assert any(p.version == 24 for p in report.problems)


def test_a_checkpoint_anchors_the_baseline_state(store: EventStore, raw_engine: Engine, backend: str) -> None:
    store.append("s", chat_session(turns=1, seed=5))
    store.compact("s", upto=24)
    cp = store.checkpoint(KEYS[0])
    assert store.verify(checkpoint=cp, public_key=KEYS[1]).ok
    # The owner rewrites the baseline snapshot AND the digest its compaction recorded.
    _forge_baseline(raw_engine, "s", 24)
    forged = store.load("s", version=24).to_json()
    assert "FORGED" in json.dumps(forged)
    with attacker(raw_engine, backend) as conn:
        conn.execute(
            text("UPDATE compactions SET state_digest = :d WHERE session_pk = :p"),
            {"d": state_digest(forged), "p": _pk(conn, "s")},
        )
    assert store.verify().ok  # consistent with its own record...
    report = store.verify(checkpoint=Checkpoint.from_json(cp.to_json()), public_key=KEYS[1])
    assert not report.ok  # ...but not with the signed anchor
    assert _kinds(report) == {("s", "baseline_rewritten")}


def test_a_baseline_without_compaction_record_is_a_distinct_finding(
    store: EventStore, raw_engine: Engine, backend: str
) -> None:
    store.append("s", chat_session(turns=3, seed=5))
    store.compact("s", upto=24)
    with attacker(raw_engine, backend) as conn:
        conn.execute(text("DELETE FROM compactions"))
    report = store.verify()
    assert not report.ok and _kinds(report) == {("s", "unrecorded-baseline")}


# -- break 5: turns, and rows below the baseline -------------------------------------------


@pytest.mark.unsealed  # the background sealer reads head_turn: the edit would race it
def test_a_moved_head_turn_fails_verify(store: EventStore, raw_engine: Engine) -> None:
    store.append("s", chat_session(turns=2, seed=1))
    with raw_engine.begin() as conn:  # the application role may UPDATE head_turn
        conn.execute(text("UPDATE sessions SET head_turn = 100 WHERE id = 's'"))
    report = store.verify()
    assert _kinds(report) == {("s", "head-turn")}


@pytest.mark.unsealed  # it inserts a row of `events` below the baseline
def test_an_event_forged_below_the_baseline_is_reported_and_not_exported(
    store: EventStore, raw_engine: Engine
) -> None:
    store.append("s", chat_session(turns=3, seed=2))
    store.branch("s", at=10, new_id="b")
    store.compact("s", upto=24)  # 1..10 stay for the branch, 11..24 go
    events = {e.version: e for e in store.history("b")}
    # The application role may INSERT events: a well-chained row at 11, below the baseline.
    forged = EventRow(0, 11, None, "retry", events[10].turn, b'{"type":"retry"}', 1, "mallory", None, b"")
    h = recorded_hash(bytes.fromhex(events[10].hash), "s", forged)
    with raw_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO events (session_pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash)"
                " VALUES (:p, 11, NULL, 'retry', :t, :pl, 1, 'mallory', NULL, :h)"
            ),
            {"p": _pk(conn, "s"), "t": events[10].turn, "pl": forged.payload, "h": h},
        )
    report = store.verify()
    assert _kinds(report) == {("s", "below-baseline")}
    out = io.StringIO()
    store.export("b", out)
    versions = [(o["session"], o["version"]) for o in map(json.loads, out.getvalue().splitlines()) if o.get("kind") == "event"]
    assert ("s", 11) not in versions and ("s", 10) in versions


# -- break 4: one crafted session never stops the audit of the others ----------------------


def test_verify_reports_an_unreadable_session_and_checks_the_others(store: EventStore, raw_engine: Engine) -> None:
    store.append("good", chat_session(turns=2, seed=1))
    store.append("bad", chat_session(turns=2, seed=2))
    with raw_engine.begin() as conn:
        conn.execute(text("UPDATE sessions SET id = :i WHERE id = 'bad'"), {"i": "bad\x01id"})
        conn.execute(
            text("UPDATE snapshots SET rest = :r WHERE session_pk = :p"), {"r": b"\xff not json", "p": _pk(conn, "bad\x01id")}
        )
    report = store.verify()
    assert report.sessions == ["good", "bad\x01id"]
    assert {p.session for p in report.problems} == {"bad\x01id"}
    assert store.verify("good").ok


# -- break 2 and 4: import is as strict as append ------------------------------------------


def _file(store: EventStore, session: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    store.export(session, out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _rechain(objs: list[dict[str, Any]]) -> str:
    """The file with every hash, head and id recomputed: only the validation can refuse it."""
    prev: dict[str, bytes] = {}
    current: dict[str, Any] = {}
    for o in objs[1:]:
        if o["kind"] == "session":
            current = o
            prev[o["id"]] = bytes.fromhex(o["fork_hash"])
        else:
            o["session"] = current["id"]
            action = orjson.dumps(o["action"], option=orjson.OPT_SORT_KEYS)
            meta = None if o["metadata"] is None else orjson.dumps(o["metadata"], option=orjson.OPT_SORT_KEYS)
            row = EventRow(0, o["version"], o["event_id"], o["type"], o["turn"], action, o["recorded_at"], o["actor"], meta, b"")
            h = recorded_hash(prev[current["id"]], current["id"], row)
            o["hash"] = h.hex()
            prev[current["id"]] = h
            current["head_hash"] = h.hex()
    return "\n".join(json.dumps(o) for o in objs) + "\n"


HOSTILE: dict[str, Callable[[list[dict[str, Any]]], None]] = {
    "NUL event id": lambda f: f[2].update(event_id="a\x00b"),
    "100 kB event id": lambda f: f[2].update(event_id="e" * 100_000),
    "1 MB actor": lambda f: f[2].update(actor="a" * (1 << 20)),
    "2 MB action": lambda f: f[2].update(action={"type": "send", "id": "m", "text": "x" * (2 << 20)}),
    "2 MB metadata": lambda f: f[2].update(metadata={"k": "x" * (2 << 20)}),
    "control-character session id": lambda f: [o.update(id="s\x1b[2J") for o in f[1:2]],
    "1 MB session id": lambda f: [o.update(id="s" * (1 << 20)) for o in f[1:2]],
    "a session id ending in @digits": lambda f: [o.update(id="s@3") for o in f[1:2]],
}


@pytest.fixture
def other_url(backend: str, tmp_path: Any) -> Iterator[str]:
    """A second empty database of the same backend (the target of an import)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'other.db'}"
        return
    import uuid

    import psycopg

    from conftest import pg_admin_url

    admin = pg_admin_url()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    dsn = admin.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{admin}{'&' if '?' in admin else '?'}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_import_applies_every_append_rule(store: EventStore, other_url: str, case: str) -> None:
    store.append("s", [{"type": "send", "id": "u1", "text": "hi"}, {"type": "stop"}], event_ids=["e1", "e2"])
    objs = _file(store, "s")
    sound = json.loads(json.dumps(objs))
    sound[1]["id"] = "sound"
    HOSTILE[case](objs)
    with make_store(other_url) as target:
        target.import_(io.StringIO(_rechain(sound)))  # the file is sound...
        with pytest.raises(InvalidEvent, match="import line"):  # ...until one field breaks a rule
            target.import_(io.StringIO(_rechain(objs)))
        assert [s.id for s in target.sessions()] == ["sound"]


def test_import_refuses_turns_not_numbered_by_the_sends(store: EventStore, other_url: str) -> None:
    # Every hash is recomputed over the wrong turn, so only the turn-numbering rule is left
    # to refuse the file (the rule verify checks stored events with).
    store.append("s", chat_session(turns=2, seed=4))
    objs = _file(store, "s")
    second = next(o for o in objs[1:] if o["kind"] == "event" and o["version"] > 1 and o["type"] != "send")
    second["turn"] += 1
    with make_store(other_url) as target:
        with pytest.raises(InvalidEvent, match=f"event {second['version']} has turn"):
            target.import_(io.StringIO(_rechain(objs)))
        assert target.sessions() == []


def _lines(objs: list[dict[str, Any]]) -> io.StringIO:
    return io.StringIO("\n".join(json.dumps(o) for o in objs) + "\n")


def test_import_refuses_an_edited_baseline_state(store: EventStore, other_url: str) -> None:
    store.append("s", chat_session(turns=3, seed=3))
    store.compact("s", upto=20)
    objs = _file(store, "s")
    edited = json.loads(json.dumps(objs))  # every hash as it was, only the state edited
    edited[1]["baseline_state"]["messages"][0]["parts"][0]["text"] = "FORGED"
    stripped = json.loads(json.dumps(objs))
    stripped[1]["baseline_record"] = None
    with make_store(other_url) as target:
        with pytest.raises(InvalidEvent, match="baseline_state is not the state"):
            target.import_(_lines(edited))
        with pytest.raises(InvalidEvent, match="no baseline_record"):
            target.import_(_lines(stripped))
        assert target.sessions() == []
        assert [r.status for r in target.import_(_lines(objs))] == ["created"]
        assert target.verify().ok and target.load("s").to_json() == store.load("s").to_json()
        target.erase("s", reason="user request")
        with pytest.raises(SessionErased):  # an erased id is never reused, not even by an import
            target.import_(_lines(objs))


def test_an_imported_compacted_branch_verifies(store: EventStore, other_url: str) -> None:
    store.append("s", chat_session(turns=3, seed=3))
    store.branch("s", at=8, new_id="b")
    store.append("b", [{"type": "stop"}])
    store.compact("s", upto=20)
    out = io.StringIO()
    store.export("b", out)
    with make_store(other_url) as target:
        results = target.import_(io.StringIO(out.getvalue()))
        assert [r.status for r in results] == ["created", "created"]
        assert target.verify().ok, target.verify().problems
        assert target.load("b").to_json() == store.load("b").to_json()


# -- signed checkpoints --------------------------------------------------------------------


def _rewrite(conn: Any, session: str, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> None:
    """Replace a root session's events by ``edit(events)`` with a fully recomputed chain,
    head and turns: plain verify finds nothing."""
    pk = _pk(conn, session)
    rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM events WHERE session_pk = :p ORDER BY version"), {"p": pk})]
    rows = edit(rows)
    prev, turn = ZERO_HASH, 0
    for v, r in enumerate(rows, 1):
        r["version"] = v
        turn += r["type"] == "send"
        r["turn"] = turn
        row = EventRow(**{k: (bytes(r[k]) if k in ("payload", "metadata") and r[k] is not None else r[k]) for k in EventRow.__slots__ if k != "hash"}, hash=b"")
        r["hash"] = prev = recorded_hash(prev, session, row)
    conn.execute(text("DELETE FROM snapshots WHERE session_pk = :p"), {"p": pk})
    conn.execute(text("DELETE FROM events WHERE session_pk = :p"), {"p": pk})
    for r in rows:
        conn.execute(
            text(
                "INSERT INTO events (session_pk, version, event_id, type, turn, payload, recorded_at, actor, metadata, hash)"
                " VALUES (:session_pk, :version, :event_id, :type, :turn, :payload, :recorded_at, :actor, :metadata, :hash)"
            ),
            r,
        )
    conn.execute(
        text("UPDATE sessions SET head = :h, head_hash = :x, head_turn = :t WHERE pk = :p"),
        {"h": len(rows), "x": prev, "t": turn, "p": pk},
    )


def _change_text(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    first = next(r for r in rows if r["type"] == "send")
    first["payload"] = bytes(first["payload"]).replace(b'"text":"', b'"text":"rewritten ', 1)
    return rows


def _delete(conn: Any, session: str) -> None:
    pk = _pk(conn, session)
    for table in ("events", "snapshots"):
        conn.execute(text(f"DELETE FROM {table} WHERE session_pk = :p"), {"p": pk})
    conn.execute(text("DELETE FROM sessions WHERE pk = :p"), {"p": pk})


ATTACKS: dict[str, Callable[[Any], None]] = {
    "rewritten with a recomputed chain": lambda c: _rewrite(c, "victim", _change_text),
    "reordered with a recomputed chain": lambda c: _rewrite(c, "victim", lambda r: [r[1], r[0], *r[2:]]),
    "truncated": lambda c: _rewrite(c, "victim", lambda r: r[:-3]),
    "an event removed": lambda c: _rewrite(c, "victim", lambda r: r[:4] + r[5:]),
    "deleted": lambda c: _delete(c, "victim"),
}


@pytest.fixture
def anchored(db_url: str, twin: str) -> Iterator[tuple[EventStore, Checkpoint]]:
    # Unsealed: the attacks rewrite rows of `events` (tests/test_seal.py alters segments).
    with EventStore(db_url, snapshot_every=1000, seal=False) as store:
        store.migrate()
        store.append("victim", chat_session(turns=3, seed=8), actor="app")
        store.append("bystander", chat_session(turns=2, seed=9))
        cp = store.checkpoint(KEYS[0])
        yield store, cp


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_checkpoint_catches_what_plain_verify_cannot(
    anchored: tuple[EventStore, Checkpoint], raw_engine: Engine, backend: str, attack: str
) -> None:
    store, cp = anchored
    with attacker(raw_engine, backend) as conn:
        ATTACKS[attack](conn)
    assert store.verify().ok  # a consistent chain, only a different one
    report = store.verify(checkpoint=cp, public_key=KEYS[1])
    assert not report.ok
    assert {p.session for p in report.problems} == {"victim"}
    assert {p.kind for p in report.problems} <= {"rewritten", "head_moved_back", "vanished"}
    assert store.verify("bystander", checkpoint=cp, public_key=KEYS[1]).ok


def test_a_checkpoint_survives_growth_compaction_branches_and_erasure(
    anchored: tuple[EventStore, Checkpoint],
) -> None:
    store, cp = anchored
    cp = Checkpoint.from_json(cp.to_json())
    store.append("victim", [{"type": "stop"}])
    head = store.head("victim")
    store.branch("victim", at=5, new_id="victim-alt")
    store.compact("victim", upto=head - 1, actor="ops")  # the anchored head's row goes
    store.erase("bystander", reason="user request", actor="admin:kim")
    report = store.verify(checkpoint=cp, public_key=KEYS[1])
    assert report.ok, report.problems
    (notice,) = report.notices
    assert (notice.session, notice.kind) == ("bystander", "erased")
    assert "admin:kim" in notice.message and "user request" in notice.message
    later = store.checkpoint(KEYS[0])
    assert store.verify(checkpoint=later, public_key=KEYS[1]).ok


def test_a_forged_or_foreign_checkpoint_is_refused(anchored: tuple[EventStore, Checkpoint]) -> None:
    store, cp = anchored
    doc = json.loads(cp.to_json())
    doc["sessions"][0]["head"] -= 1
    altered = Checkpoint.from_json(json.dumps(doc))
    for checkpoint, key in ((altered, KEYS[1]), (cp, OTHER_KEYS[1])):
        report = store.verify(checkpoint=checkpoint, public_key=key)
        assert not report.ok and [p.kind for p in report.problems] == ["bad_signature"]
    with pytest.raises(CheckpointError):
        store.verify(checkpoint=cp)
    with pytest.raises(CheckpointError):
        store.verify(checkpoint=cp, public_key=b"not a key")
    with pytest.raises(CheckpointError):
        store.checkpoint(b"garbage")


# -- erasure and retention -----------------------------------------------------------------


def test_erase_takes_branches_and_compacted_history_and_frees_blobs(store: EventStore, raw_engine: Engine) -> None:
    store.append("s", chat_session(turns=3, seed=4))
    store.append("keep", chat_session(turns=3, seed=4))  # the same messages: shared blobs
    store.append("solo", chat_session(turns=2, seed=11))
    store.branch("s", at=12, new_id="s-b1")
    store.append("s-b1", [{"type": "stop"}])
    store.branch("s-b1", at=13, new_id="s-b2")
    store.compact("s", upto=20)
    keep = store.load("keep").to_json()
    with raw_engine.connect() as conn:
        blobs = conn.execute(text("SELECT count(*) FROM snapshot_blobs")).scalar()

    assert store.erase("s", reason="user request", actor="admin:kim") == ["s", "s-b1", "s-b2"]

    for sid in ("s", "s-b1", "s-b2"):
        with pytest.raises(SessionErased, match="admin:kim"):
            store.load(sid)
        with pytest.raises(SessionErased):
            list(store.history(sid))
        with pytest.raises(SessionErased):
            store.append(sid, [{"type": "stop"}])
    with pytest.raises(SessionErased):
        store.branch("keep", new_id="s-b1")
    with pytest.raises(SessionErased):
        store.erase("s", reason="again")
    with pytest.raises(SessionNotFound):
        store.erase("nobody", reason="x")
    for bad in (None, "", "a\x00b", "x" * 5000):
        with pytest.raises(InvalidEvent):
            store.erase("keep", reason=bad)
    assert [s.id for s in store.sessions()] == ["keep", "solo"]
    with raw_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM snapshot_blobs")).scalar() < blobs
        for table in ("events", "snapshots", "compactions"):
            assert conn.execute(text(f"SELECT count(*) FROM {table} WHERE session_pk NOT IN (SELECT pk FROM sessions)")).scalar() == 0
    assert store.load("keep").to_json() == keep
    report = store.verify()
    assert report.ok and {(n.session, n.kind) for n in report.notices} == {(s, "erased") for s in ("s", "s-b1", "s-b2")}
    assert store.verify("s").ok and store.verify("s").notices


def test_a_store_that_wrote_a_blob_still_writes_it_after_another_store_collected_it(db_url: str, twin: str) -> None:
    a = make_store(db_url, snapshot_every=4)
    b = make_store(db_url, snapshot_every=4)
    try:
        turns = chat_session(turns=2, seed=12)
        a.append("x", turns)  # a's snapshots store the blobs...
        b.append("y", turns)  # ...which y's snapshots share
        b.erase("x", reason="r")
        b.erase("y", reason="r")  # the blobs are gone now; a still saw them written
        a.append("z", turns)
        assert a.verify().ok and b.load("z").to_json() == a.load("z").to_json()
    finally:
        a.close()
        b.close()


def test_erase_older_than_with_a_dry_run(store: EventStore, raw_engine: Engine, backend: str) -> None:
    store.append("old", [{"type": "stop"}])
    store.branch("old", new_id="old-b")
    store.append("old-b", [{"type": "stop"}])
    store.append("mixed", [{"type": "stop"}])
    store.branch("mixed", new_id="mixed-b")
    store.append("mixed-b", [{"type": "stop"}])
    store.append("new", [{"type": "stop"}])
    year = 365 * 24 * 3600 * 10**6
    with raw_engine.begin() as conn:  # age everything but "new" and the branch "mixed-b"
        conn.execute(text("UPDATE sessions SET created_at = created_at - :y WHERE id IN ('old', 'old-b', 'mixed')"), {"y": year})
    with attacker(raw_engine, backend) as conn:
        conn.execute(
            text("UPDATE events SET recorded_at = recorded_at - :y WHERE session_pk IN (SELECT pk FROM sessions WHERE id IN ('old', 'old-b', 'mixed'))"),
            {"y": year},
        )
    assert store.erase_older_than("90d", reason="retention", dry_run=True) == ["old", "old-b"]
    assert {s.id for s in store.sessions()} == {"old", "old-b", "mixed", "mixed-b", "new"}
    assert store.erase_older_than(timedelta(days=90), reason="retention") == ["old", "old-b"]
    assert {s.id for s in store.sessions()} == {"mixed", "mixed-b", "new"}
    for bad in ("90", "0d", "-1d", "1y", 5):
        with pytest.raises(InvalidEvent):
            store.erase_older_than(bad, reason="retention")


# -- the command line ----------------------------------------------------------------------


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_cli_keygen_checkpoint_verify_and_erase(db_url: str, tmp_path: Any, raw_engine: Engine, backend: str) -> None:
    with make_store(db_url, seal=False) as store:  # the attack below rewrites rows of `events`
        store.append("victim", chat_session(turns=2, seed=1))
        store.append("other", chat_session(turns=2, seed=2))
    key = tmp_path / "signing"
    r = _cli("keygen", "--out", str(key))
    assert r.exit_code == 0, r.stderr
    assert oct(key.stat().st_mode & 0o777) == "0o600" and (tmp_path / "signing.pub").exists()
    assert _cli("keygen", "--out", str(key)).exit_code == 1  # never overwrites a key
    cp = tmp_path / "cp.json"
    r = _cli("--db", db_url, "checkpoint", "--key", str(key), "-o", str(cp))
    assert r.exit_code == 0, r.stderr
    Checkpoint.from_json(cp.read_text())
    pub = str(tmp_path / "signing.pub")
    r = _cli("--db", db_url, "verify", "--checkpoint", str(cp), "--public-key", pub, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["ok"] is True
    with attacker(raw_engine, backend) as conn:
        _rewrite(conn, "victim", _change_text)
    assert _cli("--db", db_url, "verify").exit_code == 0
    r = _cli("--db", db_url, "verify", "--checkpoint", str(cp), "--public-key", pub)
    assert r.exit_code == 1 and "victim" in r.stdout and r.stderr.startswith("error: ")
    # Bad input: one error line, exit 1.
    for args in (
        ("verify", "--checkpoint", str(cp)),
        ("verify", "--checkpoint", str(tmp_path / "missing.json"), "--public-key", pub),
        ("verify", "--checkpoint", pub, "--public-key", pub),
        ("verify", "--checkpoint", str(cp), "--public-key", str(cp)),
        ("checkpoint", "--key", pub),
        ("erase", "other"),
        ("erase", "--older-than", "soon", "--reason", "r"),
        ("erase", "nobody", "--reason", "r"),
    ):
        r = _cli("--db", db_url, *args)
        assert r.exit_code in (1, 2) and "Traceback" not in r.stderr, (args, r.stderr)
        if r.exit_code == 1:
            assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, (args, r.stderr)
    r = _cli("--db", db_url, "erase", "other", "--reason", "user \u202erequest", "--actor", "kim")
    assert r.exit_code == 0 and "\u202e" not in r.stdout and "other" in r.stdout
    r = _cli("--db", db_url, "erase", "--older-than", "90d", "--dry-run", "--reason", "retention")
    assert r.exit_code == 0 and "victim" not in r.stdout
    r = _cli("--db", db_url, "verify", "--json")
    assert json.loads(r.stdout)["notices"][0]["kind"] == "erased"


def test_an_import_that_fails_late_writes_nothing(store: EventStore, other_url: str) -> None:
    """Import writes as it reads (bounded memory); a problem on the last line still rolls
    back every session and event written before it."""
    store.append("s", chat_session(turns=3, seed=6))
    store.branch("s", at=30, new_id="b")
    store.append("b", chat_session(turns=2, seed=7))
    out = io.StringIO()
    store.export("b", out)
    lines = out.getvalue().splitlines()
    last = json.loads(lines[-1])
    last["hash"] = "00" * 32
    with make_store(other_url, snapshot_every=16) as target:
        with pytest.raises(InvalidEvent, match="does not match its hash"):
            target.import_(io.StringIO("\n".join([*lines[:-1], json.dumps(last)]) + "\n"))
        assert target.sessions() == []
        assert [r.status for r in target.import_(io.StringIO(out.getvalue()))] == ["created", "created"]
        assert target.verify().ok and target.load("b").to_json() == store.load("b").to_json()


def test_a_foreign_signature_fails_verify_of_one_session_too(store: EventStore) -> None:
    # The signature is about the whole checkpoint: asking about one session must not hide it.
    store.append("s1", [{"type": "send", "id": "u-1", "text": "hi"}], expected_version=0)
    private, _ = generate_keypair()
    _, stranger = generate_keypair()
    cp = store.checkpoint(private)
    report = store.verify("s1", checkpoint=cp, public_key=stranger)
    assert not report.ok
    assert [p.kind for p in report.problems] == ["bad_signature"]
