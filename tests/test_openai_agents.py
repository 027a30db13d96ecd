"""The OpenAI Agents SDK session on the store: the SDK's own session tests as the judge,
a ``Runner`` run compared with ``SQLiteSession``, and what the store shows of a run.

The SDK's tests come from its source distribution (``scripts/fetch-agents-tests``, into a
cache outside the repository) and run in a pytest of their own, with their own conftest,
and ``SQLiteSession`` replaced by ``EventStoreSession`` (``tests/agents_sdk_shim.py``),
once per backend.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

import agents
from agents import Agent, Runner, SQLiteSession, function_tool
from agents.testing import ScriptedModel
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary

from eventstore import AsyncEventStore, EventStore, InvalidEvent
from eventstore.integrations.openai_agents import SOURCE, EventStoreSession

ROOT = Path(__file__).resolve().parents[1]
#: The SDK release whose tests judge the adapter (the one the [test] extra installs).
SDK_VERSION = "0.24.0"

#: The SDK's session tests that read or patch SQLiteSession's own machinery (its
#: connections, locks and tables), with why each cannot apply to another backend.
DESELECTED = {
    "test_await_mutation_cancellation_hides_later_failure_without_loop_error":
        "tests the SDK's private _await_mutation helper, not a session",
    "test_sqlite_session_close_closes_worker_thread_connections":
        "inspects SQLiteSession._connections (its per-thread sqlite3 connections)",
    "test_sqlite_session_reaps_connections_from_exited_worker_threads":
        "inspects SQLiteSession._connections (its per-thread sqlite3 connections)",
    "test_sqlite_session_closes_retired_connections_before_the_next_allocation":
        "patches sqlite3.connect and inspects SQLiteSession._connections",
    "test_sqlite_session_keeps_connections_of_live_worker_threads":
        "inspects SQLiteSession._connections (its per-thread sqlite3 connections)",
    "test_sqlite_session_pop_item_skips_corrupt_most_recent":
        "writes a corrupt row into SQLiteSession's agent_messages table",
    "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows":
        "writes a corrupt row into SQLiteSession's agent_messages table",
    "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows":
        "writes corrupt rows into SQLiteSession's agent_messages table",
    "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows":
        "writes corrupt rows into SQLiteSession's agent_messages table",
    "test_sqlite_session_file_lock_is_shared_across_instances":
        "inspects SQLiteSession's class-level per-file locks",
    "test_sqlite_session_failed_add_items_releases_write_lock":
        "probes SQLiteSession's agent_sessions table with sqlite3 for a held write lock",
    "test_sqlite_session_failed_clear_session_rolls_back":
        "drops SQLiteSession's tables with sqlite3 and inspects its connections",
    "test_sqlite_session_failed_pop_item_releases_write_lock":
        "drops SQLiteSession's tables with sqlite3 and inspects its connections",
    "test_sqlite_session_rollback_failure_evicts_connection":
        "patches SQLiteSession._get_connection and inspects its connections",
    "test_sqlite_session_close_retries_quarantined_connection":
        "patches SQLiteSession._get_connection and inspects its quarantined connections",
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome":
        "patches SQLiteSession._get_connection with a pausing sqlite3 connection",
}

SDK_FILES = ("tests/memory/test_session.py", "tests/memory/test_session_limit.py")


@pytest.fixture(scope="module")
def sdk_tests() -> Path:
    """The SDK's session tests, fetched once into the cache."""
    assert agents.__version__ == SDK_VERSION, (
        f"openai-agents {agents.__version__} is installed; the [test] extra pins {SDK_VERSION}"
    )
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fetch-agents-tests"), SDK_VERSION],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
# The peer's own suite (~60 s on an idle machine) in a child process: the child's own
# limit fires first, with the child's output, before this test's.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend_name", ["sqlite", "postgresql"])
def test_the_sdks_own_session_tests_pass(sdk_tests: Path, backend_name: str, tmp_path: Path) -> None:
    if backend_name == "postgresql":
        from conftest import pg_admin_url

        pg_admin_url()  # fails (never skips) without the test server
    skipped = dict(DESELECTED)
    report = tmp_path / "junit.xml"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli"), str(ROOT / "tests")]),
        "EVENTSTORE_AGENTS_BACKEND": backend_name,
    }
    args = [sys.executable, "-m", "pytest", "-q", "-p", "agents_sdk_shim", "-p", "no:cacheprovider",
            f"--junitxml={report}", *SDK_FILES]
    args += [f"-k not ({' or '.join(sorted(skipped))})"]
    run = subprocess.run(args, cwd=sdk_tests, env=env, capture_output=True, text=True, timeout=600)
    cases = ET.parse(report).getroot().iter("testcase")
    outcome: dict[str, str] = {}
    for case in cases:
        name = case.get("name", "")
        bad = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        outcome[name] = bad[0] if bad else "passed"
    ran = {n.split("[")[0] for n in outcome}
    assert not ran & set(skipped), "a deselected test ran"
    failed = {n: o for n, o in outcome.items() if o != "passed"}
    assert run.returncode == 0 and not failed, f"{failed}\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    # Every test of the files ran but the deselected ones (none vanished unnoticed).
    assert len(ran) >= 25, sorted(ran)


# -- a Runner run, compared with SQLiteSession ---------------------------------------------


@function_tool
def add_to_cart(slug: str) -> str:
    """Add a product to the cart."""
    return f"added {slug}"


def _script(model: ScriptedModel) -> None:
    """Two turns: one with reasoning (encrypted) and a tool call, one plain."""
    model.enqueue(
        [
            ResponseReasoningItem(
                id="rs_1",
                type="reasoning",
                summary=[Summary(text="The user wants mugs.", type="summary_text")],
                encrypted_content="gAAAAB-opaque",
            ),
            ResponseFunctionToolCall(
                id="fc_1", call_id="call-1", type="function_call", name="add_to_cart",
                arguments='{"slug": "mug"}',
            ),
        ]
    )
    model.enqueue([_text("Added a mug.")])
    model.enqueue([_text("You have one mug.")])


def _text(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_1",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[], logprobs=[])],
    )


async def _run(session: Any) -> list[Any]:
    model = ScriptedModel()
    _script(model)
    agent = Agent(name="shop", model=model, tools=[add_to_cart])
    first = await Runner.run(agent, "Add a mug", session=session)
    assert first.final_output == "Added a mug."
    second = await Runner.run(agent, [{"role": "user", "content": [{"type": "input_text", "text": "Count?"}]}], session=session)
    assert second.final_output == "You have one mug."
    # The second call's input is the whole history: what the session gave back.
    assert len(model.calls[-1].input) > 3
    return list(await session.get_items())


@pytest.mark.parametrize("kind", ["EventStore", "AsyncEventStore", "url"])
def test_a_runner_run_gives_the_history_sqlitesession_gives(db_url: str, tmp_path: Path, kind: str) -> None:
    async def main() -> None:
        reference = SQLiteSession("chat", tmp_path / "reference.db")
        expected = await _run(reference)
        reference.close()
        with EventStore(db_url) as store:
            store.migrate()
            if kind == "AsyncEventStore":
                astore = AsyncEventStore(db_url)
                try:
                    assert await _run(EventStoreSession("chat", astore)) == expected
                finally:
                    await astore.close()
            else:
                session = EventStoreSession("chat", store if kind == "EventStore" else db_url)
                assert await _run(session) == expected
                session.close()
            # Lossless: reasoning with its encrypted content, ids, content lists, roles.
            reasoning = next(i for i in expected if i.get("type") == "reasoning")
            assert reasoning["encrypted_content"] == "gAAAAB-opaque"
            # The run is also the session's own story: idle, the tool call done.
            state = store.load("chat").to_json()
            assert state["status"] == "idle"
            [user1, reply1, user2, reply2] = state["messages"]
            assert (user1["role"], user1["parts"][0]["text"]) == ("user", "Add a mug")
            assert user2["parts"][0]["text"] == "Count?"
            kinds = [p["type"] for p in reply1["parts"]]
            assert kinds == ["reasoning", "tool", "text"], reply1
            tool = reply1["parts"][1]
            assert (tool["name"], tool["input"], tool["state"], tool["output"]) == (
                "add_to_cart", {"slug": "mug"}, "done", "added mug"
            )
            assert reply2["parts"] == [{"type": "text", "text": "You have one mug."}]
            assert store.verify("chat").ok
            events = list(store.history("chat"))
            assert all(e.metadata == SOURCE for e in events)
            assert "add_to_cart" in store.report("chat")

    asyncio.run(main())


def test_each_add_items_is_one_atomic_append(db_url: str) -> None:
    async def main() -> None:
        with EventStore(db_url) as store:
            store.migrate()
            session = EventStoreSession("s", store)
            await session.add_items([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
            await session.add_items([{"role": "user", "content": "again"}])
            events = list(store.history("s"))
            # send, message-start, text-delta, finish: one batch, one timestamp.
            assert [e.type for e in events] == ["send", "part", "part", "part", "send"]
            assert len({e.recorded_at for e in events[:4]}) == 1
            with pytest.raises(InvalidEvent):
                await session.add_items([{"role": "user", "content": "ok"}, "not an item"])  # type: ignore[list-item]
            assert store.head("s") == 5  # nothing of the refused batch was written
            assert [i["content"] for i in await session.get_items()] == ["hi", "yo", "again"]
            assert [i["content"] for i in await session.get_items(limit=2)] == ["yo", "again"]
            assert await session.get_items(limit=0) == []

    asyncio.run(main())


def test_the_session_works_from_run_sync_on_another_loop(db_url: str) -> None:
    with EventStore(db_url) as store:
        store.migrate()
        session = EventStoreSession("s", store)
        model = ScriptedModel()
        model.enqueue([_text("one")])
        model.enqueue([_text("two")])
        agent = Agent(name="a", model=model)
        results: list[str] = []

        def worker() -> None:
            # Runner.run_sync makes an event loop of its own, in this thread.
            results.append(str(Runner.run_sync(agent, "first", session=session).final_output))
            results.append(str(Runner.run_sync(agent, "second", session=session).final_output))

        t = threading.Thread(target=worker)
        t.start()
        t.join(timeout=60)
        assert results == ["one", "two"]
        assert [i.get("content") for i in asyncio.run(session.get_items()) if i.get("role") == "user"] == [
            "first",
            "second",
        ]
        assert store.load("s").status == "idle"


def test_the_docs_program_runs_as_written(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "openai-agents.md").read_text()
    program = text.split("A complete program", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    run = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["Two", "mugs", "added.", "idle"]


def test_importing_eventstore_does_not_import_the_sdk() -> None:
    code = "import sys, eventstore; eventstore.EventStore; assert 'agents' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_pop_and_clear_are_rewinds_that_keep_the_removed_items(db_url: str) -> None:
    async def main() -> None:
        with EventStore(db_url) as store:
            store.migrate()
            session = EventStoreSession("s", store)
            items = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
            await session.add_items(items)
            await session.add_items([{"role": "user", "content": "again"}])
            head = store.head("s")
            assert await session.pop_item() == {"role": "user", "content": "again"}
            assert await session.get_items() == items
            assert store.head("s") == head - 1
            # The popped item's event is still readable, byte for byte, in the kept line.
            [kept] = store.lines("s")
            assert [e.native for e in store.history(kept.id)][-1] == {"role": "user", "content": "again"}
            await session.clear_session()
            assert await session.get_items() == [] and store.head("s") == 0
            assert await session.pop_item() is None
            assert len(store.lines("s")) == 2
            assert store.verify().ok

    asyncio.run(main())
