"""PostgreSQL's load: a root session's row, snapshot, its stored blobs and tail in one round trip."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from typing import Any, TypeVar

import psycopg
from psycopg.rows import tuple_row

from eventstore.core.rows import LoadParts, SessionRow
from eventstore.storage.postgres.connections import Connections
from eventstore.storage.postgres.statements import compile_hot, load_stmt
from eventstore.storage.sql import Compiled, session_row

__all__ = ["HotLoads"]

# A session row, or maybe none (what _session_seen passes through).
_Row = TypeVar("_Row", SessionRow, SessionRow | None)


class HotLoads(Connections):
    """The load path of :class:`~eventstore.storage.postgres.PostgresStorage`, and the
    session keys it learns from every session row read."""

    _q_load: Compiled
    _q_load_by_key: Compiled

    def _load_queries(self) -> None:
        """Compile the head load (:func:`load_stmt`) once, by id and by key."""
        d = self.engine.dialect
        self._q_load = compile_hot(load_stmt(by_key=False), d)
        self._q_load_by_key = compile_hot(load_stmt(by_key=True), d)

    def load_parts(
        self, session_id: str, version: int | None, reducer_version: int
    ) -> LoadParts | None:
        # Learnt from every session row read (see _session_seen), so a load can name the
        # session's key (see load_stmt).
        key = self.session_keys.key(session_id)
        params = {"id": session_id, "version": version, "rv": reducer_version, "pk": key}
        with self._errors():
            r = self._load_retried(params)
            if r is None and key is not None:
                # A key that no longer names this id (the session was erased): by id alone.
                self.session_keys.forget(session_id)
                r = self._load_retried({**params, "pk": None})
        if r is None:
            return LoadParts(None)
        row = self._session_seen(session_row(r))
        if row.parent_pk is not None:
            return LoadParts(row)
        v, base = (row.head if version is None else version), (r.version or 0)

        def segments() -> list[Any]:
            # Read by the load statement itself (see load_stmt): rows shaped as S_SEGMENTS's.
            if r.g_first_version is None:
                return []
            return list(
                zip(
                    itertools.repeat(row.pk), r.g_first_version, r.g_last_version, r.g_prev_hash,
                    r.g_end_hash, r.g_xact_digest, r.g_min_xact, r.g_max_xact, r.g_body,
                )
            )

        return self._complete_load(
            row,
            base,
            v,
            r.n,
            segments,
            rest=r.rest,
            bodies=tuple(r.bodies or ()),
            n_digests=r.n_digests,
            n_found=r.n_found,
            tail=r.payloads or b"",
        )

    def _session_seen(self, row: _Row) -> _Row:
        """Remember a session row's key for later loads of that session (a key that turns
        out wrong, e.g. of a rolled-back insert, only costs a load one more round trip)."""
        if row is not None:
            self.session_keys.learn(row.id, row.pk)
        return row

    def _load_retried(self, params: Mapping[str, Any]) -> Any:
        try:
            # Without the checkout's pre-ping round trip (the append fast path's
            # alive-bypass window)...
            return self._load_row(params, hot=True)
        except psycopg.OperationalError:
            # ...and, since a read is idempotent, once more on a pinged connection if
            # that one turned out dead (killed backend, server restart): a load never
            # fails for a connection that was merely stale.
            self._suspect_before = time.monotonic()
            return self._load_row(params, hot=False)

    def _load_row(self, params: Mapping[str, Any], *, hot: bool) -> Any:
        """The one row of the head load (by key when ``params`` name the session's key),
        on a hot autocommit connection (see :meth:`_autocommit`)."""
        q = self._q_load if params["pk"] is None else self._q_load_by_key
        with self._autocommit(hot=hot) as cur:
            # Plain tuples named by the statement's own row type: psycopg's named tuples
            # build the result's column descriptions at every execution (~10 µs a load).
            cur.row_factory = tuple_row
            # Prepared at its first use on a connection, not the sixth: a cold load then
            # skips parsing and analysing the statement every time.
            cur.execute(q.sql, q.args(params), binary=True, prepare=self._prepare_load or None)
            r = cur.fetchone()
            return None if r is None else q.row._make(r)
