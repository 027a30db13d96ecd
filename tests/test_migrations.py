"""Alembic revisions: `upgrade head` yields the declared schema, idempotently, from a wheel too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from alembic import command
from alembic.migration import MigrationContext
from alembic.autogenerate import compare_metadata
from sqlalchemy import Engine, create_engine, inspect, text

from conftest import make_store
from eventstore.storage.migrate import HEAD_REVISION, alembic_config, migrations_dir
from eventstore.storage.schema import POSTGRESQL_ONLY, SQLITE_FEED_KEY, VERSION_TABLE, metadata
from eventstore import EventStore

REPO = Path(__file__).resolve().parents[1]

# Every migration here is Alembic's own, never the copy of a migrated template.
pytestmark = pytest.mark.migrations


def _diffs(engine: Engine) -> list[object]:
    sqlite = engine.dialect.name == "sqlite"

    def declared_for_dialect(obj: object, name: str | None, type_: str, reflected: bool, other: object) -> bool:
        # The feed's storage differs per dialect (see eventstore/storage/schema.py).
        if type_ == "index" and name in POSTGRESQL_ONLY:
            return not sqlite
        return not (type_ == "unique_constraint" and name == SQLITE_FEED_KEY)

    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={"compare_type": True, "version_table": VERSION_TABLE, "include_object": declared_for_dialect},
        )
        return list(compare_metadata(ctx, metadata))


def test_upgrade_head_yields_the_declared_metadata(db_url: str, raw_engine: Engine) -> None:
    make_store(db_url).close()
    assert _diffs(raw_engine) == []
    tables = set(inspect(raw_engine).get_table_names())
    assert tables == {t.name for t in metadata.sorted_tables} | {VERSION_TABLE}


def test_migrate_is_idempotent_and_check_schema_agrees(db_url: str, raw_engine: Engine) -> None:
    with EventStore(db_url) as store:
        store.migrate()
        store.append("s1", [{"type": "stop"}])
        store.migrate()
        store.migrate()
        store.check_schema()
        assert store.head("s1") == 1
    with raw_engine.connect() as conn:
        rows = conn.execute(text("SELECT version_num FROM " + VERSION_TABLE)).all()
    assert rows == [(HEAD_REVISION,)]


def test_downgrade_to_base_and_upgrade_again(db_url: str, raw_engine: Engine) -> None:
    make_store(db_url).close()
    with raw_engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert set(inspect(raw_engine).get_table_names()) <= {VERSION_TABLE}
    with EventStore(db_url) as store:
        store.migrate()
        assert store.append("s1", [{"type": "stop"}]).version == 1
    assert _diffs(raw_engine) == []


def _feed_storage(engine: Engine) -> str:
    """How the feed's number is stored: its index (PostgreSQL) or the table's key (SQLite)."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            rows = conn.execute(
                # This test's schema only: other tests' schemas on the server have the index too.
                text(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                    "AND tablename = 'events' AND indexdef LIKE '%xact%'"
                )
            ).all()
            return "; ".join(f"{name}: {' '.join(d.split(' USING ')[1:])}" for name, d in rows)
        ddl = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = 'events'")).scalar_one()
        return "rowid" if "PRIMARY KEY (xact)" in ddl else "column"


def test_revision_0005_moves_the_feed_storage_and_keeps_every_position(
    db_url: str, raw_engine: Engine
) -> None:
    with make_store(db_url) as store:
        for i in range(3):
            store.append(f"s{i}", [{"type": "stop"}] * 2)
            store.append("s0", [{"type": "stop"}])
        before = [(e.session_id, e.version, e.position) for e in store.feed(idle_timeout=0)]
    new = "ix_events_xact: brin (xact) WITH (pages_per_range='16', autosummarize='on')"
    old = "ix_events_xact_session_pk_version: btree (xact, session_pk, version)"
    sqlite = raw_engine.dialect.name == "sqlite"
    assert _feed_storage(raw_engine) == ("rowid" if sqlite else new)
    with raw_engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0004_turn_leases")
    assert _feed_storage(raw_engine) == ("column" if sqlite else old)
    with make_store(db_url) as store:  # upgraded again
        assert _feed_storage(raw_engine) == ("rowid" if sqlite else new)
        assert [(e.session_id, e.version, e.position) for e in store.feed(idle_timeout=0)] == before
        resumed = [(e.session_id, e.version) for e in store.feed(after=before[3][2], idle_timeout=0)]
        assert resumed == [(s, v) for s, v, _ in before[4:]]
        store.append("s1", [{"type": "stop"}])
        assert [(e.session_id, e.version) for e in store.feed(after=before[-1][2], idle_timeout=0)] == [("s1", 3)]
    assert _diffs(raw_engine) == []


def _notify_triggers(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text("SELECT tgname FROM pg_trigger WHERE tgrelid = to_regclass('events') AND tgname LIKE '%notify%'")
            ).scalars()
        )


def test_revision_0006_drops_the_notify_trigger_and_followers_are_still_woken(
    db_url: str, raw_engine: Engine
) -> None:
    with make_store(db_url) as store:
        store.append("s1", [{"type": "stop"}])
    postgresql = raw_engine.dialect.name == "postgresql"
    if postgresql:
        assert _notify_triggers(raw_engine) == []  # no writing transaction notifies
    with raw_engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0005_feed_storage")
    if postgresql:
        assert _notify_triggers(raw_engine) == ["events_notify"]
    with make_store(db_url) as store:  # upgraded again
        if postgresql:
            assert _notify_triggers(raw_engine) == []
        follower = store.follow("s1", after=1, idle_timeout=30)
        store.append("s1", [{"type": "stop"}])
        assert next(follower).version == 2
        follower.close()
    assert _diffs(raw_engine) == []


def test_migrations_are_found_in_the_checkout() -> None:
    d = migrations_dir()
    assert (d / "env.py").is_file() and (d / "versions").is_dir()


@pytest.mark.slow
def test_migrate_works_from_an_installed_package(tmp_path: Path) -> None:
    """`pip install .` into a fresh venv, then migrate() from that install (not the checkout)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--disable-pip-version-check",
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    # The dependencies come from the test environment's site-packages, appended after the
    # venv's own (a .pth line adds a path; it does not run the editable install's hooks).
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (Path(site) / "zz_test_deps.pth").write_text("\n".join(deps) + "\n")
    script = textwrap.dedent(
        """
        import eventstore, eventstore.store, pathlib, sys
        from eventstore.storage.migrate import migrations_dir
        here = pathlib.Path(eventstore.__file__).resolve()
        assert str(here).startswith(sys.prefix), here
        assert migrations_dir() == here.parent / "_migrations", migrations_dir()
        with eventstore.store.EventStore("sqlite:///fresh.db") as store:
            store.migrate()
            store.migrate()
            store.check_schema()
            print(store.append("s1", [{"type": "send", "id": "u-1", "text": "hi"}]).version)
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    out = subprocess.run(
        [str(py), "-c", script], cwd=tmp_path, check=True, capture_output=True, text=True, env=env
    )
    assert out.stdout.strip() == "1"
    engine = create_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    try:
        assert _diffs(engine) == []
    finally:
        engine.dispose()


def test_revision_0010_drops_poisoned_blobs_and_checks_new_ones(pg_schema: str) -> None:
    """Upgrading drops the snapshots built on a blob that is not what its digest says (and
    that blob); from then on the database refuses such a blob from anyone."""
    from eventstore import fold
    from eventstore.core.codec import pack_blob, unpack_blob
    from eventstore.samples import chat_session

    actions = chat_session(turns=2, seed=8)
    with make_store(pg_schema, snapshot_every=8) as store:
        for i in range(0, len(actions), 7):
            store.append("s1", actions[i : i + 7])
    engine = create_engine(pg_schema)
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0006_notify_after_commit")
            digest, body = next(
                (bytes(d), unpack_blob(bytes(b)))
                for d, b in conn.execute(text("SELECT digest, body FROM snapshot_blobs ORDER BY digest"))
                if b'"text":"' in unpack_blob(bytes(b))
            )
            conn.execute(  # what a planted blob left behind: other text under the digest
                text("UPDATE snapshot_blobs SET body = :b WHERE digest = :d"),
                {"b": pack_blob(body.replace(b'"text":"', b'"text":"PLANTED ')), "d": digest},
            )
            conn.execute(text("INSERT INTO snapshot_blobs VALUES ('\\x00', '\"unused\"')"))
            snapshots = conn.execute(text("SELECT count(*) FROM snapshots")).scalar_one()
        with make_store(pg_schema, snapshot_every=8) as store:  # upgraded again
            for v in range(0, len(actions) + 1, 5):
                assert store.load("s1", version=v).to_json() == fold(actions[:v]).to_json(), v
            assert store.verify().ok
        with engine.begin() as conn:
            bad = "SELECT count(*) FROM snapshot_blobs WHERE substr(sha256(body), 1, 16) <> digest"
            assert conn.execute(text(bad)).scalar_one() == 0
            assert 0 < conn.execute(text("SELECT count(*) FROM snapshots")).scalar_one() < snapshots
        with pytest.raises(Exception, match="ck_snapshot_blobs_digest"), engine.begin() as conn:
            conn.execute(text("INSERT INTO snapshot_blobs VALUES ('\\x01', '\"planted\"')"))
        assert _diffs(engine) == []
    finally:
        engine.dispose()


def _blob_counts(engine: Engine) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """(each blob's stored count, how many times the snapshots name it)."""
    with engine.connect() as conn:
        named: dict[bytes, int] = {}
        for (md,) in conn.execute(text("SELECT message_digests FROM snapshots")):
            for i in range(0, len(md), 16):
                named[bytes(md[i : i + 16])] = named.get(bytes(md[i : i + 16]), 0) + 1
        stored = {bytes(d): n for d, n in conn.execute(text("SELECT digest, refs FROM snapshot_blobs"))}
    return stored, named


def test_revision_0012_counts_the_references_to_blobs_stored_before_it(
    db_url: str, raw_engine: Engine
) -> None:
    from eventstore import fold
    from eventstore.samples import chat_session

    actions = chat_session(turns=3, seed=13)
    with make_store(db_url, snapshot_every=16, seal=False) as store:
        for s in ("a", "b"):  # the same chat: every blob named by two sessions
            for i in range(0, len(actions), 9):
                store.append(s, actions[i : i + 9])
        store.branch("a", at=40, new_id="a-fork")
        store.append("a-fork", [{"type": "stop"}] * 20)
    with raw_engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0011_seal_segments")
    assert "refs" not in {c["name"] for c in inspect(raw_engine).get_columns("snapshot_blobs")}
    with make_store(db_url, snapshot_every=16) as store:  # upgraded again
        stored, named = _blob_counts(raw_engine)
        assert stored == named and max(named.values()) > 1
        store.seal()  # thins the sealed turns' snapshots, releasing their blobs
        stored, named = _blob_counts(raw_engine)
        assert stored == named
        for v in range(0, len(actions) + 1, 6):
            assert store.load("b", version=v).to_json() == fold(actions[:v]).to_json()
        assert store.verify().ok
    assert _diffs(raw_engine) == []
