"""The fixtures' shortcut (tests/db_templates.py) makes exactly the database `migrate` makes.

A test's database is a copy of a per-process migrated template; these tests copy one and
migrate another for real with Alembic, then compare everything a test could meet: on
PostgreSQL ``pg_dump`` of both schemas (data included) and, independently of pg_dump, the
catalogue (tables, columns, defaults, partitions, indexes, constraints, triggers, functions
with their settings, owners and grants, sequences, rows); on SQLite ``sqlite_master``, the
header's settings and every row.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

import db_templates as templates
from conftest import _psycopg_dsn, pg_admin_url
from eventstore import EventStore
from eventstore.storage.migrate import HEAD_REVISION
from eventstore.storage.schema import VERSION_TABLE

#: (URL suffix: more `-c` settings, store options) of each kind of PostgreSQL template.
PG_KINDS = {
    "plain": ("", {}),
    "partitioned-by-setting": ("%20-ceventstore.partitions%3D4", {}),
    "partitioned-by-option": ("", {"partitions": 4}),
}

#: The catalogue of one schema, as rows of text with the schema's name as {schema}.
_CATALOGUE = """
WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = %(schema)s)
-- text, not name: the first branch types the columns, and a name holds 63 bytes.
SELECT 'schema', n.nspname::text, pg_get_userbyid(n.nspowner)::text,
       coalesce(n.nspacl::text, ''), ''
  FROM pg_namespace n WHERE n.oid = (SELECT oid FROM ns)
UNION ALL
SELECT 'relation', c.relname,
       concat_ws(' ', c.relkind, c.relpersistence, c.relispartition, c.reloptions::text,
                 pg_get_expr(c.relpartbound, c.oid),
                 CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END),
       pg_get_userbyid(c.relowner), coalesce(c.relacl::text, '')
  FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM ns)
UNION ALL
SELECT 'column', c.relname || '.' || a.attname,
       concat_ws(' ', row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
                 format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
                 a.attgenerated, a.attcollation::regcollation, pg_get_expr(d.adbin, d.adrelid)),
       coalesce(a.attacl::text, ''), ''
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE c.relnamespace = (SELECT oid FROM ns) AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint', c.relname || '.' || k.conname, pg_get_constraintdef(k.oid),
       concat_ws(' ', k.contype, k.condeferrable, k.condeferred, k.convalidated), ''
  FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
 WHERE k.connamespace = (SELECT oid FROM ns)
UNION ALL
SELECT 'index', i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid),
       concat_ws(' ', i.indisunique, i.indisprimary, i.indisvalid, i.indisready), ''
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = (SELECT oid FROM ns)
UNION ALL
SELECT 'trigger', c.relname || '.' || t.tgname, pg_get_triggerdef(t.oid),
       concat_ws(' ', t.tgenabled, t.tgparentid <> 0), ''
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 -- The foreign keys' own triggers are named by oid: their constraints are compared.
 WHERE c.relnamespace = (SELECT oid FROM ns) AND NOT t.tgisinternal
UNION ALL
SELECT 'function', p.oid::regprocedure::text, pg_get_functiondef(p.oid),
       pg_get_userbyid(p.proowner), coalesce(p.proacl::text, '')
  FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns)
UNION ALL
SELECT 'sequence', s.sequencename,
       concat_ws(' ', s.data_type, s.start_value, s.increment_by, s.cache_size, s.cycle,
                 s.last_value),
       pg_get_userbyid(c.relowner), ''
  FROM pg_sequences s
  JOIN pg_class c ON c.relname = s.sequencename AND c.relnamespace = (SELECT oid FROM ns)
 WHERE s.schemaname = %(schema)s
"""


def _pg_catalogue(dsn: str, schema: str) -> list[tuple[str, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = [tuple(str(v) for v in r) for r in conn.execute(_CATALOGUE, {"schema": schema})]
        for (table,) in conn.execute(
            "SELECT relname FROM pg_class "
            "WHERE relkind IN ('r', 'p') AND relnamespace = %s::regnamespace",
            (schema,),
        ).fetchall():
            # Only names from the catalogue, quoted: every row of every table.
            data = conn.execute(f'SELECT * FROM "{schema}"."{table}" ORDER BY 1').fetchall()
            rows.append(("rows", table, repr(data), "", ""))
    return sorted(tuple(v.replace(schema, "{schema}") for v in r) for r in rows)


@pytest.fixture
def migrated_schema() -> Iterator[str]:
    """A second empty schema, never offered to the template: Alembic migrates it."""
    dsn = _psycopg_dsn(pg_admin_url())
    schema = f"m_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.mark.parametrize("kind", PG_KINDS)
def test_a_schema_copied_from_the_template_is_the_migrated_schema(
    pg_schema: str, migrated_schema: str, kind: str
) -> None:
    suffix, options = PG_KINDS[kind]
    copied = pg_schema.rsplit("%3D", 1)[1]
    assert templates.fill(pg_schema + suffix, options), "the fixture's schema was not copied"
    with EventStore(pg_schema.replace(copied, migrated_schema) + suffix, **options) as store:
        store.migrate()

    dsn = _psycopg_dsn(pg_admin_url())
    dumps = [templates.pg_dump_text(dsn, n).replace(n, "{schema}")
             for n in (copied, migrated_schema)]
    assert dumps[0] == dumps[1]
    catalogue = _pg_catalogue(dsn, copied)
    assert catalogue == _pg_catalogue(dsn, migrated_schema)
    assert ("rows", VERSION_TABLE, repr([(HEAD_REVISION,)]), "", "") in catalogue
    partitioned = [r[1] for r in catalogue if r[0] == "relation" and r[2].startswith("p ")]
    assert partitioned == ([] if kind == "plain" else ["events", "snapshots"])


def _sqlite_catalogue(path: Path) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    try:
        # rootpage is where a b-tree sits in the file: no statement sees it.
        master = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
        ).fetchall()
        pragmas = {
            p: conn.execute(f"PRAGMA {p}").fetchall()
            for p in ("user_version", "application_id", "journal_mode", "page_size", "auto_vacuum",
                      "encoding")
        }
        rows = {
            name: conn.execute(f'SELECT * FROM "{name}" ORDER BY 1').fetchall()
            for (kind, name, _, _) in master
            if kind == "table"
        }
    finally:
        conn.close()
    return {"master": master, "pragmas": pragmas, "rows": rows}


def test_a_sqlite_file_copied_from_the_template_is_the_migrated_database(tmp_path: Path) -> None:
    copied, migrated = tmp_path / "copied.db", tmp_path / "migrated.db"
    templates.offer(str(copied))
    assert templates.fill(f"sqlite:///{copied}", {}), "the offered file was not copied"
    with EventStore(f"sqlite:///{migrated}") as store:
        store.migrate()
    assert _sqlite_catalogue(copied) == _sqlite_catalogue(migrated)
    assert _sqlite_catalogue(copied)["rows"][VERSION_TABLE] == [(HEAD_REVISION,)]


@pytest.mark.migrations
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_test_marked_migrations_gets_no_copy(db_url: str) -> None:
    assert not templates.fill(db_url, {})


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_database_the_test_already_used_is_migrated_not_copied(db_url: str) -> None:
    with EventStore(db_url) as store:
        store.migrate()
    assert not templates.fill(db_url, {})


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_options_that_may_change_the_schema_get_no_copy(db_url: str) -> None:
    assert not templates.fill(db_url, {"replicas": [db_url]})
    assert templates.fill(db_url, {"seal": False})


def test_the_same_schema_name_in_another_database_is_migrated_not_copied(pg_schema: str) -> None:
    elsewhere = make_url(pg_schema).set(database="elsewhere").render_as_string(hide_password=False)
    assert not templates.fill(elsewhere, {})
    assert templates.fill(pg_schema, {}), "the test's own schema is still untouched"
