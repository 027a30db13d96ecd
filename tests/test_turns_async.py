"""Streaming turns on the async twin, driven by real asyncio tasks (not the test adapter):
many turns of one store share its flusher task; a stop written by the sync store reaches
an async turn. Both backends."""

from __future__ import annotations

import asyncio

import pytest

from eventstore import AsyncEventStore, EventStore, TurnStopped, fold


async def _stream(store: AsyncEventStore, session: str, deltas: int) -> int:
    send = {"type": "send", "id": "u-1", "text": "hello"}
    async with store.turn(session, send, actor="model:async", max_delay=0.01) as turn:
        await turn.write({"type": "message-start", "messageId": "a-1"})
        for i in range(deltas):
            await turn.write({"type": "text-delta", "messageId": "a-1", "text": f"{i} "})
            if i % 7 == 0:
                await asyncio.sleep(0)  # let the other tasks write too
        await turn.write(
            {"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "f", "input": {}}
        )
        await turn.write({"type": "tool-result", "id": "c-1", "output": i})
        await turn.write({"type": "finish", "reason": "stop"})
        return turn.version


def test_sixteen_tasks_stream_turns_on_one_async_store(db_url: str) -> None:
    async def scenario() -> list[int]:
        async with AsyncEventStore(db_url) as store:
            await store.migrate()
            return await asyncio.gather(*(_stream(store, f"s{i}", 30) for i in range(16)))

    heads = asyncio.run(scenario())
    assert heads == [35] * 16
    with EventStore(db_url) as sync:
        for i in range(16):
            actions = [e.action for e in sync.history(f"s{i}")]
            assert len(actions) == 35 and sync.load(f"s{i}") == fold(actions)
            assert sync.load(f"s{i}").status == "idle"
        assert sync.verify().ok


def test_a_stop_from_the_sync_store_reaches_an_async_turn(db_url: str) -> None:
    async def scenario(sync: EventStore) -> tuple[bool, int, int]:
        async with AsyncEventStore(db_url) as store:
            send = {"type": "send", "id": "u-1", "text": "hello"}
            async with store.turn("s1", send, max_delay=30.0) as turn:
                await turn.write({"type": "message-start", "messageId": "a-1"})
                await turn.flush()
                stop = sync.append("s1", [{"type": "stop"}]).version
                await turn.write({"type": "text-delta", "messageId": "a-1", "text": "late"})
                with pytest.raises(TurnStopped):
                    await turn.flush()
                with pytest.raises(TurnStopped):
                    await turn.write({"type": "text-delta", "messageId": "a-1", "text": "x"})
                return turn.stopped, turn.dropped, stop

    with EventStore(db_url) as sync:
        sync.migrate()
        stopped, dropped, stop = asyncio.run(scenario(sync))
        assert stopped and dropped == 1
        assert sync.head("s1") == stop and sync.sessions()[0].writer_seen is None
