"""The DDL that Alembic revisions ran, loaded from the revisions themselves.

Tests that play a database owner who drops and recreates the immutability triggers use
the very statements a revision ran: the runtime modules hold no DDL.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType

VERSIONS = Path(__file__).resolve().parents[1] / "migrations" / "versions"


@cache
def revision(name: str) -> ModuleType:
    """The revision module ``migrations/versions/NAME.py`` (loaded once, not run)."""
    spec = importlib.util.spec_from_file_location(f"frozen_ddl_{name}", VERSIONS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sqlite_immutability() -> tuple[str, ...]:
    """Revision 0001's SQLite triggers: no UPDATE, DELETE only under a compaction permit."""
    return tuple(revision("0001_create_event_log").SQLITE_IMMUTABILITY)


def sqlite_drop_immutability() -> tuple[str, ...]:
    return tuple(revision("0001_create_event_log").SQLITE_DROP_IMMUTABILITY)


def sqlite_drop_audit() -> tuple[str, ...]:
    """Drops revision 0002's SQLite insert guards."""
    return tuple(revision("0002_add_audit_tables").SQLITE_DROP_AUDIT)
