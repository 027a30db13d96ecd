"""Create the event log: sessions, events, snapshots (shared blobs), compaction permits.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op


revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# -- the DDL this revision ran, frozen here: runtime modules hold none --------------

#: Triggers of revision 0001: no UPDATE, no TRUNCATE; DELETE only under a compaction permit.
PG_IMMUTABILITY = (
    """
    CREATE FUNCTION eventstore_events_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' THEN
            IF EXISTS (SELECT 1 FROM compaction_permits p
                       WHERE p.session_pk = OLD.session_pk AND OLD.version <= p.upto) THEN
                RETURN OLD;
            END IF;
            RAISE EXCEPTION 'events are immutable: DELETE refused (only compaction may delete)'
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RAISE EXCEPTION 'events are immutable: % refused', TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END
    $$
    """,
    """
    CREATE TRIGGER events_immutable BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION eventstore_events_guard()
    """,
    """
    CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION eventstore_events_guard()
    """,
)

PG_DROP_IMMUTABILITY = (
    "DROP TRIGGER IF EXISTS events_no_truncate ON events",
    "DROP TRIGGER IF EXISTS events_immutable ON events",
    "DROP FUNCTION IF EXISTS eventstore_events_guard()",
)

def pg_hash_partitions(table: str, n: int) -> list[str]:
    """The partitions of a table created ``PARTITION BY HASH (session_pk)``: ``table_p00``...

    Each session's rows live in exactly one partition, chosen by the hash of its key.
    The events' partitions get the TRUNCATE guard too: a statement trigger on the parent
    does not fire for a TRUNCATE of one partition.
    """
    width = len(str(n - 1))
    out: list[str] = []
    for i in range(n):
        part = f"{table}_p{i:0{width}d}"
        # Names from a constant and an integer, never from input.
        out.append(
            f"CREATE TABLE {part} PARTITION OF {table} "
            f"FOR VALUES WITH (MODULUS {n}, REMAINDER {i})"
        )
        if table == "events":
            out.append(
                f"CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON {part} "
                "FOR EACH STATEMENT EXECUTE FUNCTION eventstore_events_guard()"
            )
    return out


#: Triggers of revision 0001: no UPDATE ever; DELETE only under a compaction permit.
SQLITE_IMMUTABILITY = (
    """
    CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN
        SELECT RAISE(ABORT, 'events are immutable: UPDATE refused');
    END
    """,
    """
    CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    WHEN NOT EXISTS (
        SELECT 1 FROM compaction_permits p
        WHERE p.session_pk = OLD.session_pk AND OLD.version <= p.upto
    )
    BEGIN
        SELECT RAISE(ABORT, 'events are immutable: DELETE refused (only compaction may delete)');
    END
    """,
)

SQLITE_DROP_IMMUTABILITY = (
    "DROP TRIGGER IF EXISTS events_no_delete",
    "DROP TRIGGER IF EXISTS events_no_update",
)


def upgrade() -> None:
    # PostgreSQL only: hash-partition the per-session tables by session (see docs/scaling.md).
    partitions = int(context.config.attributes.get("partitions", 0) or 0)
    by_session = {"postgresql_partition_by": "HASH (session_pk)"} if partitions else {}
    op.create_table(
        "sessions",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("parent_pk", sa.Integer(), nullable=True),
        sa.Column("fork_version", sa.Integer(), nullable=True),
        sa.Column("head", sa.Integer(), nullable=False),
        sa.Column("head_hash", sa.LargeBinary(), nullable=False),
        sa.Column("head_turn", sa.Integer(), nullable=False),
        sa.Column("baseline", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("baseline_hash", sa.LargeBinary(), nullable=True),
        sa.Column("baseline_turn", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["parent_pk"], ["sessions.pk"], name="fk_sessions_parent_pk_sessions"
        ),
        sa.PrimaryKeyConstraint("pk", name="pk_sessions"),
        sa.UniqueConstraint("id", name="uq_sessions_id"),
    )
    op.create_table(
        "events",
        sa.Column("session_pk", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.Text(), nullable=True),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("recorded_at", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("metadata", sa.LargeBinary(), nullable=True),
        sa.Column("hash", sa.LargeBinary(), nullable=False),
        # No foreign key to sessions: see eventstore/storage/schema.py.
        sa.PrimaryKeyConstraint("session_pk", "version", name="pk_events"),
        **by_session,
    )
    op.create_index(
        "ix_events_session_pk_event_id",
        "events",
        ["session_pk", "event_id"],
        unique=True,
        sqlite_where=sa.text("event_id IS NOT NULL"),
        postgresql_where=sa.text("event_id IS NOT NULL"),
    )
    op.create_table(
        "snapshot_blobs",
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name="pk_snapshot_blobs"),
    )
    op.create_table(
        "snapshots",
        sa.Column("session_pk", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("reducer_version", sa.Integer(), nullable=False),
        sa.Column("rest", sa.LargeBinary(), nullable=False),
        sa.Column("message_digests", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_pk"], ["sessions.pk"], name="fk_snapshots_session_pk_sessions"
        ),
        sa.PrimaryKeyConstraint("session_pk", "version", name="pk_snapshots"),
        **by_session,
    )
    op.create_table(
        "compaction_permits",
        sa.Column("session_pk", sa.Integer(), nullable=False),
        sa.Column("upto", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("session_pk", name="pk_compaction_permits"),
    )
    for statement in _dialect_ddl()[0]:
        op.execute(statement)
    if partitions:
        # After the guard function exists (the events' partitions get its TRUNCATE
        # trigger); row triggers and indexes of a partitioned table reach its partitions.
        for table in ("events", "snapshots"):
            for statement in pg_hash_partitions(table, partitions):
                op.execute(statement)


def downgrade() -> None:
    for statement in _dialect_ddl()[1]:
        op.execute(statement)
    op.drop_table("compaction_permits")
    op.drop_table("snapshots")
    op.drop_table("snapshot_blobs")
    op.drop_index("ix_events_session_pk_event_id", table_name="events")
    op.drop_table("events")
    op.drop_table("sessions")


def _dialect_ddl() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The dialect's immutability triggers: (create, drop)."""
    name = op.get_bind().dialect.name
    if name == "postgresql":
        return PG_IMMUTABILITY, PG_DROP_IMMUTABILITY
    if name == "sqlite":
        return SQLITE_IMMUTABILITY, SQLITE_DROP_IMMUTABILITY
    raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
