"""Audit: compaction records, tombstones, no REPLACE of events, a qualified permit lookup.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# -- the DDL this revision ran, frozen here: runtime modules hold none --------------

def _pg_guard_function(permits: str) -> str:
    """The events guard, looking the permit up in ``permits`` (a trusted identifier)."""
    return f"""
    CREATE OR REPLACE FUNCTION eventstore_events_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' THEN
            IF EXISTS (SELECT 1 FROM {permits} p
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
    """

def pg_audit(schema: str) -> tuple[str, ...]:
    """Revision 0002: the guard finds the permit table by its schema-qualified name.

    Unqualified, ``compaction_permits`` is looked up along the search path at run time,
    and ``pg_temp`` comes first there: any role that may create temporary tables could
    shadow it with a TEMP table holding a forged permit and delete events.

    Args:
        schema: the schema the events live in, already quoted as an identifier.
    """
    return (_pg_guard_function(f"{schema}.compaction_permits"),)

#: Undoes :func:`pg_audit`: the guard of revision 0001.
PG_DROP_AUDIT = (_pg_guard_function("compaction_permits"),)


#: Messages of revision 0002's insert triggers (the error classifier matches on them).
_VERSION_RECORDED = "events are immutable: this version is already recorded"

_EVENT_ID_RECORDED = "events are immutable: this event id is already recorded"

def sqlite_audit(schema: str) -> tuple[str, ...]:
    """Triggers of revision 0002: an INSERT never replaces a recorded event.

    ``INSERT OR REPLACE`` / ``REPLACE INTO`` resolve a key conflict by deleting the old
    row, and SQLite fires DELETE triggers for that only with ``recursive_triggers`` on.
    So the insert itself is refused when its version or its event id is recorded already
    (two index probes the unique checks make anyway). An ordinary duplicate insert now
    fails here too, with a message the error classifier maps as before.

    ``schema`` is unused: a trigger of the main database resolves the tables it names in
    the main database only, so a TEMP table cannot shadow ``compaction_permits`` (a
    trigger naming a temp object fails to compile).
    """
    del schema
    return (
        f"""
        CREATE TRIGGER events_no_replace_version BEFORE INSERT ON events
        WHEN EXISTS (
            SELECT 1 FROM events e WHERE e.session_pk = NEW.session_pk AND e.version = NEW.version
        )
        BEGIN
            SELECT RAISE(ABORT, '{_VERSION_RECORDED}');
        END
        """,
        f"""
        CREATE TRIGGER events_no_replace_event_id BEFORE INSERT ON events
        WHEN NEW.event_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM events e
            WHERE e.session_pk = NEW.session_pk AND e.event_id = NEW.event_id
        )
        BEGIN
            SELECT RAISE(ABORT, '{_EVENT_ID_RECORDED}');
        END
        """,
    )

SQLITE_DROP_AUDIT = (
    "DROP TRIGGER IF EXISTS events_no_replace_event_id",
    "DROP TRIGGER IF EXISTS events_no_replace_version",
)


def upgrade() -> None:
    op.create_table(
        "compactions",
        sa.Column("session_pk", sa.Integer(), nullable=False),
        sa.Column("upto", sa.Integer(), nullable=False),
        sa.Column("previous_baseline", sa.Integer(), nullable=False),
        sa.Column("baseline_hash", sa.LargeBinary(), nullable=False),
        sa.Column("baseline_turn", sa.Integer(), nullable=False),
        sa.Column("state_digest", sa.LargeBinary(), nullable=False),
        sa.Column("first_version", sa.Integer(), nullable=False),
        sa.Column("removed_hashes", sa.LargeBinary(), nullable=False),
        sa.Column("compacted_at", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_pk"], ["sessions.pk"], name="fk_compactions_session_pk_sessions"
        ),
        sa.PrimaryKeyConstraint("session_pk", "upto", name="pk_compactions"),
    )
    op.create_table(
        "tombstones",
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("head", sa.Integer(), nullable=False),
        sa.Column("head_hash", sa.LargeBinary(), nullable=False),
        sa.Column("erased_at", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("erased_with", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("session_id", name="pk_tombstones"),
    )
    create, _drop = _dialect_ddl()
    for statement in create:
        op.execute(statement)


def downgrade() -> None:
    _create, drop = _dialect_ddl()
    for statement in drop:
        op.execute(statement)
    op.drop_table("tombstones")
    op.drop_table("compactions")


def _dialect_ddl() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The dialect's guards of this revision, for the schema the tables are in: (create, drop)."""
    bind = op.get_bind()
    name = bind.dialect.name
    if name == "postgresql":
        schema = bind.execute(sa.text("SELECT current_schema()")).scalar()
        return pg_audit(bind.dialect.identifier_preparer.quote_schema(str(schema))), PG_DROP_AUDIT
    if name == "sqlite":
        return sqlite_audit("main"), SQLITE_DROP_AUDIT
    raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
