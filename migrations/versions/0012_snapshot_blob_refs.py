"""Snapshot blobs carry their reference count, and sealed turns keep fewer snapshots.

``snapshot_blobs.refs`` counts the references the snapshots hold to each blob (a snapshot
naming a blob twice counts twice). A snapshot write raises it in its own transaction (an
upsert whose conflict locks the blob's row), a snapshot's deletion lowers it, and a blob at
0 is deleted there and then: no scan of every snapshot's digests and no table lock, so a
session's deletion can release its blobs while other sessions write snapshots that share
them. A count may over-state (a snapshot written over another by PostgreSQL's one-statement
append keeps the old one's references: the blob outlives it), never under-state. This
revision computes the counts of the blobs stored before it (under the snapshot writers'
lock).

PostgreSQL: the application role may not delete snapshots. ``eventstore_thin_snapshots``, a
``SECURITY DEFINER`` function of the owner (search path pinned to the schema, then
``pg_temp``; ``EXECUTE`` revoked from ``PUBLIC``, given to the application by the grants),
deletes the snapshots of one session row between two versions that lie inside its sealed
segments, except those at a multiple of ``p_keep``, the compaction baseline and the
session's newest (under the session row's lock); it lowers the counts of their blobs, in
digest order (the order appends lock them in) and deletes the blobs left at 0. The sealer
calls it after sealing a session's turns. A caller can thereby only make loads inside sealed
turns fold more events, never change what they return.

SQLite (no roles): the store runs the same deletes itself.

Revision ID: 0012_snapshot_blob_refs
Revises: 0011_seal_segments
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_snapshot_blob_refs"
down_revision = "0011_seal_segments"
branch_labels = None
depends_on = None

# -- the DDL this revision ran, frozen here: runtime modules hold none --------------

THIN_SIGNATURE = "eventstore_thin_snapshots(integer, integer, integer, integer)"

_PG_COUNT_REFS = """
UPDATE snapshot_blobs b SET refs = c.n
FROM (
    SELECT substr(s.message_digests, i * 16 + 1, 16) AS digest, count(*)::int AS n
    FROM snapshots s, generate_series(0, length(s.message_digests) / 16 - 1) AS i
    GROUP BY 1
) c
WHERE b.digest = c.digest
"""


def pg_thin_function(schema: str) -> tuple[str, ...]:
    """The thinning function, for the schema the tables are in (a quoted identifier)."""
    return (
        f"""
        CREATE FUNCTION eventstore_thin_snapshots(p_pk integer, p_first integer, p_last integer,
                                                  p_keep integer)
        RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
        DECLARE
            n integer; released bytea[]; counts integer[];
        BEGIN
            IF p_keep IS NULL OR p_keep < 1 THEN
                RAISE EXCEPTION 'eventstore_thin_snapshots: p_keep must be positive, got %', p_keep
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            -- The session's lock, as every writer of its snapshots takes it: a compaction
            -- cannot move the baseline under this delete.
            PERFORM 1 FROM {schema}.sessions s WHERE s.pk = p_pk FOR UPDATE;
            WITH gone AS (
                DELETE FROM {schema}.snapshots x
                 WHERE x.session_pk = p_pk AND x.version BETWEEN p_first AND p_last
                   AND x.version % p_keep <> 0
                   AND x.version <> (SELECT s.baseline FROM {schema}.sessions s WHERE s.pk = p_pk)
                   AND x.version < (SELECT max(y.version) FROM {schema}.snapshots y
                                     WHERE y.session_pk = p_pk)
                   AND EXISTS (SELECT 1 FROM {schema}.event_segments g
                                WHERE g.session_pk = p_pk
                                  AND g.first_version <= x.version AND g.last_version >= x.version)
                RETURNING x.message_digests
            ), per AS (
                SELECT substr(g.message_digests, i * 16 + 1, 16) AS digest, count(*)::int AS c
                  FROM gone g, generate_series(0, length(g.message_digests) / 16 - 1) AS i
                 GROUP BY 1
            )
            SELECT (SELECT count(*) FROM gone),
                   (SELECT array_agg(per.digest ORDER BY per.digest) FROM per),
                   (SELECT array_agg(per.c ORDER BY per.digest) FROM per)
              INTO n, released, counts;
            IF released IS NOT NULL THEN
                PERFORM 1 FROM {schema}.snapshot_blobs b
                  WHERE b.digest = ANY (released) ORDER BY b.digest FOR UPDATE;
                UPDATE {schema}.snapshot_blobs b SET refs = b.refs - u.c
                  FROM unnest(released, counts) AS u(d, c) WHERE b.digest = u.d;
                DELETE FROM {schema}.snapshot_blobs b
                 WHERE b.digest = ANY (released) AND b.refs <= 0;
            END IF;
            RETURN n;
        END
        $$
        """,
        f"REVOKE ALL ON FUNCTION {THIN_SIGNATURE} FROM PUBLIC",
    )


PG_DROP_THIN_FUNCTION = (f"DROP FUNCTION IF EXISTS {THIN_SIGNATURE}",)


def _count_refs_sqlite(bind: sa.Connection) -> None:
    """The counts, computed in Python (SQLite has no series to split the digests with)."""
    counts: dict[bytes, int] = {}
    for (md,) in bind.execute(sa.text("SELECT message_digests FROM snapshots")):
        md = bytes(md)
        for i in range(0, len(md), 16):
            counts[md[i : i + 16]] = counts.get(md[i : i + 16], 0) + 1
    if counts:
        bind.execute(
            sa.text("UPDATE snapshot_blobs SET refs = :n WHERE digest = :d").bindparams(
                sa.bindparam("d", type_=sa.LargeBinary())
            ),
            [{"d": d, "n": n} for d, n in sorted(counts.items())],
        )


def upgrade() -> None:
    name = _dialect()
    if name == "postgresql":
        # The snapshot writers' own lock: no snapshot is written while the counts are made.
        op.execute("LOCK TABLE snapshots, snapshot_blobs IN EXCLUSIVE MODE")
    op.add_column(
        "snapshot_blobs", sa.Column("refs", sa.Integer(), nullable=False, server_default="0")
    )
    if name == "postgresql":
        op.execute(_PG_COUNT_REFS)
        bind = op.get_bind()
        schema = bind.execute(sa.text("SELECT current_schema()")).scalar()
        quoted = bind.dialect.identifier_preparer.quote_schema(str(schema))
        for statement in pg_thin_function(quoted):
            op.execute(statement)
    else:
        _count_refs_sqlite(op.get_bind())


def downgrade() -> None:
    if _dialect() == "postgresql":
        for statement in PG_DROP_THIN_FUNCTION:
            op.execute(statement)
    with op.batch_alter_table("snapshot_blobs") as batch:
        batch.drop_column("refs")


def _dialect() -> str:
    name = op.get_bind().dialect.name
    if name not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
    return str(name)
