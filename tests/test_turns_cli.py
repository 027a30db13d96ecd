"""`eventstore recover` and the closed / interrupted state in `eventstore sessions`, on both
backends (the command line goes through the same store as the library)."""

from __future__ import annotations

import json
import time
from typing import Any

from typer.testing import CliRunner

from conftest import make_store
from eventstore_cli.app import app


def invoke(db_url: str, *args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(app, ["--db", db_url, *args])
    assert "Traceback" not in result.stderr, result.stderr
    assert result.exit_code == code, (args, result.stdout, result.stderr)
    if code == 1:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return result


def test_recover_and_sessions_show_interrupted_and_closed(db_url: str) -> None:
    with make_store(db_url) as store:
        # A writer that appended a send and a tool call, then died (no turn lease).
        store.append(
            "s1",
            [
                {"type": "send", "id": "u-1", "text": "hi"},
                {"type": "part", "part": {"type": "message-start", "messageId": "a-1"}},
                {
                    "type": "part",
                    "part": {
                        "type": "tool-call",
                        "messageId": "a-1",
                        "id": "c-1",
                        "name": "f",
                        "input": {},
                    },
                },
            ],
        )
        store.append(
            "s2",
            [
                {"type": "send", "id": "u-1", "text": "bye"},
                {"type": "part", "part": {"type": "finish"}},
            ],
        )
        store.close_session("s2", reason="user left")
    out = invoke(db_url, "recover", "s1", "--stale-after", "3600").stdout
    assert "nothing to recover in s1: its writer is alive" in out and "becomes recoverable at" in out
    # The last write ages past the stale_after below (a lease only ever gets older).
    deadline = time.monotonic() + 30
    out = invoke(db_url, "recover", "s1", "--stale-after", "0.01").stdout
    while "nothing to recover" in out and time.monotonic() < deadline:
        out = invoke(db_url, "recover", "s1", "--stale-after", "0.01").stdout
    assert "recovered s1: interrupted at version 4; 1 message(s)" in out
    assert (
        json.loads(invoke(db_url, "recover", "s1", "--stale-after", "0.01", "--json").stdout)
        is None
    )
    out = invoke(db_url, "recover", "s1", "--stale-after", "0.01").stdout
    assert "nothing to recover in s1: it is not streaming (its status is error)" in out
    table = invoke(db_url, "sessions").stdout
    assert "interrupted" in table and "closed: user left" in table
    rows = {r["id"]: r for r in json.loads(invoke(db_url, "sessions", "--json").stdout)}
    assert rows["s1"]["interrupted"] and not rows["s1"]["closed"]
    assert rows["s2"]["closed"] and rows["s2"]["closed_reason"] == "user left"
    err = invoke(db_url, "recover", "s2", code=1).stderr
    assert "closed" in err
    invoke(db_url, "recover", "nope", code=1)
    assert invoke(db_url, "recover", "s1", "--stale-after", "-1", code=1).stderr.startswith(
        "error: "
    )
    with make_store(db_url) as store:
        state = store.load("s1")
        assert state.status == "error"
        assert state.messages[-1]["parts"][0]["state"] == "cancelled"
