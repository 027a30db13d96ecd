"""When the background sealer works (``SealPolicy``), on both backends and both twins.

The worker yields to the store's appends but bounds the closed turns waiting: by age (a
turn waiting ``max_age`` is sealed while a writer never pauses) and by count (at
``max_backlog`` the appends that close turns seal too). Each test runs the sync store
(a thread) and the async one (a task of the test's loop) through one async body: the
sync store's calls simply do not await.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from conftest import await_until, make_store
from eventstore import AsyncEventStore, SealPolicy
from eventstore.engine.async_bridge import run as bridged
from eventstore.engine.engine import Engine
from eventstore.errors import InvalidEvent
from eventstore.samples import chat_session

Append = Callable[[str, list[dict[str, Any]]], Awaitable[Any]]
#: A pause no test ever makes: the worker cannot be waiting for one.
NEVER = 3600.0


def _turns(n: int, seed: int) -> list[list[dict[str, Any]]]:
    actions = chat_session(n, seed=seed)
    starts = [j for j, a in enumerate(actions) if a["type"] == "send"] + [len(actions)]
    return [actions[a:b] for a, b in zip(starts, starts[1:])]


def _count(url: str, sql: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(sql)).scalar_one())
    finally:
        engine.dispose()


def _waiting(url: str) -> int:
    """Closed turns still stored as rows (the backlog, as the database sees it)."""
    return _count(
        url,
        "SELECT count(*) FROM (SELECT DISTINCT e.session_pk, e.turn FROM events e "
        "JOIN sessions s ON s.pk = e.session_pk WHERE e.turn < s.head_turn) t",
    )


def _segments(url: str) -> int:
    return _count(url, "SELECT count(*) FROM event_segments")


def _sealed_of(url: str, session: str) -> int:
    return _count(
        url,
        "SELECT count(*) FROM event_segments g JOIN sessions s ON s.pk = g.session_pk "
        f"WHERE s.id = '{session}'",
    )


@contextlib.asynccontextmanager
async def _store(twin: str, url: str, policy: SealPolicy) -> AsyncIterator[Append]:
    if twin == "sync":
        store = make_store(url, seal=policy)

        async def append(session: str, actions: list[dict[str, Any]]) -> Any:
            return store.append(session, actions)

        try:
            yield append
        finally:
            store.close()
    else:
        async with AsyncEventStore(url, seal=policy) as astore:
            await astore.migrate()
            yield astore.append


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_an_idle_store_seals_every_closed_turn(db_url: str, twin: str) -> None:
    async def run() -> None:
        async with _store(twin, db_url, SealPolicy(quiet=0.05, max_age=NEVER, max_backlog=10**6)) as append:
            for i in range(3):
                for turn in _turns(4, seed=40 + i):
                    await append(f"s{i}", turn)
            await await_until(lambda: _waiting(db_url) == 0, "every closed turn sealed once the writer paused")
            assert _segments(db_url) == 9

    asyncio.run(run())


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_writer_that_never_pauses_holds_the_worker_off_until_a_turn_is_max_age_old(db_url: str, twin: str) -> None:
    async def run() -> None:
        policy = SealPolicy(quiet=NEVER, max_age=0.3, max_backlog=10**6)
        async with _store(twin, db_url, policy) as append:
            for turn in _turns(3, seed=50):
                await append("old", turn)
            # Never a pause: only the age of the closed turns of "old" sets the worker going.
            for turn in _turns(400, seed=51):
                if _sealed_of(db_url, "old") == 2:
                    break
                await append("busy", turn)
            else:
                pytest.fail("the closed turns of 'old' were not sealed while the writer went on")

    asyncio.run(run())


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_the_backlog_stays_bounded_under_a_continuous_writer(db_url: str, twin: str) -> None:
    cap = 6

    async def run() -> list[int]:
        seen: list[int] = []
        # The worker never sees a pause nor an old turn: only the backlog's bound seals.
        async with _store(twin, db_url, SealPolicy(quiet=NEVER, max_age=NEVER, max_backlog=cap)) as append:
            sessions = [_turns(10, seed=60 + i) for i in range(4)]
            for k in range(10):
                for i, turns in enumerate(sessions):
                    await append(f"s{i}", turns[k])
                    seen.append(_waiting(db_url))
        return seen

    seen = asyncio.run(run())
    assert max(seen) <= cap, seen  # one writer: at most the cap waits after its append


def test_a_seal_policy_is_checked() -> None:
    for bad in ({"quiet": -1}, {"max_age": float("inf")}, {"max_backlog": 1}, {"quiet": "1"}):
        with pytest.raises(InvalidEvent):
            SealPolicy(**bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidEvent):
        make_store("sqlite://", seal="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_an_append_that_begins_stops_the_workers_transaction_at_the_next_turn(
    db_url: str, twin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round the worker began in a pause gives the session's row back one turn after an
    append of its store begins (the append would wait on that row, and it must not wait
    for the whole batch): the turns sealed so far are committed, the rest stay rows and
    the session is handed back for the next pause. Without an append, one round seals them
    all."""
    writer = make_store(db_url, seal=False)
    try:
        for session in ("quiet", "busy"):
            for turn in _turns(6, seed=70):  # five closed turns
                writer.append(session, turn)
    finally:
        writer.close()
    pk = {s: _count(db_url, f"SELECT pk FROM sessions WHERE id = '{s}'") for s in ("quiet", "busy")}
    # Neither a pause nor an age decides: the rounds are run here, by a store that has
    # appended nothing yet (as long a pause as can be) until the one that begins below.
    engine = Engine(db_url, seal=SealPolicy(quiet=NEVER, max_age=NEVER, max_backlog=10**6),
                    use_asyncio=twin == "async")
    written: list[int] = []
    original = engine.storage._write_segments

    def write_segments(tx: Any, session_pk: int, done: Any) -> None:
        original(tx, session_pk, done)
        written.append(len(done))
        if session_pk == pk["busy"] and len(written) == 1:
            engine.planner.take_head("elsewhere")  # what an append does as it begins

    monkeypatch.setattr(engine.storage, "_write_segments", write_segments)

    def rounds() -> None:
        try:
            assert engine.sealer.seal_sessions([pk["quiet"]]) == ({}, set())
            assert written == [1] * 5 and _sealed_of(db_url, "quiet") == 5
            written.clear()
            assert engine.sealer.seal_sessions([pk["busy"]]) == ({}, {pk["busy"]})
            assert written == [1] and _sealed_of(db_url, "busy") == 1
        finally:
            engine.close()

    if twin == "async":
        asyncio.run(bridged(rounds))
    else:
        rounds()
