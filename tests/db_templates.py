"""Migrated test databases copied from a per-process template, not migrated per test.

Alembic running every revision (importing them, dozens of round trips) was most of a store
test's setup. Each worker process migrates one template per kind of database instead
(SQLite; PostgreSQL per server, ``-c`` settings such as ``eventstore.partitions`` and
``partitions`` option), and a test's fresh private database becomes a copy of it:

- SQLite: the template file, checkpointed (no ``-wal`` beside it), copied to the test's path.
- PostgreSQL: ``pg_dump`` of the template schema (tables, sequences, indexes, constraints,
  triggers, functions with their pinned ``search_path``, grants, and the data ``migrate``
  writes: the version row and the sequences' positions), with the template's name replaced
  by the test schema's, replayed in one round trip (one transaction).

Only a database the fixtures made for this test (:func:`offer`) and nothing touched yet is
copied into; any other URL, an option that may change the schema, or a database already in
use is migrated for real. Tests marked ``migrations`` are never offered: they check what the
revisions themselves make. tests/test_db_templates.py compares a copy with a freshly
migrated database, so the copy cannot drift from what ``migrate`` makes.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from sqlalchemy.engine import make_url

__all__ = ["offer", "withdraw", "migrated", "fill", "admin_execute", "close", "pg_dump_text"]

S = TypeVar("S")

#: Store options that do not change what ``migrate`` makes (``partitions`` keys the
#: template instead). Any other (replicas: the store must learn of the DDL it
#: replays) means a real migration.
NEUTRAL_OPTIONS = frozenset(
    {"seal", "snapshot_every", "max_event_bytes", "max_id_length", "busy_timeout_ms",
     "pool_size", "max_overflow", "echo", "partitions"}
)

_SEARCH_PATH = re.compile(r"-csearch_path=([a-z0-9_]+)")
APPLICATION = "eventstore-test-templates"


@dataclass
class _Templates:
    """This process's templates and the fresh databases offered to them."""

    #: the SQLite files and PostgreSQL schemas offered to this test and still untouched.
    fresh: set[str] = field(default_factory=set)
    #: the migrated SQLite file; per template key, (template schema, its replayable dump).
    sqlite: Path | None = None
    pg: dict[tuple[Any, ...], tuple[str, str]] = field(default_factory=dict)
    admin: Any = None
    admin_pid: int = 0
    admin_dsn: str = ""
    workdir: Path | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


_T = _Templates()


def offer(name: str) -> None:
    """``name`` (the path of a SQLite file, or a PostgreSQL schema just made empty) is this
    test's private database: if nothing touched it when the test first asks for a migrated
    store on it, the template is copied into it."""
    _T.fresh.add(name)


def withdraw(name: str) -> None:
    """The test that was offered ``name`` is over."""
    _T.fresh.discard(name)


def migrated(factory: Callable[..., S], url: str, **options: Any) -> S:
    """``factory(url, **options)`` (an EventStore, or the async twin's adapter) on a
    migrated schema: copied from the template when :func:`fill` can, else ``migrate()``."""
    filled = fill(url, options)
    store = factory(url, **options)
    if not filled:
        store.migrate()  # type: ignore[attr-defined]
    return store


def fill(url: str, options: dict[str, Any]) -> bool:
    """Give the fresh database behind ``url`` what ``migrate()`` with ``options`` makes;
    False (nothing done) when ``url`` was not offered, is already in use, or the options
    may change what a migration makes."""
    if set(options) - NEUTRAL_OPTIONS:
        return False
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if not _take(path) or any(os.path.exists(path + s) for s in ("", "-wal", "-journal")):
            return False
        shutil.copyfile(_sqlite_template(), path)
        return True
    u = make_url(url)
    settings = u.query.get("options")
    m = _SEARCH_PATH.search(settings) if isinstance(settings, str) else None
    # The admin connection replays the template: only into its own database (a test may
    # name the same schema in another database of the server).
    if m is None or _target(url) != _target(_T.admin_dsn) or not _take(m.group(1)):
        return False
    schema = m.group(1)
    # What else decides the schema `migrate` makes: the other `-c` settings
    # (eventstore.partitions) and the partitions option; not application_name.
    partitions = options.get("partitions", 0)
    key = (settings.replace(m.group(0), ""), partitions)
    template, script = _pg_template(url, schema, partitions, key)
    from psycopg import errors

    try:
        _admin_execute(script.replace(template, schema))
    except (errors.DuplicateTable, errors.DuplicateObject, errors.DuplicateFunction):
        return False  # the test made something there first: let Alembic meet it
    return True


def _target(url: str) -> tuple[Any, ...]:
    u = make_url(url) if url else None
    return () if u is None else (u.host, u.port, u.database, u.username)


def _take(name: str) -> bool:
    try:
        _T.fresh.remove(name)
    except KeyError:
        return False
    return True


def close() -> None:
    """Drop this process's template schemas and files (the end of the worker's session)."""
    for template, _ in _T.pg.values():
        _admin_execute(f'DROP SCHEMA IF EXISTS "{template}" CASCADE')
    _T.pg.clear()
    _T.sqlite = None
    if _T.admin is not None and _T.admin_pid == os.getpid():
        _T.admin.close()
    _T.admin = None
    if _T.workdir is not None:
        shutil.rmtree(_T.workdir, ignore_errors=True)
        _T.workdir = None


def admin_execute(dsn: str, sql: str) -> None:
    """Run ``sql`` (statements without parameters) on this process's one admin connection
    to ``dsn``: a test's schema is made and dropped without a new connection each time."""
    _T.admin_dsn = dsn
    _admin_execute(sql)


def _admin_execute(sql: str) -> None:
    import psycopg

    for attempt in (1, 2):
        # A forked child must not talk over its parent's connection.
        if _T.admin is None or _T.admin.closed or _T.admin_pid != os.getpid():
            _T.admin = psycopg.connect(_T.admin_dsn, autocommit=True, application_name=APPLICATION)
            _T.admin_pid = os.getpid()
        try:
            _T.admin.execute(sql.encode())
            return
        except psycopg.OperationalError:
            # A test of the serial phase restarted the server or ended our connection.
            _T.admin.close()
            _T.admin = None
            if attempt == 2:
                raise


def _workdir() -> Path:
    if _T.workdir is None:
        _T.workdir = Path(tempfile.mkdtemp(prefix="eventstore-templates-"))
    return _T.workdir


def _sqlite_template() -> Path:
    with _T.lock:
        path = _T.sqlite
        if path is None:
            from eventstore import EventStore

            path = _workdir() / "template.db"
            with EventStore(f"sqlite:///{path}") as store:
                store.migrate()
            # The last connection to close checkpoints and removes the WAL: the one file
            # then holds the whole database.
            sqlite3.connect(path).close()
            leftovers = [p for p in (Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()]
            if leftovers:
                raise RuntimeError(f"the SQLite template kept {leftovers}: a copy would lack them")
            _T.sqlite = path
        return path


def _pg_template(url: str, schema: str, partitions: int, key: tuple[Any, ...]) -> tuple[str, str]:
    """(template schema, the dump that remakes it) for databases like ``url``'s ``schema``."""
    with _T.lock:
        made = _T.pg.get(key)
        if made is None:
            from eventstore import EventStore

            template = f"tmpl_{uuid.uuid4().hex[:16]}"
            _admin_execute(f'CREATE SCHEMA "{template}"')
            options = {"partitions": partitions} if partitions else {}
            with EventStore(url.replace(schema, template), **options) as store:
                store.migrate()
            dump = pg_dump_text(_T.admin_dsn, template)
            create = f"CREATE SCHEMA {template};\n"
            if create not in dump:
                raise RuntimeError(f"pg_dump's script does not create {template}: a new format?")
            # The test's schema exists already (its fixture made it, empty). The SET
            # statements pg_dump opens with would otherwise stay on the admin connection.
            made = (template, dump.replace(create, "") + "\nRESET ALL;\n")
            _T.pg[key] = made
        return made


def pg_dump_text(dsn: str, schema: str) -> str:
    """``pg_dump`` of one schema (with its data as INSERTs) as a script a driver can send:
    without psql's meta-commands (``\\restrict``)."""
    args = [_pg_dump(), "--schema", schema, "--inserts", "--no-password", dsn]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return "".join(line for line in out.splitlines(keepends=True) if not line.startswith("\\"))


def _pg_dump() -> str:
    # The server's own bin directory (scripts/with-postgres names its pg_ctl): a client
    # older than the server refuses to dump it.
    ctl = os.environ.get("EVENTSTORE_TEST_PG_CTL", "").split()
    if ctl:
        sibling = Path(ctl[-1]).with_name("pg_dump")
        if sibling.is_file():
            return str(sibling)
    found = shutil.which("pg_dump")
    if found is None:
        raise RuntimeError("pg_dump is missing: the PostgreSQL tests copy migrated schemas with it")
    return found
