"""Group commit of AsyncEventStore appends, on both backends.

While one append's transaction is in flight, the appends other tasks make are queued and
written together in the next transaction. Each must still get exactly the result or error
it would get alone: a grouped append whose head moved, whose session was closed, whose
event ids were already recorded, or whose expected version is stale is done again by the
lone path. ``asyncio.gather`` makes a group deterministically: the first append goes at
once, alone, and every other one is queued before its round trip ends.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.util import await_

from conftest import make_store
from eventstore import (
    AppendResult,
    AsyncEventStore,
    ConcurrencyError,
    EventIdConflict,
    InvalidEvent,
    SessionClosed,
    StorageError,
)
from eventstore.engine.group_commit import AppendGroup
from eventstore.core.reducer import fold_json

N = 12


def _send(msg: str) -> dict[str, Any]:
    return {"type": "send", "id": msg, "text": "x"}


async def _opened(url: str, **options: Any) -> AsyncEventStore:
    store = AsyncEventStore(url, **options)
    await store.migrate()
    return store


async def _seed(store: AsyncEventStore, n: int = N) -> None:
    """One append to each session ``s0..``, one after the other (heads now known)."""
    for i in range(n):
        await store.append(f"s{i}", [_send(f"s{i}-1")])


async def _consistent(store: AsyncEventStore, session: str) -> list[str]:
    """The session's event ids, after checking versions and that its state is the fold."""
    events = [e async for e in store.history(session)]
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    assert (await store.load(session)).to_json() == fold_json(None, [e.action for e in events])
    return [e.event_id or "" for e in events]


def test_concurrent_appends_are_committed_together_with_their_own_results(
    backend: str, db_url: str, raw_engine: Engine
) -> None:
    async def scenario() -> None:
        # seal=False: with sealing on, an append with event ids past a session's first
        # turn takes the locked path, alone (its ids may be in a segment: docs/sealing.md).
        async with await _opened(db_url, snapshot_every=2, seal=False) as store:
            await _seed(store)
            for k in range(2, 6):  # snapshots are due at every other version
                results = await asyncio.gather(
                    *(store.append(f"s{i}", [_send(f"s{i}-{k}")], event_ids=[f"s{i}-{k}"]) for i in range(N))
                )
                assert [(r.session, r.version, r.first_version, r.count) for r in results] == [
                    (f"s{i}", k, k, 1) for i in range(N)
                ]
                assert all(r.event_ids == (f"{r.session}-{k}",) for r in results)
            for i in range(N):
                assert (await _consistent(store, f"s{i}"))[1:] == [f"s{i}-{k}" for k in range(2, 6)]
            assert (await store.verify()).ok

    asyncio.run(scenario())
    if backend != "sqlite":
        # PostgreSQL: the inserting transaction of each row. The first append of a round
        # went alone; the eleven others shared one transaction.
        with raw_engine.connect() as conn:
            xacts = conn.execute(
                text("SELECT version, count(DISTINCT xmin::text) FROM events WHERE version > 1 GROUP BY version")
            ).all()
        assert sorted(xacts) == [(k, 2) for k in range(2, 6)]


def test_a_grouped_append_whose_head_moved_is_appended_after_the_new_head(db_url: str) -> None:
    async def scenario() -> None:
        async with await _opened(db_url) as store:
            await _seed(store)
            with make_store(db_url) as other:  # another writer moves two heads
                other.append("s3", [_send("other-3")])
                other.append("s7", [_send("other-7")])
            results = await asyncio.gather(*(store.append(f"s{i}", [_send(f"s{i}-2")]) for i in range(N)))
            assert [r.version for r in results] == [3 if i in (3, 7) else 2 for i in range(N)]
            assert await _consistent(store, "s3") == ["", "", ""]
            assert [e.action["id"] async for e in store.history("s7")] == ["s7-1", "other-7", "s7-2"]
            assert (await store.verify()).ok

    asyncio.run(scenario())


def test_a_grouped_append_to_a_closed_session_raises_and_the_others_land(db_url: str) -> None:
    async def scenario() -> None:
        async with await _opened(db_url) as store:
            await _seed(store)
            with make_store(db_url) as other:
                # Still streaming after its send: closing ends that turn with the interruption.
                other.close_session("s5", reason="done")
                closed_head = other.head("s5")
            results = await asyncio.gather(
                *(store.append(f"s{i}", [_send(f"s{i}-2")]) for i in range(N)), return_exceptions=True
            )
            assert isinstance(results[5], SessionClosed)
            assert [r.version for i, r in enumerate(results) if i != 5] == [2] * (N - 1)  # type: ignore[union-attr]
            assert await store.head("s5") == closed_head

    asyncio.run(scenario())


def test_grouped_expected_versions_are_checked_against_the_real_head(db_url: str) -> None:
    async def scenario() -> None:
        async with await _opened(db_url) as store:
            await _seed(store)
            with make_store(db_url) as other:
                other.append("s2", [_send("other-2")])  # this store still thinks s2 is at 1
            results = await asyncio.gather(
                *(store.append(f"s{i}", [_send(f"s{i}-2")], expected_version=1) for i in range(N - 1)),
                store.append(f"s{N - 1}", [_send("late")], expected_version=5),
                return_exceptions=True,
            )
            assert isinstance(results[2], ConcurrencyError)
            assert (results[2].expected, results[2].actual) == (1, 2)
            assert isinstance(results[N - 1], ConcurrencyError)
            assert (results[N - 1].expected, results[N - 1].actual) == (5, 1)
            assert [r.version for i, r in enumerate(results) if i not in (2, N - 1)] == [2] * (N - 2)  # type: ignore[union-attr]
            assert await store.head("s2") == 2

    asyncio.run(scenario())


def test_a_retried_append_in_a_group_gets_its_first_result_and_a_reused_id_conflicts(db_url: str) -> None:
    """An event id already recorded fails the whole group's transaction: every append of
    it is done again alone, so the retry gets its original result, the reuse with other
    content its conflict, and the rest land once."""

    async def scenario() -> None:
        async with await _opened(db_url) as store:
            await _seed(store)
            first = await store.append("s4", [_send("s4-2")], event_ids=["e-4"])
            await store.append("s6", [_send("s6-2")], event_ids=["e-6"])
            results = await asyncio.gather(
                store.append("s0", [_send("s0-2")]),
                store.append("s4", [_send("s4-2")], event_ids=["e-4"]),  # a retry
                store.append("s6", [_send("changed")], event_ids=["e-6"]),  # a reuse
                *(store.append(f"s{i}", [_send(f"s{i}-2")]) for i in (1, 2, 3, 5, 7)),
                return_exceptions=True,
            )
            retried = results[1]
            assert isinstance(retried, AppendResult) and retried.replayed
            assert (retried.version, retried.event_ids, retried.recorded_at) == (2, ("e-4",), first.recorded_at)
            assert isinstance(results[2], EventIdConflict)
            assert [r.version for r in results[3:]] == [2] * 5  # type: ignore[union-attr]
            assert await store.head("s4") == 2 and await store.head("s6") == 2
            for i in range(8):
                await _consistent(store, f"s{i}")

    asyncio.run(scenario())


def test_a_grouped_append_leaves_a_live_turns_lease_alone(
    backend: str, db_url: str, raw_engine: Engine
) -> None:
    """A plain append does not check a streaming turn's lease, grouped or not: a tool
    runner's event lands in the group, the turn keeps its lease and builds on it."""

    async def scenario() -> None:
        async with await _opened(db_url) as store:
            await _seed(store)
            async with store.turn("s0", _send("t-1"), max_delay=60.0) as turn:
                await turn.write({"type": "message-start", "messageId": "a-1"})
                phase = {"type": "toolPhase", "name": "pay", "state": "awaiting-confirmation"}
                results = await asyncio.gather(
                    store.append("s1", [_send("s1-2")]),
                    store.append("s0", [phase]),
                    *(store.append(f"s{i}", [_send(f"s{i}-2")]) for i in range(2, N)),
                )
                assert results[1].version == 3  # the first send, the turn's send, the tool phase
                info = {s.id: s for s in await store.sessions()}
                assert info["s0"].writer_seen is not None  # the lease is the turn's still
                assert await turn.flush() == 4 and not turn.stopped
            assert [e.type async for e in store.history("s0")] == ["send", "send", "toolPhase", "part"]
            await _consistent(store, "s0")

    asyncio.run(scenario())
    if backend != "sqlite":
        with raw_engine.connect() as conn:
            xacts = conn.execute(
                text(
                    "SELECT s.id, e.xmin::text FROM events e JOIN sessions s ON s.pk = e.session_pk"
                    " WHERE (s.id = 's0' AND e.version = 3) OR (s.id = 's2' AND e.version = 2)"
                )
            ).all()
        assert len(xacts) == 2 and xacts[0][1] == xacts[1][1]  # one transaction


def test_appends_racing_on_one_session_are_each_written_once(db_url: str) -> None:
    """Several tasks on the same sessions: at most one append per session goes in a
    group; the others wait for the next one or take the lone path."""

    async def scenario() -> None:
        async with await _opened(db_url, snapshot_every=3) as store:
            await _seed(store, 4)
            await asyncio.gather(
                *(store.append(f"s{n % 4}", [_send(f"t{n}-{k}")], event_ids=[f"t{n}-{k}"]) for n in range(16) for k in range(3))
            )
            for i in range(4):
                ids = await _consistent(store, f"s{i}")
                assert sorted(ids[1:]) == sorted(f"t{n}-{k}" for n in range(i, 16, 4) for k in range(3))
            assert (await store.verify()).ok

    asyncio.run(scenario())


def test_close_waits_for_the_group_in_flight(db_url: str) -> None:
    """``close`` waits for the lone append in flight and the group queued behind it."""

    async def scenario() -> list[Any]:
        store = await _opened(db_url)
        await _seed(store, 4)
        tasks = [asyncio.ensure_future(store.append(f"s{i}", [_send(f"s{i}-2")])) for i in range(4)]
        await asyncio.sleep(0)  # the first goes alone, the others queue
        await store.close()
        return await asyncio.gather(*tasks)

    assert [r.version for r in asyncio.run(scenario())] == [2, 2, 2, 2]


class _FakeEngine:
    """The engine calls AppendGroup makes, with a chosen failure of the group's write."""

    def __init__(self, group_error: Exception | None) -> None:
        self.group_error = group_error
        self.lone: list[str] = []
        self.groups: list[list[str]] = []

    def append_request(self, req: Any) -> str:
        await_(asyncio.sleep(0.01))  # a round trip: the others queue meanwhile
        self.lone.append(req)
        return f"{req} alone"

    def plan_optimistic(self, req: Any, now: int) -> Any:
        return SimpleNamespace(request=req, row=SimpleNamespace(pk=int(req[1:])))

    def append_planned(self, planned: list[Any]) -> list[bool]:
        await_(asyncio.sleep(0.01))
        self.groups.append([p.request for p in planned])
        if self.group_error is not None:
            raise self.group_error
        return [p.request != "s3" for p in planned]  # s3's head check fails

    def appended(self, planned: Any) -> str:
        return f"{planned.request} grouped"


async def _five(engine: _FakeEngine) -> list[Any]:
    group = AppendGroup(engine)  # type: ignore[arg-type]
    out = await asyncio.gather(*(group.append(f"s{i}") for i in range(5)), return_exceptions=True)  # type: ignore[arg-type]
    await group.close()
    return out


def test_the_group_redoes_alone_what_failed_its_check_or_a_plain_error() -> None:
    engine = _FakeEngine(None)
    assert asyncio.run(_five(engine)) == ["s0 alone", "s1 grouped", "s2 grouped", "s3 alone", "s4 grouped"]
    assert engine.groups == [["s1", "s2", "s3", "s4"]] and engine.lone == ["s0", "s3"]
    engine = _FakeEngine(InvalidEvent("not worth retrying"))
    assert asyncio.run(_five(engine)) == [f"s{i} alone" for i in range(5)]


def test_a_retryable_failure_of_the_group_reaches_each_of_its_appends() -> None:
    """A lost connection may have committed the group: nothing is redone blindly."""
    lost = StorageError("connection lost", retryable=True)
    engine = _FakeEngine(lost)
    assert asyncio.run(_five(engine)) == ["s0 alone", lost, lost, lost, lost]
    assert engine.lone == ["s0"]


def test_a_transaction_held_up_by_a_lock_does_not_hold_up_the_appends_queued_behind_it() -> None:
    """The lone append of s0 waits (a row another transaction keeps locked): once it has
    been in flight for the stall time, the appends queued behind it are committed
    without waiting for it."""

    async def scenario() -> list[Any]:
        engine = _FakeEngine(None)
        released = asyncio.Event()
        lone = engine.append_request

        def held(req: Any) -> str:
            if req == "s0":
                await_(released.wait())
            return lone(req)

        engine.append_request = held  # type: ignore[method-assign]
        group = AppendGroup(engine, stall_after=0.01)  # type: ignore[arg-type]
        first = asyncio.ensure_future(group.append("s0"))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        others = await asyncio.wait_for(asyncio.gather(*(group.append(f"s{i}") for i in (1, 2, 4))), 30)  # type: ignore[arg-type]
        assert not first.done()
        released.set()
        return [await first, *others]

    assert asyncio.run(scenario()) == ["s0 alone", "s1 grouped", "s2 grouped", "s4 grouped"]
