"""Audit: compaction records, tombstones, no REPLACE of events, a qualified permit lookup.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from eventstore.storage import postgres as pg_ddl
from eventstore.storage import sqlite as sqlite_ddl

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


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
    ddl, schema = _dialect_ddl()
    for statement in ddl.audit_ddl_v2(schema):
        op.execute(statement)


def downgrade() -> None:
    ddl, _schema = _dialect_ddl()
    for statement in ddl.DROP_AUDIT_DDL_V2:
        op.execute(statement)
    op.drop_table("tombstones")
    op.drop_table("compactions")


def _dialect_ddl():  # type: ignore[no-untyped-def]
    """The dialect's DDL module and the quoted schema the tables are created in."""
    bind = op.get_bind()
    name = bind.dialect.name
    if name == "postgresql":
        schema = bind.execute(sa.text("SELECT current_schema()")).scalar()
        return pg_ddl, bind.dialect.identifier_preparer.quote_schema(str(schema))
    if name == "sqlite":
        return sqlite_ddl, "main"
    raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
