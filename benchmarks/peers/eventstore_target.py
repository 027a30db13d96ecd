"""eventstore itself, on PostgreSQL and on SQLite, through its public API only.

Each durable write is one ``EventStore.append`` (one atomic batch, one transaction), with
``expected_version`` set as a real writer would (optimistic concurrency on). Loading is
``EventStore.load(session, version=...)`` (newest snapshot at or below the version + fold
of the tail); history is ``EventStore.history``. ``snapshot_every`` is left at the store's
default unless ``--es-snapshot-every`` says otherwise. Sealing is on (the store's default:
closed turns become compressed segments in the background) except for the ``-rows``
variant, which keeps every event a row (``seal=False``): the same run's baseline for what
sealing costs an append and a checkout.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from benchmarks.peers.base import Action, State, db_name, fresh_database, pg_size, pg_url
from eventstore import EventStore


class EventstoreTarget:
    per_event = True
    per_turn = True

    def __init__(self, backend: str, snapshot_every: int | None = None, *, seal: bool = True) -> None:
        assert backend in ("postgresql", "sqlite")
        self.backend = backend
        self.seal = seal
        self.snapshot_every = snapshot_every
        self.key = ("es-pg" if backend == "postgresql" else "es-sqlite") + ("" if seal else "-rows")
        self.label = ("eventstore (PostgreSQL)" if backend == "postgresql" else "eventstore (SQLite)")
        if not seal:
            self.label = self.label[:-1] + ", seal=False)"
        snap = f"snapshot_every={snapshot_every}" if snapshot_every else "default snapshot_every"
        sealing = ("sealing on (closed turns sealed in the background)" if seal
                   else "seal=False (every event a row)")
        self.note = f"EventStore.append with expected_version, {snap}, {sealing}"
        self.store: Any = None
        self.db = ""
        self.path = ""
        self.heads: dict[str, int] = {}
        self._dir = os.environ.get("BENCH_SQLITE_DIR") or tempfile.gettempdir()

    def _url(self, tag: str) -> str:
        if self.backend == "postgresql":
            self.db = db_name(self.key, tag)
            return pg_url(self.db, driver=True)
        self.path = os.path.join(self._dir, f"bench-es-sqlite-{tag}.db")
        return f"sqlite:///{self.path}"

    def open(self, tag: str, *, create: bool = True) -> None:
        url = self._url(tag)
        if create:
            if self.backend == "postgresql":
                fresh_database(self.db)
            else:
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(self.path + suffix):
                        os.remove(self.path + suffix)
        kwargs: dict[str, Any] = {"snapshot_every": self.snapshot_every} if self.snapshot_every else {}
        self.store = EventStore(url, seal=self.seal, **kwargs)
        if create:
            self.store.migrate()
        self.heads = {}

    def append(self, session: str, actions: Sequence[Action]) -> None:
        head = self.heads.get(session, 0)
        result = self.store.append(session, list(actions), expected_version=head)
        self.heads[session] = result.version

    def load(self, session: str, version: int | None = None) -> State:
        return self.store.load(session, version=version).to_json()  # type: ignore[no-any-return]

    def history(self, session: str) -> Iterator[Any]:
        return iter(self.store.history(session))

    def mark(self, session: str, version: int) -> None:
        pass

    def settle(self) -> None:
        """Seal what the background sealer has not sealed yet (before bytes are measured:
        the figure must not depend on how far behind it was)."""
        if self.seal and self.store is not None:
            self.store.seal()

    def size_bytes(self) -> int:
        if self.backend == "postgresql":
            return pg_size(self.db)
        # Fold the WAL into the main file first, so the file size is the data size.
        with sqlite3.connect(self.path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        return int(page_size * (pages - free))

    def close(self) -> None:
        if self.store is not None:
            close = getattr(self.store, "close", None)
            if close is not None:
                close()
            self.store = None
