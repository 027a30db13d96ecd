"""Session-partitioned event tables: how many partitions `migrate` creates, and the check that it can."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Text, column, func, literal, select, table

from eventstore.errors import SchemaError, StorageError
from eventstore.storage.sql.statements import inline

__all__ = ["PARTITION_SETTING", "MAX_PARTITIONS", "partition_count", "migration_options"]

#: The server setting that asks `migrate` for session-partitioned tables when the
#: `partitions` option is not given (``ALTER DATABASE db SET eventstore.partitions = 16``,
#: or ``options=-c eventstore.partitions=16`` in the URL).
PARTITION_SETTING = "eventstore.partitions"
#: The most hash partitions `migrate` creates (each one costs planning time).
MAX_PARTITIONS = 1024

# Whether the `events` table on the search path is partitioned, and into how many parts.
_class = table("pg_class", column("oid"), column("relkind")).alias("c")
_inherits = table("pg_inherits", column("inhparent")).alias("i")
_PARTITION_STATE = select(
    (_class.c.relkind == inline("p", Text)).label("partitioned"),  # a "char", not text
    select(func.count())
    .select_from(_inherits)
    .where(_inherits.c.inhparent == _class.c.oid)
    .scalar_subquery()
    .label("parts"),
).where(_class.c.oid == func.to_regclass(literal("events", Text)))


def partition_count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StorageError(f"{where} must be a whole number of partitions, not {value!r}")
    if not 0 <= value <= MAX_PARTITIONS:
        raise StorageError(f"{where} must be between 0 and {MAX_PARTITIONS}, not {value}")
    return value


def partition_setting(value: str | None) -> int:
    """The server's ``eventstore.partitions`` (unset or empty: 0)."""
    text_value = (value or "").strip()
    if not text_value:
        return 0
    if not text_value.isdigit():
        raise StorageError(
            f"{PARTITION_SETTING} must be a whole number of partitions, not {text_value!r}"
        )
    return partition_count(int(text_value), PARTITION_SETTING)


def migration_options(conn: Connection, partitions: int, safe_url: str) -> dict[str, Any]:
    """Options of :func:`~eventstore.storage.migrate.upgrade`: the partitions asked for
    (``partitions``, else the server's setting), refused when the tables exist otherwise."""
    n = partitions or partition_setting(
        conn.execute(select(func.current_setting(PARTITION_SETTING, True))).scalar()
    )
    state = conn.execute(_PARTITION_STATE).first()
    if n and state is not None and (not state.partitioned or state.parts != n):
        # The tables exist: turning them into partitioned ones is a data migration.
        have = f"{state.parts} partitions" if state.partitioned else "no partitions"
        raise SchemaError(
            f"the database {safe_url} already has its event tables with {have}, "
            f"not {n}; see docs/scaling.md to move them"
        )
    return {"partitions": n}
