"""Alembic, driven from code: find the revisions (checkout or installed wheel) and upgrade.

The wheel ships ``migrations/`` as ``eventstore/_migrations`` (hatch force-include, see
pyproject.toml); an editable install or a checkout uses the repository's ``migrations/``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

from .schema import VERSION_TABLE

__all__ = ["migrations_dir", "alembic_config", "upgrade", "HEAD_REVISION"]

#: The newest revision this package knows.
HEAD_REVISION = "0003_turn_leases"


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


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for our revisions, bound to ``connection`` when given."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def upgrade(connection: Connection, revision: str = "head") -> None:
    """Upgrade the database behind ``connection`` (in its open transaction) to ``revision``."""
    command.upgrade(alembic_config(connection), revision)
