"""The limit: a bare table written with raw psycopg, no library in between.

Table ``events(session_id, seq, type, data jsonb, created_at, PK(session_id, seq))`` as
issue 3 defines it. One event per transaction is ``INSERT`` + ``COMMIT``; a batch is one
pipelined ``executemany`` in one transaction. Loading means fetching the session's rows
and folding them with eventstore's reducer (there is no snapshot), which is what an
application with only this table would have to do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.peers.base import Action, State, db_name, fresh_database, pg_size, pg_url
from eventstore.core.reducer import fold_json

DDL = """
CREATE TABLE events (
    session_id text NOT NULL,
    seq        bigint NOT NULL,
    type       text NOT NULL,
    data       jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq)
)
"""
INSERT = "INSERT INTO events (session_id, seq, type, data) VALUES (%s, %s, %s, %s)"


class RawPsycopg:
    key = "raw"
    label = "raw psycopg (bare table)"
    per_event = True
    per_turn = True
    note = (
        "bare table, autocommit INSERT per event, one pipelined executemany transaction per batch; "
        "load = SELECT the rows and fold"
    )

    def __init__(self) -> None:
        self.conn: psycopg.Connection[Any] | None = None
        self.db = ""
        self.heads: dict[str, int] = {}

    def open(self, tag: str, *, create: bool = True) -> None:
        self.db = db_name(self.key, tag)
        if create:
            fresh_database(self.db)
        self.conn = psycopg.connect(pg_url(self.db), autocommit=True)
        if create:
            self.conn.execute(DDL)
        self.heads = {}

    def append(self, session: str, actions: Sequence[Action]) -> None:
        assert self.conn is not None
        seq = self.heads.get(session, 0)
        rows = [
            (session, seq + i, a["type"], Jsonb(a)) for i, a in enumerate(actions, start=1)
        ]
        if len(rows) == 1:
            self.conn.execute(INSERT, rows[0])
        else:
            with self.conn.pipeline(), self.conn.transaction(), self.conn.cursor() as cur:
                cur.executemany(INSERT, rows)
        self.heads[session] = seq + len(rows)

    def _rows(self, session: str, version: int | None) -> list[Action]:
        assert self.conn is not None
        with self.conn.cursor() as cur:
            if version is None:
                cur.execute(
                    "SELECT data FROM events WHERE session_id = %s ORDER BY seq", (session,)
                )
            else:
                cur.execute(
                    "SELECT data FROM events WHERE session_id = %s AND seq <= %s ORDER BY seq",
                    (session, version),
                )
            return [r[0] for r in cur.fetchall()]

    def load(self, session: str, version: int | None = None) -> State:
        return fold_json(None, self._rows(session, version))

    def history(self, session: str) -> Iterator[Action]:
        return iter(self._rows(session, None))

    def mark(self, session: str, version: int) -> None:
        pass

    def size_bytes(self) -> int:
        return pg_size(self.db)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
