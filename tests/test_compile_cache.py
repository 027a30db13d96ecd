"""The process-wide cache of compiled statements: a store opened with it runs the very SQL
one compiled afresh would, and stores of one dialect share the compiled objects."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import BACKENDS, PARTITIONED

from eventstore.storage import open_storage
from eventstore.storage.sql import statements
from eventstore.storage.sql.statements import Compiled
from eventstore.storage.sql.transactions import SqlTransactions


@pytest.fixture(params=[*BACKENDS, PARTITIONED])
def backend(request: pytest.FixtureRequest) -> str:
    """Also the session-partitioned PostgreSQL schema."""
    return str(request.param)


class _NoCache(dict):  # type: ignore[type-arg]
    """A cache that keeps nothing: every statement compiled again, as before the cache."""

    def setdefault(self, key: Any, value: Any = None) -> Any:
        return value


def _storages(storage: Any) -> list[SqlTransactions]:
    """A store's storage and, for a replicated one, its replicas'."""
    return [storage, *(r.storage for r in getattr(storage, "_replicas", ()))]


def _compiled(storage: Any) -> dict[tuple[int, str], Compiled]:
    """Every compiled statement of a storage and its replicas', the lazily compiled ones included."""
    out: dict[tuple[int, str], Compiled] = {}
    for i, s in enumerate(_storages(storage)):
        # Compiled once connected: the first connection tells the dialect the server's
        # version, part of what the cache keys on.
        with s.engine.connect():
            pass
        s._latest_query(2, 1)
        for name, v in vars(s).items():
            if isinstance(v, Compiled):
                out[i, name] = v
            elif name == "_q_latest":
                out.update({(i, f"{name}{k}"): q for k, q in v.items()})
    return out


def _text(qs: dict[tuple[int, str], Compiled]) -> dict[tuple[int, str], Any]:
    return {k: (q.sql, q.keys, q.defaults, getattr(q.row, "_fields", q.row)) for k, q in qs.items()}


def _check(url: str, monkeypatch: pytest.MonkeyPatch, **options: Any) -> None:
    first = open_storage(url, **options)
    second = open_storage(url, **options)
    try:
        shared, again = _compiled(first), _compiled(second)
        with monkeypatch.context() as m:
            m.setattr(statements, "_SHARED", _NoCache())
            fresh_store = open_storage(url, **options)
            try:
                fresh = _compiled(fresh_store)
            finally:
                fresh_store.close()
    finally:
        first.close()
        second.close()
    assert len(shared) > 20
    assert _text(again) == _text(fresh)
    # Shared, not compiled again: the same objects in every store.
    assert [k for k in shared if again[k] is not shared[k]] == []
    assert not any(fresh[k] is shared[k] for k in shared)


def test_cached_sql_is_the_sql_compiled_afresh(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _check(db_url, monkeypatch)


def test_cached_sql_of_a_replicated_store(pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _check(pg_schema, monkeypatch, replicas=[pg_schema], replica_wait=0)
    store = open_storage(pg_schema, replicas=[pg_schema], replica_wait=0)
    try:
        assert len(_storages(store)) == 2  # its replica's checked too
    finally:
        store.close()
