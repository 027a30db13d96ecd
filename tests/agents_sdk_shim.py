"""A pytest plugin for the OpenAI Agents SDK's own session tests: ``SQLiteSession`` is
:class:`~eventstore.integrations.openai_agents.EventStoreSession`.

Loaded with ``-p agents_sdk_shim`` by ``tests/test_openai_agents_sdk.py``, in a pytest run
of the SDK's test files. The backend comes from ``EVENTSTORE_AGENTS_BACKEND``
(``sqlite`` or ``postgresql``; the server is the one of ``EVENTSTORE_TEST_PG_URL``).

``SQLiteSession(session_id, db_path=":memory:", ..., session_settings=None)`` keeps its
call shape: each distinct ``db_path`` is one database (a SQLite file; on PostgreSQL a
schema of its own), and ``":memory:"`` a new one per session, as SQLite gives. Each new
database is a copy of this process's migrated template (tests/db_templates.py), as the
store fixtures make them: the session's own ``migrate()`` then finds nothing to do,
rather than run every revision for each of the tests' sessions (most of the run's time).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import agents
import agents.memory
import db_templates as templates

from eventstore.integrations.openai_agents import EventStoreSession

BACKEND = os.environ.get("EVENTSTORE_AGENTS_BACKEND", "sqlite")
_schemas: dict[str, str] = {}
_memory_dir = tempfile.TemporaryDirectory(prefix="agents-sdk-memory-")


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _url_for(db_path: Any) -> str:
    key = str(db_path)
    if BACKEND == "sqlite":
        if key == ":memory:":
            key = str(Path(_memory_dir.name) / f"{uuid.uuid4().hex}.db")
        return _migrated(key, f"sqlite:///{key}")
    admin = os.environ["EVENTSTORE_TEST_PG_URL"]
    sep = "&" if "?" in admin else "?"
    if key != ":memory:" and key in _schemas:
        return f"{admin}{sep}options=-csearch_path%3D{_schemas[key]}"
    schema = f"sdk_{uuid.uuid4().hex[:16]}"
    templates.admin_execute(_dsn(admin), f'CREATE SCHEMA "{schema}"')
    _schemas[key if key != ":memory:" else f":memory:{schema}"] = schema
    return _migrated(schema, f"{admin}{sep}options=-csearch_path%3D{schema}")


def _migrated(name: str, url: str) -> str:
    """``url``, its database (``name``: a file or a schema) a copy of the migrated template
    when nothing is in it yet (a ``db_path`` a test made itself is left as it is)."""
    templates.offer(name)
    templates.fill(url, {})
    templates.withdraw(name)
    return url


class SQLiteSession(EventStoreSession):
    """``SQLiteSession``'s constructor over :class:`EventStoreSession`."""

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: Any = None,
    ) -> None:
        super().__init__(session_id, _url_for(db_path), session_settings=session_settings)


def pytest_configure(config: Any) -> None:
    agents.SQLiteSession = SQLiteSession  # type: ignore[misc]
    agents.memory.SQLiteSession = SQLiteSession  # type: ignore[misc]


def pytest_unconfigure(config: Any) -> None:
    _memory_dir.cleanup()
    for schema in _schemas.values():
        templates.admin_execute(_dsn(os.environ["EVENTSTORE_TEST_PG_URL"]), f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    templates.close()
