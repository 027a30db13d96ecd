"""The one interface every benchmark target implements, and the helpers they share.

A *target* is one way a user could persist a chat session: a bare PostgreSQL table written
with raw psycopg (the limit), eventstore on PostgreSQL or SQLite, LangGraph's
``PostgresSaver`` checkpointer, LangGraph's ``DeltaChannel``, or the ``eventsourcing``
library. The harness (:mod:`benchmarks.compare`) drives every target through the same
calls on the same workload, so the numbers are comparable:

- :meth:`Target.open` gives the target fresh, empty storage of its own (a PostgreSQL
  database or a SQLite file), so :meth:`Target.size_bytes` measures only what it wrote;
- :meth:`Target.append` is *one durable write*: one transaction for the event stores, one
  checkpoint (or one graph run) for LangGraph. The harness calls it once per event or once
  per turn and times it;
- :meth:`Target.load` returns the state in the wire shape (JSON), which the harness
  compares with the reference fold: a fast but wrong target is reported as wrong.

Versions are event counts: version ``v`` is the state after the first ``v`` actions.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import psycopg

Action = dict[str, Any]
State = dict[str, Any]


class Unsupported(Exception):
    """The target cannot do this operation (e.g. a version between two checkpoints)."""


@runtime_checkable
class Target(Protocol):
    """A persistence layer under test.

    Attributes:
        key: short identifier used on the command line and in the JSON output.
        label: human name used in tables and plots.
        per_event: whether "one event per durable write" is a meaningful figure for it.
        per_turn: whether "one turn per durable write" is a meaningful figure for it.
        note: one line on how the target was configured, printed under the tables.
    """

    key: str
    label: str
    per_event: bool
    per_turn: bool
    note: str

    def open(self, tag: str, *, create: bool = True) -> None:
        """Create fresh, empty storage named after ``tag`` and connect to it.

        Args:
            tag: unique per call (e.g. ``"t200"``); targets derive a database or file name.
            create: ``False`` connects to storage an earlier ``open(tag)`` created (how the
                concurrent writers, one per process, attach to one database).
        """

    def append(self, session: str, actions: Sequence[Action]) -> None:
        """Durably append ``actions`` to ``session`` in one write (one transaction).

        Args:
            session: the session id; created by its first append.
            actions: action dicts in the wire shape, in order.
        """

    def load(self, session: str, version: int | None = None) -> State:
        """The session's state after ``version`` events (``None`` = head), as wire-shaped JSON.

        Raises:
            Unsupported: the target kept no state at that version.
        """

    def history(self, session: str) -> Iterator[Any]:
        """Read the session's whole recorded history, decoded, one item at a time.

        Events oldest first for the event stores; checkpoints (newest first, as the library
        lists them) for LangGraph. The harness consumes the iterator under a time limit.
        """

    def mark(self, session: str, version: int) -> None:
        """Remember that the session's head is now ``version`` (called untimed).

        Targets that address old states by an opaque id (LangGraph checkpoint ids) record it
        here so :meth:`load` can find version ``version`` later; others do nothing.
        """

    def size_bytes(self) -> int:
        """Bytes on disk of everything this target stored since :meth:`open`."""

    def close(self) -> None:
        """Release connections; keep nothing open between sizes."""


# --------------------------------------------------------------------------- PostgreSQL


def pg_base_url() -> str:
    """The server URL exported by ``scripts/with-postgres``, without the SQLAlchemy driver."""
    url = os.environ.get("EVENTSTORE_TEST_PG_URL")
    if not url:
        raise RuntimeError(
            "EVENTSTORE_TEST_PG_URL is not set: run under scripts/with-postgres"
        )
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def pg_url(dbname: str, *, driver: bool = False) -> str:
    """URL of database ``dbname`` on the benchmark server (``driver``: SQLAlchemy form)."""
    base = pg_base_url().rsplit("/", 1)[0] + "/" + dbname
    return base.replace("postgresql://", "postgresql+psycopg://", 1) if driver else base


def db_name(prefix: str, tag: str) -> str:
    """A safe PostgreSQL database name."""
    return re.sub(r"[^a-z0-9_]", "_", f"bench_{prefix}_{tag}".lower())[:60]


def fresh_database(name: str) -> None:
    """Drop (if present) and create database ``name``."""
    with psycopg.connect(pg_base_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    with psycopg.connect(pg_base_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_size(dbname: str) -> int:
    """Tables + indexes + TOAST of every user table in ``dbname`` (pg_total_relation_size).

    Runs VACUUM first so the free-space and visibility maps exist for every target alike.
    """
    with psycopg.connect(pg_url(dbname), autocommit=True) as conn:
        conn.execute("VACUUM")
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p', 'm') "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "AND n.nspname NOT LIKE 'pg_toast%'"
        ).fetchone()
    return int(row[0]) if row else 0
