"""A streaming-turn writer run as a separate process by tests/test_turns_streaming.py.

``python turn_worker.py URL SESSION MODE``: it reports on stdout, one JSON object per
line, and waits for the test's commands on stdin (one word per line), so the two
processes move in lock-step without sleeps.
"""

from __future__ import annotations

import json
import sys

from eventstore import EventStore, TurnBusy, TurnStopped

SEND = {"type": "send", "id": "u-1", "text": "Add two mugs to the cart"}


def say(**obj: object) -> None:
    print(json.dumps(obj), flush=True)


def wait_for(word: str) -> None:
    line = sys.stdin.readline().strip()
    if line != word:
        raise SystemExit(f"expected {word!r} on stdin, got {line!r}")


def persist(store: EventStore, session: str) -> None:
    with store.turn(session, SEND, actor="model:test") as turn:
        say(entered=turn.version)
        wait_for("go")
        turn.write({"type": "message-start", "messageId": "a-1"})
        turn.write({"type": "text-delta", "messageId": "a-1", "text": "Done."})
        turn.write({"type": "finish", "reason": "stop"})
    say(done=store.head(session))


def stop(store: EventStore, session: str) -> None:
    # max_delay is long: the deltas written after the stop stay buffered until flush().
    with store.turn(session, SEND, max_delay=30.0) as turn:
        turn.write({"type": "message-start", "messageId": "a-1"})
        turn.write(
            {"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "search", "input": {}}
        )
        say(ready=turn.version)
        wait_for("go")
        for i in range(5):
            turn.write({"type": "text-delta", "messageId": "a-1", "text": f"late {i}"})
        try:
            turn.flush()
            flushed = "ok"
        except TurnStopped as exc:
            flushed = type(exc).__name__
        try:
            turn.write({"type": "text-delta", "messageId": "a-1", "text": "after"})
            later = "ok"
        except TurnStopped as exc:
            later = type(exc).__name__
        say(stopped=turn.stopped, dropped=turn.dropped, flush=flushed, later=later)


def crash(store: EventStore, session: str) -> None:
    with store.turn(session, SEND, max_delay=0.01) as turn:
        turn.write({"type": "message-start", "messageId": "a-1"})
        turn.write(
            {"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "search", "input": {}}
        )
        turn.write({"type": "tool-result", "id": "c-1", "output": {"hits": 2}})
        turn.write(
            {
                "type": "tool-call",
                "messageId": "a-1",
                "id": "c-2",
                "name": "add_to_cart",
                "input": {},
            }
        )
        i = 0
        while True:  # until killed
            turn.write({"type": "text-delta", "messageId": "a-1", "text": f"d{i} "})
            if i % 3 == 2:
                turn.flush()
                say(acked=i)  # d0..di are durable
            i += 1


def hold(store: EventStore, session: str) -> None:
    wait_for("go")
    try:
        turn = store.turn(session, SEND, max_delay=0.01)
        turn.__enter__()
    except TurnBusy:
        say(owner=False)
        return
    say(owner=True, version=turn.version)
    wait_for("write")
    try:
        turn.write({"type": "text-delta", "messageId": "a-1", "text": "zombie"})
        turn.flush()
        outcome = "written"
    except TurnStopped as exc:
        outcome = type(exc).__name__
    say(outcome=outcome, stopped=turn.stopped)
    turn.__exit__(None, None, None)


if __name__ == "__main__":
    url, session, mode = sys.argv[1:4]
    with EventStore(url) as s:
        {"persist": persist, "stop": stop, "crash": crash, "hold": hold}[mode](s, session)
