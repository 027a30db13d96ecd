"""The feed: events of every session in commit order, in pages or bands, and the change watchers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, overload

from eventstore.core.rows import Band, FeedBarrier, FeedRow
from eventstore.storage.interface import AsyncChangeWatcher, ChangeWatcher, Tx
from eventstore.storage.sql.statements import event_values
from eventstore.storage.sql.transactions import SqlTransactions
from eventstore.storage.watch import TaskWatcher, ThreadWatcher

__all__ = ["Feed", "NO_BARRIER"]

#: The barrier of a feed whose every committed event is final (SQLite): none.
NO_BARRIER = 2**63 - 1


def _feed_rows(rows: Sequence[Any], session_id: Callable[[int], str]) -> list[FeedRow]:
    """The feed rows of a band's rows (:func:`read_band_stmt`), each session's id by its key."""
    # EventRow's fields but native, then the feed's own, then native (see FeedRow).
    return [
        FeedRow(*event_values(r)[:-1], r.xact, session_id(r.session_pk), r.native)
        for r in rows
    ]


class Feed(SqlTransactions):
    """Reading the feed and waiting for it to grow."""

    def feed_barrier(self, tx: Tx) -> FeedBarrier:
        return FeedBarrier(None)

    def read_feed(
        self, *, after: tuple[int, int, int] | None, limit: int, upto: int | None = None
    ) -> Band:
        if self.feed_banded:
            assert upto is not None, "a banded feed is read up to a feed number"
            return self._read_band(after=after, limit=limit, upto=upto)
        with self.read() as tx:
            rows = self._read_page(tx, after=after, limit=limit)
            # At the end: are committed events waiting behind an older open transaction?
            pending = len(rows) < limit and self.feed_barrier(tx).pending
        return Band(NO_BARRIER, rows, pending)

    def _read_page(
        self, tx: Tx, *, after: tuple[int, int, int] | None, limit: int
    ) -> list[FeedRow]:
        """Events in feed order after the key ``(xact, session_pk, version)`` of a storage
        whose every committed event is final (not :attr:`feed_banded`: SQLite)."""
        x, s, v = (-1, 0, 0) if after is None else after
        params = {"x": x, "s": s, "v": v, "lim": limit}
        rows: list[FeedRow] = self._fetchall(tx, self._q_feed, params)
        return self._merge_feed(tx, rows, after=(x, s, v), limit=limit)

    def _read_band(self, *, after: tuple[int, int, int] | None, limit: int, upto: int) -> Band:
        """One band of a :attr:`feed_banded` storage, in a read transaction of its own."""
        assert self._q_band is not None, "only a banded storage reads bands"
        with self.read() as tx:
            self._before_band(tx)
            rows = self._fetchall(tx, self._q_band, self._band_params(after, limit, upto))
            band = self._band(rows, lambda pks: self._fetchall(tx, self._q_session_ids, {"pks": pks}))
            return self._sealed_band(tx, band, after, limit, upto)

    def _sealed_band(
        self, tx: Tx, band: Band, after: tuple[int, int, int] | None, limit: int, upto: int
    ) -> Band:
        """A band with the sealed events of its range merged in (read in ``tx``)."""
        key = (-1, 0, 0) if after is None else after
        rows = self._merge_feed(tx, band.rows, after=key, limit=limit, top=min(upto, band.below - 1))
        return band if rows is band.rows else Band(band.below, rows, band.pending)

    @staticmethod
    def _band_params(after: tuple[int, int, int] | None, limit: int, upto: int) -> dict[str, int]:
        x, s, v = (-1, 0, 0) if after is None else after
        return {"x": x, "s": s, "v": v, "lim": limit, "upto": upto}

    def _band(self, rows: Sequence[Any], session_ids: Callable[[list[int]], Iterable[Any]]) -> Band:
        """A band from the rows of :func:`read_band_stmt`; ``session_ids`` reads the ids of
        sessions this storage has not seen yet (in the band's own transaction)."""
        # The barrier's row is there even when the band is empty.
        first = rows[0]
        below, pending = int(first.below), bool(first.pending)
        if first.session_pk is None:
            return Band(below, [], pending)
        try:
            return Band(below, _feed_rows(rows, self.session_keys.session_id), pending)
        except KeyError:
            found = dict(session_ids(list({r.session_pk for r in rows})))
            for pk, session_id in found.items():
                self.session_keys.learn(session_id, pk)
            return Band(below, _feed_rows(rows, found.__getitem__), pending)

    def _before_band(self, tx: Tx) -> None:
        """Settings a band's statement needs in its transaction (none by default)."""

    @overload
    def watcher(self, *, asyncio: Literal[False] = False) -> ChangeWatcher: ...

    @overload
    def watcher(self, *, asyncio: Literal[True]) -> AsyncChangeWatcher: ...

    def watcher(self, *, asyncio: bool = False) -> ChangeWatcher | AsyncChangeWatcher:
        return self._task_watcher() if asyncio else self._thread_watcher()

    def _thread_watcher(self) -> ChangeWatcher:
        with self._watcher_lock:
            if self._watcher is None:
                self._watcher = ThreadWatcher(
                    self._probe(), name=f"eventstore-watch {self.safe_url}", safety_poll=self.safety_poll
                )
            return self._watcher

    def _task_watcher(self) -> AsyncChangeWatcher:
        with self._watcher_lock:
            if self._async_watcher is None:
                self._async_watcher = TaskWatcher(self._async_probe(), safety_poll=self.safety_poll)
            return self._async_watcher
