"""PostgreSQL via psycopg 3: row locks per session, upserts, plpgsql immutability triggers.

This is the only module that imports psycopg.
"""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg.errors
from sqlalchemy import Connection, create_engine, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from .schema import snapshots
from .sql import ErrorKind, SqlStorage

__all__ = ["PostgresStorage", "IMMUTABILITY_DDL_V1", "DROP_IMMUTABILITY_DDL_V1"]

# pg_advisory_xact_lock key for migrations: crc32(b"eventstore-migrate").
_MIGRATION_LOCK = 0x4E5F_7A31

#: Triggers of revision 0001: no UPDATE, no TRUNCATE; DELETE only under a compaction permit.
IMMUTABILITY_DDL_V1 = (
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

DROP_IMMUTABILITY_DDL_V1 = (
    "DROP TRIGGER IF EXISTS events_no_truncate ON events",
    "DROP TRIGGER IF EXISTS events_immutable ON events",
    "DROP FUNCTION IF EXISTS eventstore_events_guard()",
)

_RETRYABLE = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
    psycopg.errors.AdminShutdown,
    psycopg.errors.CannotConnectNow,
    psycopg.OperationalError,
)


class PostgresStorage(SqlStorage):
    """Storage on PostgreSQL (``postgresql+psycopg://user:pw@host/db``)."""

    def __init__(self, url: str, *, pool_size: int = 5, echo: bool = False) -> None:
        u = make_url(url)
        if u.drivername in ("postgresql", "postgres"):
            u = u.set(drivername="postgresql+psycopg")  # psycopg 3, not the psycopg2 default
        engine = create_engine(u, pool_pre_ping=True, pool_size=pool_size, echo=echo)
        super().__init__(engine, url)

    def _lock_clause(self, stmt: Any) -> Any:
        return stmt.with_for_update()

    def _insert_ignore(self, table: Any) -> Any:
        return pg_insert(table).on_conflict_do_nothing()

    def _upsert_snapshot(self) -> Any:
        stmt = pg_insert(snapshots)
        return stmt.on_conflict_do_update(
            index_elements=[snapshots.c.session_pk, snapshots.c.version],
            set_={
                "reducer_version": stmt.excluded.reducer_version,
                "rest": stmt.excluded.rest,
                "message_digests": stmt.excluded.message_digests,
            },
        )

    def _migration_lock(self, conn: Connection) -> None:
        conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK)))

    def _classify(self, exc: DBAPIError) -> ErrorKind:
        orig = exc.orig
        if isinstance(orig, psycopg.errors.UniqueViolation):
            constraint = getattr(orig.diag, "constraint_name", None) or ""
            if constraint == "pk_events":
                return ErrorKind.VERSION_TAKEN
            if constraint == "ix_events_session_pk_event_id":
                return ErrorKind.EVENT_ID_TAKEN
            return ErrorKind.OTHER
        if isinstance(orig, psycopg.errors.UndefinedTable):
            return ErrorKind.NO_SCHEMA
        if exc.connection_invalidated or isinstance(orig, _RETRYABLE):
            return ErrorKind.RETRYABLE
        return ErrorKind.OTHER
