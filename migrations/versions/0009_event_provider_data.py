"""Provider-native data on events: one nullable column, ``events.native``.

It holds data the reducer ignores (an item's exact JSON as a model provider returned it,
token usage, a file reference) as JSON text, byte for byte. The row triggers that refuse
every UPDATE of ``events`` cover the new column as they cover the others (they fire on
the row, whatever columns an UPDATE names), so nothing else changes: plain ADD COLUMN,
no default, so SQLite needs no table rebuild (which would drop the triggers) and
PostgreSQL rewrites nothing (a partitioned ``events`` passes the column to every
partition).

Revision ID: 0009_event_provider_data
Revises: 0008_session_rewinds
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0009_event_provider_data"
down_revision = "0008_session_rewinds"
branch_labels = None
depends_on = None

_TYPE = {"postgresql": "bytea", "sqlite": "BLOB"}


def upgrade() -> None:
    op.execute(f"ALTER TABLE events ADD COLUMN native {_TYPE[_dialect()]}")


def downgrade() -> None:
    # SQLite (3.35 and later) drops a column in place: the table and its triggers stay.
    _dialect()
    op.execute("ALTER TABLE events DROP COLUMN native")


def _dialect() -> str:
    name = op.get_bind().dialect.name
    if name not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
    return str(name)
