"""Least privilege on PostgreSQL, exactly as docs/security.md sets it up.

The two ``sql`` blocks of the "Least privilege on PostgreSQL" section are executed verbatim
(role and schema names swapped for unique ones), so the documentation cannot drift from what
is tested: an application role that can only insert and read events (plus what an append,
a branch and a snapshot need), and an owner role that migrates and compacts.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from conftest import pg_admin_url
from eventstore.errors import CompactedError, SessionErased, StorageError
from eventstore.samples import chat_session
from eventstore import EventStore
from eventstore.storage import open_storage
from eventstore.core.rows import Erasure, TombstoneRow

DOC = Path(__file__).resolve().parents[1] / "docs" / "security.md"


def _doc_sql_blocks() -> tuple[str, str]:
    """(setup block, grants block) of docs/security.md's least-privilege section."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Least privilege on PostgreSQL"):]
    section = section[: section.index("\n## ", 5)]
    blocks = re.findall(r"```sql\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2, "expected a setup block and a grants block"
    marker = section.index("<!-- least-privilege-grants")
    assert section.index(blocks[1]) > marker, "the grants block follows its marker"
    return blocks[0], blocks[1]


@pytest.fixture
def setup() -> Iterator[dict[str, Any]]:
    admin_url = pg_admin_url()
    suffix = uuid.uuid4().hex[:10]
    owner, app, schema = f"es_owner_{suffix}", f"es_app_{suffix}", f"es_{suffix}"

    def rename(sql: str) -> str:
        sql = sql.replace("eventstore_owner", owner).replace("eventstore_app", app)
        return re.sub(r"\beventstore\b", schema, sql)

    setup_sql, grants_sql = (rename(b) for b in _doc_sql_blocks())
    u = make_url(admin_url)

    def url(role: str) -> str:
        # The server trusts loopback, so the documented passwords are not needed here.
        return u.set(username=role, password=None).render_as_string(hide_password=False)

    admin = psycopg.connect(admin_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    admin.execute(setup_sql)
    try:
        yield {"owner": url(owner), "app": url(app), "grants": grants_sql, "schema": schema, "app_role": app}
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        for role in (app, owner):
            admin.execute(f'DROP OWNED BY "{role}" CASCADE')
            admin.execute(f'DROP ROLE "{role}"')
        admin.close()


def _raw(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)


def test_the_documented_least_privilege_setup(setup: dict[str, Any]) -> None:
    # Migrations need the owner: the application role cannot create the schema's tables.
    with EventStore(setup["app"]) as app_store:
        with pytest.raises(StorageError, match="permission denied"):
            app_store.migrate()
    owner_store = EventStore(setup["owner"], snapshot_every=16)
    owner_store.migrate()
    with _raw(setup["owner"]) as conn:
        conn.execute(setup["grants"])  # run by the owner, verbatim from the docs

    app_store = EventStore(setup["app"], snapshot_every=16)
    try:
        # Everything an application does works under the application role.
        turns = chat_session(turns=3, seed=6)
        ids = [f"e{i}" for i in range(len(turns))]
        r = app_store.append("chat", turns, expected_version=0, event_ids=ids, actor="app", metadata={"k": 1})
        assert app_store.append("chat", turns, expected_version=0, event_ids=ids, actor="app", metadata={"k": 1}).replayed
        app_store.append("chat", [{"type": "retry"}], expected_version=r.version)
        head = r.version + 1
        assert app_store.head("chat") == head
        assert app_store.load("chat", version=20).to_json() == owner_store.load("chat", version=20).to_json()
        assert len(list(app_store.history("chat"))) == head
        fork = app_store.branch("chat", at=30, new_id="chat-alt")
        app_store.append(fork, [{"type": "stop"}])
        assert {s.id for s in app_store.sessions()} == {"chat", "chat-alt"}
        assert app_store.verify().ok
        with _raw(setup["owner"]) as conn:  # snapshots were written by the app role
            assert conn.execute("SELECT count(*) FROM snapshots").fetchone()[0] >= head // 16

        # What it must not do, the database refuses before any trigger runs.
        forbidden = [
            "UPDATE events SET actor = 'mallory'",
            "DELETE FROM events",
            "TRUNCATE events",
            "INSERT INTO compaction_permits VALUES (1, 1000)",
            "UPDATE sessions SET baseline = 5, baseline_hash = NULL",
            "DELETE FROM sessions",
            "DELETE FROM snapshots",
            "DELETE FROM snapshot_blobs",
            "DROP TABLE events",
            "ALTER TABLE events DISABLE TRIGGER USER",
            "INSERT INTO tombstones (session_id, head, head_hash, erased_at, reason) "
            "VALUES ('x', 0, '\\x00', 0, 'r')",
            "UPDATE tombstones SET reason = 'x'",
            "DELETE FROM tombstones",
            "UPDATE compactions SET state_digest = '\\x00'",
            "DELETE FROM compactions",
            "CREATE TABLE sneaky (x int)",
        ]
        with _raw(setup["app"]) as conn:
            for sql in forbidden:
                with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable)) as info:
                    conn.execute(sql)
                assert isinstance(info.value, psycopg.errors.InsufficientPrivilege), (sql, info.value)

        # Erasure deletes: the application role cannot, and nothing changes.
        _erase(setup["app"], "chat-alt", expect_denied=True)
        assert app_store.head("chat-alt") == 31 and _erase(setup["owner"], "none") is None

        # Compaction deletes: the application role cannot, and nothing changes.
        before = [e.to_json() for e in app_store.history("chat")]
        with pytest.raises(StorageError, match="permission denied"):
            app_store.compact("chat", upto=40)
        assert [e.to_json() for e in app_store.history("chat")] == before
        assert app_store.load("chat", version=1) is not None

        # The owner compacts; the application role then reads the compacted session normally.
        state_50 = app_store.load("chat", version=50).to_json()
        owner_store.compact("chat", upto=50)
        with pytest.raises(CompactedError):
            app_store.load("chat", version=49)
        assert app_store.load("chat", version=50).to_json() == state_50
        assert app_store.load("chat-alt").to_json() == owner_store.load("chat-alt").to_json()
        app_store.append("chat", [{"type": "stop"}])
        assert app_store.verify().ok
    finally:
        app_store.close()
        owner_store.close()


def _erase(url: str, session: str, *, expect_denied: bool = False) -> Erasure | None:
    """Erase through the storage primitive under the role of ``url``."""
    storage = open_storage(url)
    try:
        with storage.read() as tx:
            row = storage.session(tx, id=session)
        if row is None:
            return None
        if expect_denied:
            with pytest.raises(StorageError, match="permission denied"):
                with storage.write() as tx:
                    storage.erase_session(tx, row.pk, erased_at=0, actor="mallory", reason="x")
            return None
        with storage.write() as tx:
            return storage.erase_session(tx, row.pk, erased_at=0, actor="ops", reason="request")
    finally:
        storage.close()


def test_the_owner_erases_and_the_application_sees_the_tombstone(setup: dict[str, Any]) -> None:
    owner_store = EventStore(setup["owner"], snapshot_every=8)
    owner_store.migrate()
    with _raw(setup["owner"]) as conn:
        conn.execute(setup["grants"])
    with EventStore(setup["app"], snapshot_every=8) as app_store:
        app_store.append("s1", chat_session(turns=2, seed=3))
        app_store.branch("s1", at=10, new_id="s1-alt")
        app_store.append("s2", [{"type": "stop"}])
        _erase(setup["app"], "s1", expect_denied=True)
        assert app_store.head("s1") > 10
        erasure = _erase(setup["owner"], "s1")
        assert erasure is not None
        assert [t.session_id for t in erasure.tombstones] == ["s1", "s1-alt"]
        assert [s.id for s in app_store.sessions()] == ["s2"]
        storage = open_storage(setup["app"])
        try:
            with storage.read() as tx:  # the application role reads tombstones
                assert [t.session_id for t in storage.records(tx, TombstoneRow)] == ["s1", "s1-alt"]
        finally:
            storage.close()
        assert app_store.verify().ok
    owner_store.close()


def test_only_the_owner_erases_through_the_store(setup: dict[str, Any]) -> None:
    owner_store = EventStore(setup["owner"], snapshot_every=8)
    owner_store.migrate()
    with _raw(setup["owner"]) as conn:
        conn.execute(setup["grants"])
    with EventStore(setup["app"], snapshot_every=8) as app_store:
        app_store.append("s1", chat_session(turns=2, seed=3))
        app_store.branch("s1", at=10, new_id="s1-alt")
        with pytest.raises(StorageError, match="permission denied"):
            app_store.erase("s1", reason="mallory wants it gone")
        assert app_store.head("s1") > 10 and app_store.head("s1-alt") == 10
        owner_store.compact("s1", upto=12, actor="ops")  # the owner's compaction writes its record
        assert app_store.verify().ok
        assert owner_store.erase("s1", reason="user request", actor="admin") == ["s1", "s1-alt"]
        with pytest.raises(SessionErased):
            app_store.load("s1-alt")
        with pytest.raises(SessionErased):  # the application role reads tombstones: no reuse
            app_store.append("s1", [{"type": "stop"}])
        report = app_store.verify()
        assert report.ok and len(report.notices) == 2
    owner_store.close()


def test_the_documented_maintenance_role(setup: dict[str, Any]) -> None:
    """The maintenance role of the docs compacts and erases but cannot disable a trigger."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Splitting the owner from maintenance"):]
    section = section[: section.index("\n## ", 5)]
    create_sql, grants_sql = re.findall(r"```sql\n(.*?)```", section, flags=re.S)
    assert section.index(grants_sql) > section.index("<!-- maintenance-grants")
    maint = setup["app_role"].replace("es_app_", "es_maint_")

    def rename(sql: str) -> str:
        return re.sub(r"\beventstore\b", setup["schema"], sql.replace("eventstore_maint", maint))

    admin = _raw(pg_admin_url())
    admin.execute(rename(create_sql))
    maint_url = make_url(setup["app"]).set(username=maint).render_as_string(hide_password=False)
    try:
        with EventStore(setup["owner"], snapshot_every=8, seal=False) as owner_store:
            owner_store.migrate()
            s1, s2 = chat_session(turns=3, seed=5), chat_session(turns=2, seed=5)
            owner_store.append("s1", s1, event_ids=[f"s1-{i}" for i in range(len(s1))])
            owner_store.branch("s1", at=12, new_id="s1-alt")
            owner_store.append("s2", s2, event_ids=[f"s2-{i}" for i in range(len(s2))])
            assert owner_store.seal() == 3  # compaction and erasure cut and drop segments
        with _raw(setup["owner"]) as conn:
            conn.execute(rename(grants_sql))
            assert conn.execute("SELECT count(*) FROM sealed_event_ids").fetchone()[0] > 0
        with EventStore(maint_url, snapshot_every=8, seal=False) as maint_store:
            state = maint_store.load("s2", version=20).to_json()
            maint_store.compact("s2", upto=20)
            assert maint_store.load("s2", version=20).to_json() == state
            erasure = _erase(maint_url, "s1")  # and the blobs only its snapshots named
            assert erasure is not None and len(erasure.tombstones) == 2
            assert maint_store.verify().ok
        with _raw(maint_url) as conn:
            # s2's one segment was cut (its kept events are rows again) and s1's were erased.
            assert conn.execute("SELECT count(*) FROM event_segments").fetchone()[0] == 0
            assert conn.execute("SELECT count(*) FROM sealed_event_ids").fetchone()[0] == 0
            for sql in (
                "ALTER TABLE events DISABLE TRIGGER USER",
                "UPDATE events SET actor = 'mallory'",
                "TRUNCATE events",
                "DROP TABLE events",
                "UPDATE tombstones SET reason = 'x'",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql)
    finally:
        admin.execute(f'DROP OWNED BY "{maint}" CASCADE')
        admin.execute(f'DROP ROLE "{maint}"')
        admin.close()


def test_the_grants_name_no_write_privilege_on_events_beyond_insert(setup: dict[str, Any]) -> None:
    """The privileges the app role ends up with, read back from the catalog."""
    with EventStore(setup["owner"]) as owner_store:
        owner_store.migrate()
    with _raw(setup["owner"]) as conn:
        conn.execute(setup["grants"])
        rows = conn.execute(
            "SELECT table_name, privilege_type FROM information_schema.role_table_grants "
            "WHERE grantee = %s AND table_schema = %s ORDER BY 1, 2",
            (setup["app_role"], setup["schema"]),
        ).fetchall()
    granted: dict[str, set[str]] = {}
    for table, privilege in rows:
        granted.setdefault(table, set()).add(privilege)
    assert granted["events"] == {"SELECT", "INSERT"}
    assert "compaction_permits" not in granted
    assert granted["sessions"] == {"SELECT", "INSERT"}  # UPDATE only on head columns
    assert granted["snapshot_blobs"] == {"SELECT", "INSERT"}
    assert granted["eventstore_alembic_version"] == {"SELECT"}
    assert granted["tombstones"] == {"SELECT"}
    assert granted["compactions"] == {"SELECT"}
    assert granted["event_segments"] == {"SELECT"}  # sealing goes through eventstore_seal
    assert granted["sealed_event_ids"] == {"SELECT"}  # and so do the sealed events' ids


@pytest.mark.twins
def test_every_application_capability_works_as_the_application_role(
    setup: dict[str, Any], twin: str, tmp_path: Path
) -> None:
    """Each public method the application uses, under the documented grants and nothing more."""
    from eventstore import generate_keypair

    with EventStore(setup["owner"]) as owner_store:
        owner_store.migrate()
    with _raw(setup["owner"]) as conn:
        conn.execute(setup["grants"])  # verbatim from the docs
    private_key, public_key = generate_keypair()
    with EventStore(setup["app"], snapshot_every=8) as app:
        app.check_schema()
        r = app.append("s1", chat_session(turns=2, seed=4), actor="app")
        assert app.head("s1") == r.version and app.load("s1", version=5) is not None
        assert len(list(app.history("s1", desc=True, limit=3))) == 3
        assert len(list(app.replay("s1", upto=4))) == 4
        fork = app.branch("s1", at=6, new_id="s1-alt")
        assert app.diff(("s1", None), (fork, None)).to_json() is not None
        assert app.turns("s1")

        # Streaming turns take and renew the session's writer lease, then release it.
        with app.turn("s1", {"type": "send", "id": "u-1", "text": "hi"}) as turn:
            turn.write({"type": "message-start", "messageId": "a-1"})
            turn.write({"type": "text-delta", "messageId": "a-1", "text": "hello"})
            turn.write({"type": "finish"})
        # A turn whose writer died, taken over by recover.
        app.append("s2", [{"type": "send", "id": "u-2", "text": "hi"}])
        with _raw(setup["owner"]) as conn:  # the lease of a writer that went away long ago
            conn.execute("UPDATE sessions SET writer = 'dead', writer_seen = 1 WHERE id = 's2'")
        assert app.recover("s2", stale_after=1.0) is not None
        app.close_session("s2", reason="done")
        assert {s.id: s.closed for s in app.sessions()}["s2"]

        head = app.head("s1")
        assert [e.version for e in app.follow("s1", after=head - 2, idle_timeout=0.2)] == [head - 1, head]
        fed = list(app.feed(idle_timeout=0.3))
        assert len(fed) == app.head("s1") - 6 + app.head("s1-alt") + app.head("s2")

        out = tmp_path / "s1.jsonl"
        assert app.export("s1", str(out)) == app.head("s1")
        assert "<html" in app.report("s1").lower()
        cp = app.checkpoint(private_key)
        report = app.verify(checkpoint=cp, public_key=public_key)
        assert report.ok, report.problems

        # What it must not do stays refused.
        with pytest.raises(StorageError, match="permission denied"):
            app.erase("s1", reason="no")
        with pytest.raises(StorageError, match="permission denied"):
            app.compact("s1", upto=4)
    with _raw(setup["app"]) as conn:
        for sql in (
            "UPDATE events SET actor = 'mallory'",
            "DELETE FROM events",
            "UPDATE sessions SET baseline = 5",
            "DELETE FROM snapshots",
            "UPDATE snapshot_blobs SET body = '\\x00'",
            "DELETE FROM snapshot_blobs",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)


def test_the_application_role_cannot_poison_the_shared_snapshot_blobs(setup: dict[str, Any]) -> None:
    """Blobs are shared by digest and a snapshot write skips a digest already stored: a blob
    planted under the digest of a chunk the store writes later must not reach any load."""
    from eventstore import fold
    from eventstore.core.codec import SnapshotCodec, pack_blob, unpack_blob

    with EventStore(setup["owner"]) as owner_store:
        owner_store.migrate()
    with _raw(setup["owner"]) as conn:
        conn.execute(setup["grants"])
    actions = chat_session(turns=2, seed=4)
    codec = SnapshotCodec()
    planted: dict[bytes, bytes] = {}
    for v in range(1, len(actions) + 1):  # every chunk any snapshot of this session holds
        planted.update(codec.encode(fold(actions[:v]).to_json())[2])
    refused = 0
    with _raw(setup["app"]) as conn:
        for digest, body in planted.items():
            assert b'"text":"' in unpack_blob(body)
            forged = pack_blob(unpack_blob(body).replace(b'"text":"', b'"text":"PLANTED '))
            try:
                conn.execute("INSERT INTO snapshot_blobs (digest, body) VALUES (%s, %s)", (digest, forged))
            except psycopg.errors.CheckViolation:
                refused += 1
        # A blob whose digest is its body's is an honest write, and stays allowed.
        honest = b'{"id":"x","parts":[],"role":"user"}'
        conn.execute(
            "INSERT INTO snapshot_blobs (digest, body) VALUES (%s, %s)",
            (hashlib.sha256(honest).digest()[:16], honest),
        )
    with EventStore(setup["app"], snapshot_every=8) as app_store:
        for i in range(0, len(actions), 5):  # several appends, so snapshots land on the way
            app_store.append("s1", actions[i : i + 5])
        for v in range(0, len(actions) + 1, 3):
            assert app_store.load("s1", version=v).to_json() == fold(actions[:v]).to_json(), v
        assert app_store.verify().ok
    assert refused == len(planted)


def test_the_application_role_rewinds_and_every_event_stays_readable(setup: dict[str, Any]) -> None:
    owner_store = EventStore(setup["owner"], snapshot_every=8)
    owner_store.migrate()
    with _raw(setup["owner"]) as conn:
        conn.execute(setup["grants"])
    try:
        with EventStore(setup["app"], snapshot_every=8) as app_store:
            app_store.append("s1", chat_session(turns=3, seed=4))
            before = list(app_store.history("s1"))
            kept = app_store.rewind("s1", to=10, actor="user:ada", reason="edit")
            assert kept == "s1~1" and app_store.head("s1") == 10
            assert list(app_store.history(kept)) == before
            assert [s.id for s in app_store.lines("s1")] == [kept]
            app_store.append("s1", [{"type": "stop"}])
            assert app_store.verify().ok
            # The records of rewinds, the lineage and the events are out of its reach.
            forbidden = [
                "UPDATE session_rewinds SET kept_id = 'x'",
                "DELETE FROM session_rewinds",
                "UPDATE sessions SET parent_pk = NULL",
                "UPDATE sessions SET fork_version = 0",
                "UPDATE events SET session_pk = 0",
                "DELETE FROM sessions",
            ]
            with _raw(setup["app"]) as conn:
                for sql in forbidden:
                    with pytest.raises(psycopg.errors.InsufficientPrivilege):
                        conn.execute(sql)
            assert list(owner_store.history(kept)) == before
    finally:
        owner_store.close()


def test_the_application_role_seals_but_cannot_forge_or_remove_a_segment(setup: dict[str, Any]) -> None:
    """Sealing as the application role goes through the owner's function; the role can
    neither write a segment itself nor make the function record a hash of its choosing."""
    from eventstore import fold

    with EventStore(setup["owner"]) as owner_store:
        owner_store.migrate()
    with _raw(setup["owner"]) as conn:
        conn.execute(setup["grants"])
    actions = chat_session(turns=3, seed=4)
    ids = [f"e{i}" for i in range(len(actions))]
    with EventStore(setup["app"], snapshot_every=8, seal=False) as app:
        app.append("s1", actions, event_ids=ids)
        assert app.seal() == 2  # the third turn is the session's newest: it stays rows
        for v in range(0, len(actions) + 1, 7):
            assert app.load("s1", version=v).to_json() == fold(actions[:v]).to_json(), v
        assert app.verify().ok
        # The function recorded the sealed ids: a retry of a sealed event replays it.
        assert app.append("s1", actions[:5], event_ids=ids[:5]).version == 5
        assert app.head("s1") == len(actions)
    with _raw(setup["app"]) as conn:
        pk, first, last = conn.execute(
            "SELECT session_pk, first_version, last_version FROM event_segments ORDER BY 2 LIMIT 1"
        ).fetchone()
        sealed_upto = conn.execute("SELECT max(last_version) FROM event_segments").fetchone()[0]
        recorded = conn.execute(
            "SELECT event_id, version FROM sealed_event_ids ORDER BY 2"
        ).fetchall()
        assert recorded == [(f"e{v - 1}", v) for v in range(1, sealed_upto + 1)]
        for sql in (
            "UPDATE event_segments SET body = '\\x00'",
            "UPDATE event_segments SET end_hash = '\\x00'",
            "DELETE FROM event_segments",
            "INSERT INTO event_segments SELECT * FROM event_segments",
            "DELETE FROM events",
            # The id table is the function's too: a deleted or moved id would let a retried
            # append of a sealed event through as a new one.
            "DELETE FROM sealed_event_ids",
            "UPDATE sealed_event_ids SET version = version + 1",
            "INSERT INTO sealed_event_ids VALUES (1, 'forged', 1)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
        # The function refuses what is not every row of one closed turn: the sealed range
        # (its rows are gone) and the newest turn's rows.
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation):
            conn.execute("SELECT eventstore_seal(%s, %s, %s, '\\x00', '\\x00')", (pk, first, last))
        head = conn.execute("SELECT head FROM sessions WHERE id = 's1'").fetchone()[0]
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation):
            conn.execute("SELECT eventstore_seal(%s, %s, %s, '\\x00', '\\x00')", (pk, head, head))


def test_the_application_role_thins_only_snapshots_inside_sealed_turns(setup: dict[str, Any]) -> None:
    """Sealing thins snapshots through the owner's function: under the application role it
    deletes nothing outside sealed segments, never a session's newest snapshot, and the
    blob counts follow."""
    from eventstore import fold

    with EventStore(setup["owner"]) as owner_store:
        owner_store.migrate()
    with _raw(setup["owner"]) as conn:
        conn.execute(setup["grants"])
    actions = chat_session(turns=4, seed=8)
    with EventStore(setup["app"], snapshot_every=16, seal=False) as app_store:
        for i in range(0, len(actions), 9):
            app_store.append("s", actions[i : i + 9])

    def snapshots() -> list[int]:
        with _raw(setup["app"]) as conn:
            return [v for (v,) in conn.execute("SELECT version FROM snapshots ORDER BY 1")]

    all_of_them = snapshots()
    with _raw(setup["app"]) as conn:
        (pk,) = conn.execute("SELECT pk FROM sessions WHERE id = 's'").fetchone()
        # Nothing is sealed yet: the function deletes nothing.
        assert conn.execute("SELECT eventstore_thin_snapshots(%s, 1, 100000, 1000000)", (pk,)).fetchone() == (0,)
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT eventstore_thin_snapshots(%s, 1, 100000, 0)", (pk,))
    assert snapshots() == all_of_them
    with EventStore(setup["app"], snapshot_every=16) as app_store:
        assert app_store.seal() > 0  # thins as the application role
        thinned = snapshots()
        assert all_of_them[-1] in thinned and len(thinned) < len(all_of_them)
        with _raw(setup["app"]) as conn:
            conn.execute("SELECT eventstore_thin_snapshots(%s, 1, 100000, 1000000)", (pk,))
            (sealed_to,) = conn.execute("SELECT max(last_version) FROM event_segments").fetchone()
            # Only the newest stays inside the sealed turns; those after them all stay.
            left = snapshots()
            assert [v for v in left if v <= sealed_to] == ([max(left)] if max(left) <= sealed_to else [])
            assert [v for v in all_of_them if v > sealed_to] == [v for v in left if v > sealed_to]
            counts = dict(conn.execute("SELECT digest, refs FROM snapshot_blobs").fetchall())
            named: dict[bytes, int] = {}
            for (md,) in conn.execute("SELECT message_digests FROM snapshots"):
                for i in range(0, len(md), 16):
                    named[bytes(md[i : i + 16])] = named.get(bytes(md[i : i + 16]), 0) + 1
            assert {bytes(d): n for d, n in counts.items()} == named
        for v in range(0, len(actions) + 1, 7):
            assert app_store.load("s", version=v).to_json() == fold(actions[:v]).to_json()
        assert app_store.verify().ok
