"""Storage backends: bytes and integers in, bytes and integers out.

:func:`open_storage` picks the backend from the URL's scheme. Nothing here knows what an
action or a state is; ``eventstore.store`` joins storage with the codec and the reducer.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SAWarning

from eventstore.errors import StorageError
from eventstore.storage.interface import SegmentCoder, Storage
from eventstore.storage.urls import check_driver, mask_url, quote_password

# Options that only a PostgreSQL storage understands (refused for SQLite, not ignored).
_POSTGRES_ONLY = ("replicas", "max_replica_lag", "replica_wait", "partitions")

if TYPE_CHECKING:
    from eventstore.storage.sql import SqlStorage

__all__ = ["open_storage", "Storage"]


def open_storage(url: str, *, segment_coder: SegmentCoder | None = None, **options: Any) -> Storage:
    """Open the storage behind a SQLAlchemy URL.

    Args:
        url: ``sqlite:///path.db`` (``sqlite://`` for memory) or
            ``postgresql+psycopg://user:pw@host/db`` (``postgresql://`` means the same).
        **options: backend options (``busy_timeout_ms`` for SQLite, ``pool_size`` for PostgreSQL);
            PostgreSQL only: ``replicas`` (URLs of streaming replicas that serve reads),
            ``max_replica_lag`` and ``replica_wait`` (seconds; see
            :class:`~eventstore.storage.replicas.ReplicatedPostgresStorage`) and
            ``partitions`` (hash-partition new event and snapshot tables by session).

    Returns:
        A :class:`Storage`; close it with ``close()``. It reads and writes sealed segments
        with ``segment_coder`` (the engine's codec; without one, a sealed segment met is an
        error).

    Raises:
        StorageError: the URL is malformed or names an unsupported database, or a
            PostgreSQL-only option is given for SQLite.
    """
    storage = _open(quote_password(url), **options)
    if segment_coder is not None:
        storage.use_segments(segment_coder)
    return storage


def _open(url: str, **options: Any) -> SqlStorage:
    """The storage class of the URL's backend, opened with ``options`` (see :func:`open_storage`)."""
    try:
        parsed = make_url(url)
        backend = parsed.get_backend_name()
        driver = parsed.drivername.partition("+")[2] or None
    except Exception as exc:  # noqa: BLE001 - any parse failure is the caller's URL
        raise StorageError(
            f"not a database URL: {mask_url(url)} ({_first_line(exc, url)})"
        ) from exc
    refused = check_driver(backend, driver)
    if refused is not None:
        raise StorageError(f"{refused} (in {mask_url(url)})")
    try:
        with warnings.catch_warnings():
            # e.g. query arguments the SQLite driver would silently ignore
            warnings.simplefilter("error", SAWarning)
            if backend == "sqlite":
                from eventstore.storage.sqlite import SQLiteStorage

                for name in _POSTGRES_ONLY:
                    value = options.get(name)
                    # Asking for none of it is fine: no replicas, zero partitions.
                    if not (
                        value is None or value in ([], ()) or (type(value) is int and value == 0)
                    ):
                        raise StorageError(
                            f"{name} needs PostgreSQL; {mask_url(url)} is SQLite "
                            "(see docs/scaling.md)"
                        )
                    options.pop(name, None)
                return SQLiteStorage(url, **options)
            from eventstore.storage.postgres import PostgresStorage

            if options.get("replicas") in (None, [], ()):
                for name in ("replicas", "max_replica_lag", "replica_wait"):
                    options.pop(name, None)
                return PostgresStorage(url, **options)
            from eventstore.storage.replicas import ReplicatedPostgresStorage

            return ReplicatedPostgresStorage(url, **options)
    except (ImportError, ArgumentError, SAWarning) as exc:
        # A driver or URL argument SQLAlchemy cannot use: the caller's URL, not the database.
        raise StorageError(f"bad database URL {mask_url(url)}: {_first_line(exc, url)}") from exc


def _first_line(exc: BaseException, url: str) -> str:
    # Parser messages may span lines and may quote the URL: keep one line, masked.
    lines = str(exc).replace(url, mask_url(url)).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
