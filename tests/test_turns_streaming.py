"""Streaming turns across processes: persist before stream, stop from anywhere, kill -9 and
recovery, one owner per turn, closed sessions, idempotent flushes. Both backends, and both
twins (``store.turn`` and ``async with astore.turn``).

The writer runs in a separate process (tests/turn_worker.py); the two processes move in
lock-step through its stdout and stdin, never by sleeping and hoping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from eventstore import (
    EventStore,
    InvalidEvent,
    Recovery,
    SessionClosed,
    SessionNotFound,
    StorageError,
    TurnBusy,
    TurnStopped,
    fold,
)
from eventstore.engine.engine import Engine
from eventstore.core.turn_rules import INTERRUPTED
from eventstore.engine.turns import StreamingTurn, TurnWriter

# Every test that takes `store` runs on the sync store and on the async twin (the writer
# processes are sync: the two forms work on one database at the same time).
pytestmark = pytest.mark.twins

WORKER = Path(__file__).with_name("turn_worker.py")
SEND = {"type": "send", "id": "u-1", "text": "Add two mugs to the cart"}


class Worker:
    """A turn_worker.py process, driven line by line."""

    def __init__(self, url: str, session: str, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), url, session, mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            assert self.proc.stderr is not None
            raise AssertionError(f"worker exited: {self.proc.wait(10)}: {self.proc.stderr.read()}")
        obj: dict[str, Any] = json.loads(line)
        return obj

    def send(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def finish(self) -> int:
        code = self.proc.wait(timeout=60)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        return code


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        if w.proc.poll() is None:
            w.proc.kill()
        w.finish()


def open_calls(messages: list[Mapping[str, Any]]) -> list[str]:
    """Ids of tool parts still running or awaiting confirmation, nested runs included."""
    out = []
    for m in messages:
        for p in m.get("parts", []):
            if p.get("type") == "tool":
                if p.get("state") in ("running", "awaiting-confirmation"):
                    out.append(p["id"])
                agent = p.get("agent")
                if agent:
                    out += open_calls(agent.get("messages", []))
    return out


def assert_states_are_the_fold(store: EventStore, session: str) -> None:
    actions = [e.action for e in store.history(session)]
    for v in range(len(actions) + 1):
        assert store.load(session, version=v) == fold(actions[:v]), v
    assert store.verify(session).ok


def wait_recovered(store: EventStore, session: str, stale_after: float) -> Recovery:
    """Recover once the dead writer's lease is older than ``stale_after`` (it can only age)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rec = store.recover(session, stale_after=stale_after)
        if rec is not None:
            return rec
        time.sleep(stale_after / 4)
    raise AssertionError("recover never acted on a dead writer")


def test_the_send_is_durable_before_the_first_part(
    store: EventStore, db_url: str, workers: list[Worker]
) -> None:
    w = Worker(db_url, "s1", "persist")
    workers.append(w)
    entered = w.read()["entered"]
    # The writer is blocked before its first part: another process already sees the send.
    assert entered == 1 and store.head("s1") == 1
    state = store.load("s1")
    assert state.status == "streaming" and state.messages[-1]["id"] == "u-1"
    assert store.sessions()[0].writer_seen is not None
    w.send("go")
    assert w.read()["done"] == 4
    assert w.finish() == 0
    assert store.load("s1").status == "idle"
    assert store.sessions()[0].writer_seen is None  # the lease was given up
    assert_states_are_the_fold(store, "s1")


def test_a_stop_from_another_process_ends_the_turn(
    store: EventStore, db_url: str, workers: list[Worker]
) -> None:
    w = Worker(db_url, "s1", "stop")
    workers.append(w)
    ready = w.read()["ready"]
    stop = store.append("s1", [{"type": "stop"}], expected_version=ready, actor="user:ada").version
    w.send("go")
    out = w.read()
    assert out == {"stopped": True, "dropped": 5, "flush": "TurnStopped", "later": "TurnStopped"}
    assert w.finish() == 0
    # Nothing of the turn after the stop; the call it left open was cancelled by the stop.
    assert store.head("s1") == stop
    assert [e.type for e in store.history("s1")][-1] == "stop"
    assert open_calls(store.load("s1").messages) == []
    assert_states_are_the_fold(store, "s1")


def test_kill_9_mid_turn_then_recover_then_continue(
    store: EventStore, db_url: str, workers: list[Worker]
) -> None:
    w = Worker(db_url, "s1", "crash")
    workers.append(w)
    acked = -1
    while acked < 20:
        acked = w.read()["acked"]
    os.kill(w.proc.pid, signal.SIGKILL)
    w.proc.wait()
    assert store.load("s1").status == "streaming"
    assert "c-2" in open_calls(store.load("s1").messages)
    # The dead writer flushed moments ago: with a long stale_after nothing happens.
    assert store.recover("s1", stale_after=30.0) is None
    head = store.head("s1")
    rec = wait_recovered(store, "s1", 0.3)
    assert rec.version == head + 1
    assert (
        rec.messages == fold([e.action for e in store.history("s1")]).messages[:2] or rec.messages
    )
    info = store.sessions()[0]
    assert info.interrupted and info.writer_seen is None
    assert store.recover("s1", stale_after=0.3) is None  # nothing left to recover
    # Every acknowledged delta is stored exactly once; no call is open anywhere.
    texts = [e.action["part"].get("text") for e in store.history("s1") if e.type == "part"]
    for i in range(acked + 1):
        assert texts.count(f"d{i} ") == 1
    last = store.history("s1", desc=True, limit=1)
    assert next(iter(last)).action == {
        "type": "part",
        "part": {"type": "error", "error": INTERRUPTED},
    }
    assert open_calls(store.load("s1").messages) == []
    # The continuation: a retry turn resumes from the finished call.
    assert [m["id"] for m in rec.messages] == ["u-1", "a-1"]
    assert [p.get("id") for p in rec.messages[1]["parts"] if p["type"] == "tool"] == ["c-1"]
    with store.turn("s1", {"type": "retry"}, actor="model:test") as turn:
        turn.write({"type": "message-start", "messageId": "a-2"})
        turn.write({"type": "text-delta", "messageId": "a-2", "text": "Both mugs are in the cart."})
        turn.write({"type": "finish", "reason": "stop"})
    state = store.load("s1")
    assert state.status == "idle" and open_calls(state.messages) == []
    assert not store.sessions()[0].interrupted
    ids = [e.event_id for e in store.history("s1") if e.event_id is not None]
    assert len(ids) == len(set(ids))
    assert_states_are_the_fold(store, "s1")


def test_two_processes_never_both_own_a_turn(
    store: EventStore, db_url: str, workers: list[Worker]
) -> None:
    group = [Worker(db_url, "s1", "hold") for _ in range(3)]
    workers.extend(group)
    for w in group:
        w.send("go")
    outs = [w.read() for w in group]
    owners = [w for w, o in zip(group, outs) if o["owner"]]
    assert len(owners) == 1
    owner = owners[0]
    with pytest.raises(TurnBusy):
        store.turn("s1", {"type": "send", "id": "u-2", "text": "me too"}).__enter__()
    # A live owner (even an idle one) is never interrupted...
    assert store.recover("s1", stale_after=30.0) is None
    # ...but a frozen one is, and then it can never write again.
    os.kill(owner.proc.pid, signal.SIGSTOP)
    try:
        rec = wait_recovered(store, "s1", 0.5)
    finally:
        os.kill(owner.proc.pid, signal.SIGCONT)
    owner.send("write")
    assert owner.read() == {"outcome": "TurnStopped", "stopped": True}
    assert owner.finish() == 0
    assert store.head("s1") == rec.version
    assert "zombie" not in json.dumps([e.action for e in store.history("s1")])
    # The session is free again.
    with store.turn("s1", {"type": "send", "id": "u-2", "text": "again"}) as turn:
        turn.write({"type": "finish"})
    assert_states_are_the_fold(store, "s1")


def test_a_turn_in_process(store: EventStore) -> None:
    with store.turn("s1", SEND, actor="model:a", max_delay=60.0) as turn:
        assert turn.version == 1 and not turn.stopped
        turn.write({"type": "message-start", "messageId": "a-1"})
        turn.write({"type": "text-delta", "messageId": "a-1", "text": "Hel"})
        assert store.head("s1") == 1  # a delta waits (max_delay: far beyond this test's run)...
        turn.write({"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "f", "input": {}})
        assert store.head("s1") == 4  # ...until a step ends: durable when write returns
        turn.write(
            {"type": "toolPhase", "name": "f", "state": "awaiting-confirmation", "prompt": "ok?"}
        )
        assert store.head("s1") == 5
        turn.write({"type": "tool-result", "id": "c-1", "output": 1})
        turn.write({"type": "text-delta", "messageId": "a-1", "text": "lo"})
        assert turn.flush() == 7 == store.head("s1")
        turn.write({"type": "finish", "reason": "stop"})
    events = list(store.history("s1"))
    assert {e.actor for e in events} == {"model:a"}
    # The send and the last event of each flush carry the turn's ids (a retry's marks).
    ids = [e.event_id for e in events if e.event_id is not None]
    assert len(ids) == len(set(ids)) >= 5 and ids[0].endswith(".0") and events[0].event_id == ids[0]
    assert store.load("s1").status == "idle"
    assert_states_are_the_fold(store, "s1")


def test_own_stop_and_exceptions(store: EventStore) -> None:
    with store.turn("s1", SEND) as turn:
        turn.write({"type": "message-start", "messageId": "a-1"})
        turn.write({"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "f", "input": {}})
        v = turn.stop()
        assert turn.stopped and v == store.head("s1") == 4
        with pytest.raises(TurnStopped):
            turn.write({"type": "text-delta", "messageId": "a-1", "text": "x"})
    assert open_calls(store.load("s1").messages) == []
    with pytest.raises(ZeroDivisionError):
        with store.turn("s1", {"type": "send", "id": "u-2", "text": "b"}) as turn:
            turn.write({"type": "message-start", "messageId": "a-2"})
            turn.write(
                {"type": "tool-call", "messageId": "a-2", "id": "c-2", "name": "f", "input": {}}
            )
            turn.write({"type": "text-delta", "messageId": "a-2", "text": "x"})
            1 / 0
    last = list(store.history("s1"))[-1]
    assert last.action == {"type": "part", "part": {"type": "error", "error": INTERRUPTED}}
    assert last.type == "part" and store.load("s1").status == "error"
    assert open_calls(store.load("s1").messages) == []
    assert store.sessions()[0].interrupted
    assert_states_are_the_fold(store, "s1")


def test_many_turns_share_one_flush_and_stay_at_their_versions(store: EventStore) -> None:
    turns = [store.turn(f"s{i}", SEND, max_delay=60.0) for i in range(8)]
    for t in turns:
        t.__enter__()
    for k in range(20):
        for t in turns:
            t.write({"type": "text-delta", "messageId": "a-1", "text": str(k)})
    for t in turns:
        assert t.flush() == 21
        t.__exit__(None, None, None)
    for i in range(8):
        assert store.head(f"s{i}") == 21
        assert_states_are_the_fold(store, f"s{i}")


def test_foreign_events_that_do_not_end_the_run_are_built_on(store: EventStore) -> None:
    with store.turn("s1", SEND, max_delay=60.0) as turn:
        turn.write({"type": "message-start", "messageId": "a-1"})
        turn.write(
            {"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "pay", "input": {}}
        )
        # A tool runner elsewhere asks for confirmation.
        store.append("s1", [{"type": "toolPhase", "name": "pay", "state": "awaiting-confirmation"}])
        turn.write({"type": "text-delta", "messageId": "a-1", "text": "waiting"})
        assert turn.flush() == 5 and not turn.stopped
    assert [e.type for e in store.history("s1")] == ["send", "part", "part", "toolPhase", "part"]
    assert_states_are_the_fold(store, "s1")


def _lose_acks(engine: Engine, failures: dict[str, int], when: Callable[[Any], bool]) -> None:
    """Make the group commit lose its acknowledgement ``failures["left"]`` times: the
    batches commit, then a retryable error says the connection was lost at commit."""
    real = engine.storage.append

    def lose_the_ack(batches: Any) -> list[bool]:
        out = real(batches)  # committed...
        if failures["left"] and when(batches):
            failures["left"] -= 1
            raise StorageError("connection lost at commit", retryable=True)  # ...but unacknowledged
        return out

    engine.storage.append = lose_the_ack  # type: ignore[method-assign]


def test_a_retried_flush_lands_exactly_once(db_url: str) -> None:
    engine = Engine(db_url)
    engine.migrate()
    failures = {"left": 2}
    _lose_acks(engine, failures, lambda batches: any(b.rows for b in batches))
    writer = TurnWriter(engine)
    try:
        with StreamingTurn(writer, "s1", SEND, actor=None, max_delay=0.01) as turn:
            turn.write({"type": "message-start", "messageId": "a-1"})
            turn.write(
                {"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "f", "input": {}}
            )
            for i in range(10):
                turn.write({"type": "text-delta", "messageId": "a-1", "text": f"{i}"})
            assert turn.flush() == 13
    finally:
        writer.close()
        engine.close()
    assert failures["left"] == 0
    with EventStore(db_url) as store:
        events = list(store.history("s1"))
        assert [e.version for e in events] == list(range(1, 14))
        ids = [e.event_id for e in events if e.event_id is not None]
        assert len(ids) == len(set(ids))
        assert_states_are_the_fold(store, "s1")


def test_a_retried_opening_lands_exactly_once(db_url: str) -> None:
    engine = Engine(db_url)
    engine.migrate()
    failures = {"left": 0}
    _lose_acks(engine, failures, lambda batches: any(b.claim for b in batches))
    writer = TurnWriter(engine)
    try:
        for n in (1, 2):
            # The second turn's opening goes through the group commit (this process knows
            # the head): its first attempt commits, the retry finds the send by its id.
            failures["left"] = n - 1
            send = {"type": "send", "id": f"u-{n}", "text": "again"}
            with StreamingTurn(writer, "s1", send, actor=None, max_delay=0.01) as turn:
                assert turn.version == turn.opened_at == 3 * n - 2
                turn.write({"type": "message-start", "messageId": f"a-{n}"})
                turn.write({"type": "finish", "reason": "stop"})
    finally:
        writer.close()
        engine.close()
    assert failures["left"] == 0
    with EventStore(db_url) as store:
        assert [e.type for e in store.history("s1")] == ["send", "part", "part"] * 2
        assert store.sessions()[0].writer_seen is None
        assert_states_are_the_fold(store, "s1")


def test_the_end_of_the_run_gives_the_lease_up(store: EventStore) -> None:
    with store.turn("s1", SEND, max_delay=60.0) as turn:
        turn.write({"type": "message-start", "messageId": "a-1"})
        turn.write({"type": "finish", "reason": "stop"})
        # Durable, and the lease went with it: leaving the turn writes nothing more.
        assert store.head("s1") == 3 and store.sessions()[0].writer_seen is None
        # A later write takes the lease back (nothing was written since)...
        turn.write({"type": "message-start", "messageId": "a-2"})
        assert turn.flush() == 4 and store.sessions()[0].writer_seen is not None
        turn.write({"type": "finish", "reason": "stop"})
        assert store.sessions()[0].writer_seen is None
    with store.turn("s1", {"type": "send", "id": "u-2", "text": "b"}) as turn:
        turn.write({"type": "finish", "reason": "stop"})
        # ...but not once another turn has taken the session.
        with store.turn("s1", {"type": "send", "id": "u-3", "text": "c"}) as other:
            turn.write({"type": "message-start", "messageId": "a-3"})
            with pytest.raises(TurnStopped):
                turn.flush()
            assert turn.stopped and turn.dropped == 1
            other.write({"type": "finish", "reason": "stop"})
    assert [e.type for e in store.history("s1")][5:] == ["send", "part", "send", "part"]
    assert store.sessions()[0].writer_seen is None
    assert_states_are_the_fold(store, "s1")


def test_closed_sessions_refuse_writes_and_still_read(store: EventStore) -> None:
    store.append("s1", [SEND, {"type": "part", "part": {"type": "finish"}}])
    with store.turn("s2", SEND, max_delay=60.0) as live:
        live.write({"type": "text-delta", "messageId": "a-1", "text": "x"})
        store.close_session("s2", reason="user left")
        with pytest.raises(SessionClosed):
            live.flush()
        with pytest.raises(SessionClosed):
            live.write({"type": "finish"})
        assert live.stopped and live.dropped == 1
    store.close_session("s1", reason="archived")
    store.close_session("s1", reason="again")  # idempotent: the first reason stays
    for call in (
        lambda: store.append("s1", [{"type": "stop"}]),
        lambda: store.append("s1", [{"type": "stop"}], expected_version=2),
        lambda: store.turn("s1", {"type": "send", "id": "u-2", "text": "b"}).__enter__(),
        lambda: store.recover("s1"),
        lambda: store.branch("s2", new_id="s1"),
    ):
        with pytest.raises(SessionClosed) as info:
            call()
    assert info.value.session == "s1" and info.value.reason == "archived"
    assert store.head("s1") == 2 and store.load("s1").status == "idle"
    alt = store.branch("s1", new_id="s1-alt")
    assert store.append(alt, [{"type": "stop"}]).version == 3
    assert store.diff(("s1", None), (alt, None)).to_json()["status"]["right"] == "idle"
    by_id = {s.id: s for s in store.sessions()}
    assert by_id["s1"].closed and by_id["s1"].closed_reason == "archived"
    assert by_id["s1"].to_json()["closed"] is True and not by_id[alt].closed
    with pytest.raises(SessionNotFound):
        store.close_session("nope")


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.turn("s1", {"type": "stop"}).__enter__(),
        lambda s: s.turn("s1", None).__enter__(),
        lambda s: s.turn("", SEND).__enter__(),
        lambda s: s.turn("s1", SEND, max_delay=-1).__enter__(),
        lambda s: s.turn("s1", SEND, max_delay=float("nan")).__enter__(),
        lambda s: s.turn("s1", SEND, actor=3).__enter__(),
        lambda s: s.recover("s1", stale_after=0),
        lambda s: s.recover("s1", stale_after="1"),
        lambda s: s.close_session("s1", reason=["x"]),
    ],
)
def test_bad_arguments_are_refused_and_write_nothing(store: EventStore, call: Any) -> None:
    store.append("s1", [{"type": "stop"}])
    with pytest.raises(InvalidEvent):
        call(store)
    assert store.head("s1") == 1 and store.sessions()[0].closed_at is None


def test_bad_parts_are_refused_before_buffering(store: EventStore) -> None:
    with store.turn("s1", SEND) as turn:
        for bad in (
            {"type": "text-delta"},
            {"type": "send", "id": "u-2", "text": "x"},
            "text",
            {"type": "nope"},
        ):
            with pytest.raises(InvalidEvent):
                turn.write(bad)
        turn.write(
            {"type": "part", "part": {"type": "finish"}}
        )  # a whole action is written as given
    assert [e.type for e in store.history("s1")] == ["send", "part"]
