"""Rewind seen from outside the store's calls: live readers, checkpoints, tampering, the
CLI, and a property over random sequences of appends, branches and rewinds (both backends)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from cli_helpers import one_error_line, run_cli
from conftest import make_store
from eventstore import AsyncEventStore, SessionRewound


def send(i: int, text: str = "x") -> dict[str, Any]:
    return {"type": "send", "id": f"u-{i}", "text": text}


# -- live readers -------------------------------------------------------------------------

SAFETY = 30.0  # an idle timeout no passing run comes near


def test_follow_hands_out_what_came_before_the_rewind_then_raises(db_url: str) -> None:
    with make_store(db_url) as store:
        store.append("s1", [send(i) for i in range(5)])
        follower = store.follow("s1", idle_timeout=SAFETY)
        assert [next(follower).version for _ in range(5)] == [1, 2, 3, 4, 5]
        store.append("s1", [send(5), send(6)])
        store.rewind("s1", to=3)
        store.append("s1", [send(7)])  # the new line's 4: not this follower's
        got = []
        with pytest.raises(SessionRewound) as caught:
            for ev in follower:
                got.append((ev.session_id, ev.version))
        assert got == [("s1", 6), ("s1", 7)]
        assert (caught.value.to, caught.value.kept, caught.value.session) == (3, "s1~1", "s1")
        # A new follower reads the new line.
        assert [e.version for e in store.follow("s1", idle_timeout=0)] == [1, 2, 3, 4]


def test_the_feed_yields_every_event_once_across_a_rewind(db_url: str) -> None:
    with make_store(db_url) as store:
        store.append("s1", [send(i) for i in range(4)])
        store.append("s2", [send(0)])
        first = list(store.feed(idle_timeout=0))
        store.rewind("s1", to=2)
        store.append("s1", [send(10)])
        after = list(store.feed(idle_timeout=0))
        # The events of before read the same (ids, positions) after the rewind ...
        assert after[: len(first)] == first
        # ... and the new line's event comes once, under the session id, at version 3 again.
        assert [(e.session_id, e.version) for e in after[len(first) :]] == [("s1", 3)]
        assert len({e.position for e in after}) == len(after) == 6
        rest = list(store.feed(after=first[-1].position, idle_timeout=0))
        assert [(e.session_id, e.version) for e in rest] == [("s1", 3)]


def test_async_follow_raises_session_rewound_too(db_url: str) -> None:
    make_store(db_url).close()

    async def main() -> tuple[list[int], SessionRewound]:
        async with AsyncEventStore(db_url) as astore:
            await astore.append("s1", [send(i) for i in range(3)])
            follower = astore.follow("s1", idle_timeout=SAFETY)
            seen = []
            async for ev in follower:
                seen.append(ev.version)
                if ev.version == 3:
                    break
            await astore.rewind("s1", to=1)
            try:
                async for ev in follower:
                    seen.append(ev.version)
            except SessionRewound as exc:
                return seen, exc
            raise AssertionError("no SessionRewound")

    seen, exc = asyncio.run(main())
    assert seen == [1, 2, 3] and (exc.to, exc.kept) == (1, "s1~1")


# -- checkpoints and tampering ------------------------------------------------------------


def test_a_checkpoint_taken_before_a_rewind_still_verifies_and_names_it(db_url: str) -> None:
    from eventstore import generate_keypair

    private, public = generate_keypair()
    with make_store(db_url) as store:
        store.append("s1", [send(i) for i in range(6)])
        store.append("s2", [send(0)])
        cp = store.checkpoint(private)
        store.rewind("s1", to=2, actor="user:ada", reason="edit")
        store.append("s1", [send(10), send(11), send(12), send(13)])  # past the anchored 6 again
        store.rewind("s1", to=1)
        report = store.verify(checkpoint=cp, public_key=public)
        assert report.ok, report.problems
        rewound = [n for n in report.notices if n.kind == "rewound" and "s1~1" in n.message and "anchored" in n.message]
        assert rewound and rewound[0].session == "s1"


def _attacker(db_url: str, backend: str) -> Any:
    from sqlalchemy import create_engine

    return create_engine(db_url)


def test_a_rewind_made_by_editing_the_database_is_caught(db_url: str, backend: str) -> None:
    from sqlalchemy import text

    from eventstore import generate_keypair

    private, public = generate_keypair()
    with make_store(db_url) as store:
        store.append("s1", [send(i) for i in range(6)])
        cp = store.checkpoint(private)
        engine = _attacker(db_url, backend)
        try:
            with engine.begin() as conn:
                # The same change as rewind("s1", to=2) makes to the session row, with no record.
                h2 = conn.execute(
                    text("SELECT e.hash FROM events e JOIN sessions s ON s.pk = e.session_pk WHERE s.id = 's1' AND e.version = 2")
                ).scalar()
                conn.execute(text("UPDATE sessions SET id = 's1~1' WHERE id = 's1'"))
                pk = conn.execute(text("SELECT pk FROM sessions WHERE id = 's1~1'")).scalar()
                conn.execute(
                    text(
                        "INSERT INTO sessions (id, parent_pk, fork_version, head, head_hash, head_turn, baseline, "
                        "baseline_turn, created_at) VALUES ('s1', :pk, 2, 2, :h, 2, 0, 0, 0)"
                    ),
                    {"pk": pk, "h": h2},
                )
        finally:
            engine.dispose()
        report = store.verify(checkpoint=cp, public_key=public)
        assert not report.ok
        assert {p.kind for p in report.problems} >= {"head_moved_back"}
        # A forged rewind record does not help: the kept line must still hold the anchored head.
        assert not [n for n in report.notices if n.kind == "rewound"]


def test_a_rewind_whose_kept_line_lost_the_anchored_head_is_caught(db_url: str, backend: str) -> None:
    from sqlalchemy import text

    from eventstore import generate_keypair

    private, public = generate_keypair()
    with make_store(db_url) as store:
        store.append("s1", [send(i) for i in range(6)])
        cp = store.checkpoint(private)
        store.rewind("s1", to=2)
        engine = _attacker(db_url, backend)
        try:
            with engine.begin() as conn:
                # Point the record at another line: the anchored version is not held there.
                store.append("decoy", [send(i) for i in range(7)])
                conn.execute(text("UPDATE session_rewinds SET kept_id = 'decoy'"))
        finally:
            engine.dispose()
        report = store.verify(checkpoint=cp, public_key=public)
        assert not report.ok
        assert [p.kind for p in report.problems if p.session == "s1"] == ["rewritten"]


# -- the CLI ------------------------------------------------------------------------------


def test_cli_rewind_prints_the_kept_id(db_url: str) -> None:
    with make_store(db_url) as store:
        store.append("s1", [send(i) for i in range(4)])
    r = run_cli("rewind", "s1", "--to", "2", "--reason", "edit", db=db_url)
    assert r.stdout.strip() == "s1~1"
    r = run_cli("rewind", "s1", "--to", "0", "--expected-version", "2", "--json", db=db_url)
    assert json.loads(r.stdout) == {"session": "s1", "to": 0, "kept": "s1~2"}
    r = run_cli("rewind", "s1", "--to", "0", "--json", db=db_url)
    assert json.loads(r.stdout)["kept"] is None
    assert "error:" in one_error_line(run_cli("rewind", "s1", "--to", "5", db=db_url, code=1))
    assert "not 9" in one_error_line(run_cli("rewind", "s1~1", "--to", "0", "--expected-version", "9", db=db_url, code=1))
    r = run_cli("rewind", "--help", db=db_url)
    assert "--to" in r.stdout and "--reason" in r.stdout
    with make_store(db_url) as store:
        assert [i.id for i in store.lines("s1")] == ["s1~1", "s1~2"]


# -- a property over random sequences ------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from strategies import actions as action_strategy  # noqa: E402

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 3), st.lists(action_strategy, min_size=1, max_size=4)),
        st.tuples(st.just("branch"), st.integers(0, 3), st.floats(0, 1)),
        st.tuples(st.just("rewind"), st.integers(0, 3), st.floats(0, 1)),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=15)
@given(ops=_ops)
def test_after_any_appends_branches_and_rewinds_every_event_stays_readable(db_url: str, ops: list[Any]) -> None:
    """Every id's load is the fold of its history, and every event ever acknowledged is
    still readable, unchanged, by its event id under some id."""
    from eventstore import SessionClosed
    from eventstore.core.reducer import fold_json

    with make_store(db_url, snapshot_every=3) as store:
        run = store.sessions().__len__()  # a fresh namespace per example: the database is shared
        ids: list[str] = [f"r{run}-0"]
        acked: dict[str, Any] = {}
        n = 0
        for op, which, arg in ops:
            sid = ids[which % len(ids)]
            if op == "append":
                eids = [f"{sid}/{n + i}" for i in range(len(arg))]
                n += len(arg)
                try:
                    store.append(sid, arg, event_ids=eids)
                except SessionClosed:
                    continue  # a kept line
                for e in store.history(sid, after=store.head(sid) - len(arg)):
                    acked[e.event_id] = e
            elif sid in {i.id for i in store.sessions()}:
                at = int(arg * store.head(sid))
                if op == "branch":
                    ids.append(store.branch(sid, at=at, new_id=f"{sid}.b{len(ids)}"))
                else:
                    try:
                        kept = store.rewind(sid, to=at)
                    except SessionClosed:
                        continue
                    if kept is not None:
                        ids.append(kept)
        readable: dict[str, Any] = {}
        for info in store.sessions():
            events = list(store.history(info.id))
            assert [e.version for e in events] == list(range(1, info.head + 1))
            assert store.load(info.id).to_json() == fold_json(None, [e.action for e in events])
            for e in events:
                readable.setdefault(e.event_id, e)
        for eid, e in acked.items():
            assert readable.get(eid) == e, eid
        assert store.verify().ok


def test_history_turns_and_the_report_show_kept_lines(db_url: str, tmp_path: Any) -> None:
    with make_store(db_url) as store:
        store.append("s1", [send(i) for i in range(4)])
        store.rewind("s1", to=2, reason="edit")
    r = run_cli("history", "s1", "--turns", db=db_url)
    assert "kept lines" in r.stdout and "s1~1" in r.stdout and "rewound to v2" in r.stdout
    out = tmp_path / "report.html"
    run_cli("report", "s1", "-o", str(out), db=db_url)
    page = out.read_text(encoding="utf-8")
    assert "s1~1" in page and "kept by a rewind of s1 to v2" in page and "was rewound" in page
