"""The ``eventsourcing`` library (pyeventsourcing) on its PostgreSQL persistence module.

One aggregate per chat session; each of our actions is one domain event (``Acted``) whose
``apply`` folds the action into the aggregate's state dict with eventstore's reducer. The
application is configured the way its documentation shows: ``PERSISTENCE_MODULE =
eventsourcing.postgres``, default JSON transcoder, no compression, no aggregate cache (so a
load really reads the database). With ``snapshot_every``, the application's
``snapshotting_intervals`` takes a snapshot every N aggregate versions at save time, and
``repository.get(id, version=v)`` starts from the newest snapshot at or below ``v``.

Writes reuse the in-memory aggregate (as a long-running process with the session open
would); each :meth:`append` is one ``Application.save`` = one transaction. Aggregate
version 1 is the creation event, so our version ``v`` is aggregate version ``v + 1``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from benchmarks.peers.base import (
    Action,
    State,
    db_name,
    fresh_database,
    pg_base_url,
    pg_size,
)
from eventstore.core.reducer import fold_json

_NS = uuid.UUID("6f1c2b1e-0d7a-4c55-9d0e-4a4b3f7e2c10")


class ChatSession(Aggregate):
    """A chat session as an eventsourcing aggregate: its state is the folded session."""

    @staticmethod
    def create_id(session: str) -> uuid.UUID:
        return uuid.uuid5(_NS, session)

    @event("Started")
    def __init__(self, session: str) -> None:
        self.session = session
        self.state: dict[str, Any] = {"messages": [], "status": "idle"}

    @event("Acted")
    def act(self, action: dict[str, Any]) -> None:
        self.state = fold_json(self.state, [action])


def _app_class(snapshot_every: int | None) -> type[Application]:
    intervals = {ChatSession: snapshot_every} if snapshot_every else {}

    class Chats(Application):
        name = "chats"
        snapshotting_intervals = intervals

    return Chats


class EventsourcingTarget:
    per_event = True
    per_turn = True

    def __init__(self, snapshot_every: int | None = None) -> None:
        self.snapshot_every = snapshot_every
        self.key = f"esrc-snap{snapshot_every}" if snapshot_every else "esrc"
        self.label = (
            f"eventsourcing (snapshot every {snapshot_every})"
            if snapshot_every
            else "eventsourcing (no snapshots)"
        )
        self.note = (
            "eventsourcing.postgres, one aggregate per session, one domain event per action, "
            "JSON transcoder, no cache"
            + (f", snapshotting_intervals={snapshot_every}" if snapshot_every else "")
        )
        self.app: Application | None = None
        self.db = ""
        self.live: dict[str, ChatSession] = {}

    def open(self, tag: str, *, create: bool = True) -> None:
        self.db = db_name(self.key, tag)
        if create:
            fresh_database(self.db)
        # postgresql://user@host:port/db
        rest = pg_base_url().split("://", 1)[1]
        userinfo, hostpart = rest.split("@", 1)
        hostport = hostpart.split("/", 1)[0]
        host, port = hostport.rsplit(":", 1)
        user, _, password = userinfo.partition(":")
        env = {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": self.db,
            "POSTGRES_HOST": host,
            "POSTGRES_PORT": port,
            "POSTGRES_USER": user,
            "POSTGRES_PASSWORD": password or "",
            "POSTGRES_POOL_SIZE": "2",
            # Writers attaching to an existing database must not race on CREATE TABLE.
            "CREATE_TABLE": "yes" if create else "no",
        }
        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("POSTGRES_")}
        try:
            self.app = _app_class(self.snapshot_every)(env=env)
        finally:
            os.environ.update(saved)
        self.live = {}

    def append(self, session: str, actions: Sequence[Action]) -> None:
        assert self.app is not None
        agg = self.live.get(session)
        if agg is None:
            agg = ChatSession(session)
            self.live[session] = agg
        for a in actions:
            agg.act(a)
        self.app.save(agg)

    def load(self, session: str, version: int | None = None) -> State:
        assert self.app is not None
        agg = self.app.repository.get(
            ChatSession.create_id(session), version=None if version is None else version + 1
        )
        return agg.state  # type: ignore[no-any-return]

    def history(self, session: str) -> Iterator[Any]:
        assert self.app is not None
        return iter(self.app.events.get(ChatSession.create_id(session)))

    def mark(self, session: str, version: int) -> None:
        pass

    def size_bytes(self) -> int:
        return pg_size(self.db)

    def close(self) -> None:
        if self.app is not None:
            self.app.close()
            self.app = None
