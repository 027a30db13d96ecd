"""Sealed segments: ``event_segments``, and PostgreSQL's one door from rows to a segment.

A closed turn's event rows can be rewritten into one compressed segment row (see
``eventstore/core/segments.py``); the rows go in the same transaction. The segment keeps
no per-event hash: a reader recomputes the chain from ``prev_hash`` and compares the last
hash with ``end_hash``, and the events' feed numbers with ``xact_digest``.

PostgreSQL: the application role may not delete events nor write segments. It seals by
calling ``eventstore_seal``, a ``SECURITY DEFINER`` function of the owner (its search path
pinned to the schema, then ``pg_temp``): it checks that the range is every row of whole turns
that a later turn has closed, copies ``end_hash`` from the last row and computes
``xact_digest`` from the rows itself, inserts the segment and the rows' event ids into
``sealed_event_ids`` (what an append's duplicate check probes instead of decoding the
session's segments), and deletes the rows under a compaction permit that it alone writes
and removes. A caller's body can then only make reads of that segment fail loudly (it
does not hash to ``end_hash``), never change what they return. ``EXECUTE`` is revoked from
``PUBLIC``: the grants give it to the application.

SQLite (no roles): the store writes the segment and its event ids and deletes the rows
under a compaction permit, as compaction does; the triggers are unchanged.

Downgrade puts every sealed event back as its row (decoded and checked) before the
tables go: nothing is lost.

Revision ID: 0011_seal_segments
Revises: 0010_red_team_hardening
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_seal_segments"
down_revision = "0010_red_team_hardening"
branch_labels = None
depends_on = None

# -- the DDL this revision ran, frozen here: runtime modules hold none --------------

SEAL_SIGNATURE = "eventstore_seal(integer, integer, integer, bytea, bytea)"


def pg_seal_function(schema: str) -> tuple[str, ...]:
    """The sealing function, for the schema the tables are in (a quoted identifier)."""
    return (
        f"""
        CREATE FUNCTION eventstore_seal(p_pk integer, p_first integer, p_last integer,
                                        p_prev bytea, p_body bytea)
        RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
        DECLARE
            n integer; t_min integer; t_max integer; x_min bigint; x_max bigint;
            digest bytea; last_hash bytea; closed_by integer;
        BEGIN
            SELECT s.head_turn INTO closed_by FROM {schema}.sessions s WHERE s.pk = p_pk FOR UPDATE;
            SELECT count(*), min(e.turn), max(e.turn), min(e.xact), max(e.xact),
                   sha256(string_agg(int8send(e.xact), ''::bytea ORDER BY e.version))
              INTO n, t_min, t_max, x_min, x_max, digest
              FROM {schema}.events e
             WHERE e.session_pk = p_pk AND e.version BETWEEN p_first AND p_last;
            IF p_first < 1 OR n IS DISTINCT FROM p_last - p_first + 1 OR x_min IS NULL THEN
                RAISE EXCEPTION 'eventstore_seal: versions %..% of session row % are not all rows',
                    p_first, p_last, p_pk USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            IF closed_by IS NULL OR t_max >= closed_by OR EXISTS (
                SELECT 1 FROM {schema}.events e
                 WHERE e.session_pk = p_pk
                   AND ((e.version = p_first - 1 AND e.turn = t_min) OR (e.version = p_last + 1 AND e.turn = t_max))
            ) THEN
                RAISE EXCEPTION 'eventstore_seal: versions %..% of session row % are not a whole closed turn',
                    p_first, p_last, p_pk USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            SELECT e.hash INTO last_hash FROM {schema}.events e
             WHERE e.session_pk = p_pk AND e.version = p_last;
            INSERT INTO {schema}.sealed_event_ids (session_pk, event_id, version)
            SELECT e.session_pk, e.event_id, e.version FROM {schema}.events e
             WHERE e.session_pk = p_pk AND e.version BETWEEN p_first AND p_last
               AND e.event_id IS NOT NULL;
            INSERT INTO {schema}.event_segments
                (session_pk, first_version, last_version, first_turn, last_turn, min_xact, max_xact,
                 prev_hash, end_hash, xact_digest, body)
            VALUES (p_pk, p_first, p_last, t_min, t_max, x_min, x_max, p_prev, last_hash, digest, p_body);
            INSERT INTO {schema}.compaction_permits (session_pk, upto) VALUES (p_pk, p_last);
            DELETE FROM {schema}.events e
             WHERE e.session_pk = p_pk AND e.version BETWEEN p_first AND p_last;
            DELETE FROM {schema}.compaction_permits p WHERE p.session_pk = p_pk;
        END
        $$
        """,
        f"REVOKE ALL ON FUNCTION {SEAL_SIGNATURE} FROM PUBLIC",
    )


PG_DROP_SEAL_FUNCTION = (f"DROP FUNCTION IF EXISTS {SEAL_SIGNATURE}",)


def upgrade() -> None:
    name = _dialect()
    op.create_table(
        "event_segments",
        sa.Column("session_pk", sa.Integer(), nullable=False),
        sa.Column("first_version", sa.Integer(), nullable=False),
        sa.Column("last_version", sa.Integer(), nullable=False),
        sa.Column("first_turn", sa.Integer(), nullable=False),
        sa.Column("last_turn", sa.Integer(), nullable=False),
        sa.Column("min_xact", sa.BigInteger(), nullable=False),
        sa.Column("max_xact", sa.BigInteger(), nullable=False),
        sa.Column("prev_hash", sa.LargeBinary(), nullable=False),
        sa.Column("end_hash", sa.LargeBinary(), nullable=False),
        sa.Column("xact_digest", sa.LargeBinary(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("session_pk", "first_version", name="pk_event_segments"),
    )
    op.create_index("ix_event_segments_max_xact", "event_segments", ["max_xact"])
    op.create_table(
        "sealed_event_ids",
        sa.Column("session_pk", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("session_pk", "event_id", name="pk_sealed_event_ids"),
    )
    if name == "postgresql":
        bind = op.get_bind()
        schema = bind.execute(sa.text("SELECT current_schema()")).scalar()
        for statement in pg_seal_function(bind.dialect.identifier_preparer.quote_schema(str(schema))):
            op.execute(statement)


_SEGMENTS = sa.text(
    "SELECT session_pk, first_version, last_version, prev_hash, end_hash, xact_digest, "
    "min_xact, max_xact, body FROM event_segments ORDER BY session_pk, first_version"
)
_INSERT_EVENT = sa.text(
    "INSERT INTO events (session_pk, version, event_id, type, turn, payload, recorded_at, "
    "actor, metadata, hash, xact, native) VALUES (:session_pk, :version, :event_id, :type, "
    ":turn, :payload, :recorded_at, :actor, :metadata, :hash, :xact, :native)"
).bindparams(
    sa.bindparam("payload", type_=sa.LargeBinary()),
    sa.bindparam("metadata", type_=sa.LargeBinary()),
    sa.bindparam("hash", type_=sa.LargeBinary()),
    sa.bindparam("native", type_=sa.LargeBinary()),
)


def _unseal(bind: sa.Connection) -> None:
    """Put every sealed event back as its row (with its feed number): nothing is lost."""
    from eventstore.core.rows import SegmentHead
    from eventstore.core.segments import decode_segment

    for r in bind.execute(_SEGMENTS).all():
        head = SegmentHead(r[0], r[1], r[2], bytes(r[3]), bytes(r[4]), bytes(r[5]), r[6], r[7])
        rows = [
            {
                "session_pk": e.row.session_pk, "version": e.row.version, "event_id": e.row.event_id,
                "type": e.row.type, "turn": e.row.turn, "payload": e.row.payload,
                "recorded_at": e.row.recorded_at, "actor": e.row.actor, "metadata": e.row.metadata,
                "hash": e.row.hash, "xact": e.xact, "native": e.row.native,
            }
            for e in decode_segment(head, bytes(r[8]))
        ]
        bind.execute(_INSERT_EVENT, rows)


def downgrade() -> None:
    name = _dialect()
    _unseal(op.get_bind())
    if name == "postgresql":
        for statement in PG_DROP_SEAL_FUNCTION:
            op.execute(statement)
    op.drop_table("sealed_event_ids")
    op.drop_index("ix_event_segments_max_xact", table_name="event_segments")
    op.drop_table("event_segments")


def _dialect() -> str:
    name = op.get_bind().dialect.name
    if name not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
    return str(name)
