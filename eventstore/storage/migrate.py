"""Alembic, driven from code: find the revisions (checkout or installed wheel) and upgrade.

The wheel ships ``migrations/`` as ``eventstore/_migrations`` (hatch force-include, see
pyproject.toml); an editable install or a checkout uses the repository's ``migrations/``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from eventstore.storage.schema import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = ["migrations_dir", "alembic_config", "upgrade", "HEAD_REVISION"]

#: The newest revision this package knows.
HEAD_REVISION = "0012_snapshot_blob_refs"


def migrations_dir() -> Path:
    """The directory holding Alembic's ``env.py`` and ``versions/``.

    Raises:
        FileNotFoundError: neither the packaged nor the repository copy exists.
    """
    packaged = resources.files("eventstore") / "_migrations"
    if packaged.is_dir() and (packaged / "env.py").is_file():
        return Path(str(packaged))
    repo = Path(__file__).resolve().parents[2] / "migrations"
    if (repo / "env.py").is_file():
        return repo
    raise FileNotFoundError(
        "eventstore's migrations are missing (neither eventstore/_migrations nor ./migrations)"
    )


def alembic_config(connection: Connection | None = None, *, partitions: int = 0) -> Config:
    """An Alembic config for our revisions, bound to ``connection`` when given.

    ``partitions`` (PostgreSQL): when the first revision creates the tables, make
    ``events`` and ``snapshots`` hash-partitioned by session into this many partitions
    (0: plain tables). Revisions read it as ``context.config.attributes["partitions"]``.
    """
    # Alembic is imported only when a migration runs: it is a tenth of a second of
    # start-up that every other command (and the CLI's start) would pay for nothing.
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        cfg.attributes["connection"] = connection
    cfg.attributes["partitions"] = partitions
    return cfg


def upgrade(connection: Connection, revision: str = "head", *, partitions: int = 0) -> None:
    """Upgrade the database behind ``connection`` (in its open transaction) to ``revision``.

    ``partitions``: see :func:`alembic_config` (only the creation of the tables uses it).
    """
    from alembic import command

    command.upgrade(alembic_config(connection, partitions=partitions), revision)
