"""The conversations catalogue: titles, owners, info metadata, and what a listing sorts on.

Columns on ``sessions``: ``title``, ``owner``, ``metadata`` (set by ``set_info``),
``first_text`` and ``status`` (the state's first user text and the fold's status at the
head), ``updated_at`` (the newest own event's time), ``line_of`` (a line kept by a rewind:
the pk of the session it was rewound away from); four indexes, one per listing order with
and without an owner; and the ``info_changes`` table that records every ``set_info``.

Existing rows are backfilled: ``updated_at`` from their newest event, ``status`` and
``first_text`` by scanning each session's lineage (events a compaction removed are not
seen: such a session is scanned from its baseline as if from an empty state).

Revision ID: 0007_session_catalogue
Revises: 0006_notify_after_commit
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from eventstore.core.catalogue import apply_effect, effect
from eventstore.core.codec import decode_many

revision = "0007_session_catalogue"
down_revision = "0006_notify_after_commit"
branch_labels = None
depends_on = None

_CHUNK = 1000


def upgrade() -> None:
    # Plain ADD COLUMN (a NOT NULL one with a constant default): no SQLite table rebuild.
    op.add_column("sessions", sa.Column("title", sa.Text(), nullable=True))
    op.add_column("sessions", sa.Column("owner", sa.Text(), nullable=True))
    op.add_column("sessions", sa.Column("metadata", sa.Text(), nullable=True))
    op.add_column("sessions", sa.Column("first_text", sa.Text(), nullable=True))
    op.add_column(
        "sessions", sa.Column("status", sa.Text(), nullable=False, server_default=sa.text("'idle'"))
    )
    op.add_column(
        "sessions", sa.Column("updated_at", sa.BigInteger(), nullable=False, server_default=sa.text("0"))
    )
    op.add_column("sessions", sa.Column("line_of", sa.Integer(), nullable=True))
    op.create_table(
        "info_changes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("session_pk", sa.Integer(), nullable=False),
        sa.Column("changed_at", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.Column("changes", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_info_changes"),
    )
    op.create_index("ix_info_changes_session_pk_id", "info_changes", ["session_pk", "id"])
    _backfill()
    op.create_index(
        "ix_sessions_owner_recent", "sessions", ["owner", sa.text("updated_at DESC"), "id"]
    )
    op.create_index("ix_sessions_recent", "sessions", [sa.text("updated_at DESC"), "id"])
    op.create_index("ix_sessions_owner_created", "sessions", ["owner", "created_at", "id"])
    op.create_index("ix_sessions_created", "sessions", ["created_at", "id"])


def _backfill() -> None:
    conn = op.get_bind()
    conn.execute(
        sa.text(
            "UPDATE sessions SET updated_at = COALESCE((SELECT MAX(e.recorded_at) FROM events e"
            " WHERE e.session_pk = sessions.pk), created_at)"
        )
    )
    rows = conn.execute(
        sa.text("SELECT pk, parent_pk, fork_version, head, updated_at FROM sessions ORDER BY pk")
    ).all()
    by_pk = {r[0]: r for r in rows}
    for pk, _, _, head, updated_at in rows:
        # The lineage, root first: (session pk, versions after, versions up to).
        segments: list[tuple[int, int, int]] = []
        cur, cap = by_pk[pk], head
        while True:
            after = cur[2] or 0
            if cap > after:
                segments.append((cur[0], after, cap))
            if cur[1] is None or cur[1] not in by_pk:
                break
            cap = min(cap, after)
            cur = by_pk[cur[1]]
        status, first_text = "idle", None
        for seg_pk, after, upto in reversed(segments):
            while after < upto:
                chunk = conn.execute(
                    sa.text(
                        "SELECT version, payload FROM events WHERE session_pk = :pk"
                        " AND version > :after AND version <= :upto ORDER BY version LIMIT :n"
                    ),
                    {"pk": seg_pk, "after": after, "upto": upto, "n": _CHUNK},
                ).all()
                if not chunk:
                    break
                actions = decode_many(bytes(c[1]) for c in chunk)
                status, first_text, _ = apply_effect(effect(actions, 0), status, first_text, 0)
                after = chunk[-1][0]
        conn.execute(
            sa.text("UPDATE sessions SET status = :s, first_text = :t WHERE pk = :pk"),
            {"s": status, "t": first_text, "pk": pk},
        )


def downgrade() -> None:
    for name in ("ix_sessions_created", "ix_sessions_owner_created", "ix_sessions_recent", "ix_sessions_owner_recent"):
        op.drop_index(name, table_name="sessions")
    op.drop_index("ix_info_changes_session_pk_id", table_name="info_changes")
    op.drop_table("info_changes")
    with op.batch_alter_table("sessions") as batch:
        for name in ("line_of", "updated_at", "status", "first_text", "metadata", "owner", "title"):
            batch.drop_column(name)
