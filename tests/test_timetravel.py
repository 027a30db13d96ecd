"""Time travel on both backends: branch, diff, replay, turns, compaction, export/import."""

from __future__ import annotations

import io
import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore.core.diff import diff_states
from eventstore.errors import CompactedError, InvalidEvent, SessionExists, VersionNotFound
from eventstore.core.reducer import fold_json
from eventstore.samples import chat_session, demo_conversation, random_actions
from eventstore import EventStore

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin")]

_ids = itertools.count()


def uid(prefix: str = "s") -> str:
    return f"{prefix}{next(_ids)}"


@pytest.fixture
def tt(db_url: str) -> Iterator[EventStore]:
    """A migrated store with small snapshots, so loads cross snapshot boundaries."""
    with EventStore(db_url, snapshot_every=7) as store:
        store.migrate()
        yield store


def sqlite_store(path: Path) -> EventStore:
    store = EventStore(f"sqlite:///{path}")
    store.migrate()
    return store


def record(store: EventStore, session: str, actions: list[dict[str, Any]], batch: int = 9) -> int:
    head = store.head(session) if _exists(store, session) else 0
    for i in range(0, len(actions), batch):
        head = store.append(session, actions[i : i + batch], actor=f"actor-{i % 2}").version
    return head


def _exists(store: EventStore, session: str) -> bool:
    return any(s.id == session for s in store.sessions())


def state(store: EventStore, session: str, version: int | None = None) -> dict[str, Any]:
    return store.load(session, version=version).to_json()


def hashes(store: EventStore, session: str) -> list[tuple[str, int, str]]:
    return [(e.session_id, e.version, e.hash) for e in store.history(session)]


# -- branch -----------------------------------------------------------------------------


def test_branch_at_every_version_equals_the_fold_of_the_prefix(tt: EventStore) -> None:
    actions = random_actions(random.Random(7), 40)
    head = record(tt, "root", actions)
    assert head == 40
    for v in range(0, head + 1):
        b = tt.branch("root", at=v, new_id=f"root-at-{v}")
        assert tt.head(b) == v
        assert state(tt, b) == fold_json(None, actions[:v])
    # A branch of a branch, then more events on it: still the fold of its own lineage.
    extra = random_actions(random.Random(8), 10)
    bb = tt.branch("root-at-20", at=12, new_id="bb")
    record(tt, bb, extra)
    assert state(tt, bb) == fold_json(fold_json(None, actions[:12]), extra)
    assert [e.session_id for e in tt.history(bb)] == ["root"] * 12 + ["bb"] * 10


def test_writes_to_a_branch_never_change_the_parent_and_vice_versa(tt: EventStore) -> None:
    actions = chat_session(3, seed=1, deltas=4)
    head = record(tt, "p", actions)
    before = [state(tt, "p", v) for v in range(head + 1)]
    b = tt.branch("p", at=10, new_id="p-b")
    record(tt, b, chat_session(2, seed=2, deltas=4))
    assert [state(tt, "p", v) for v in range(head + 1)] == before
    assert tt.head("p") == head
    branch_states = [state(tt, b, v) for v in range(tt.head(b) + 1)]
    record(tt, "p", chat_session(1, seed=3, deltas=4))
    assert [state(tt, b, v) for v in range(tt.head(b) + 1)] == branch_states
    assert branch_states[10] == before[10]


# -- diff -------------------------------------------------------------------------------


def test_diff_finds_the_base_at_depth_three(tt: EventStore) -> None:
    rng = random.Random(3)
    record(tt, "s", random_actions(rng, 6))
    tt.branch("s", at=3, new_id="a")
    record(tt, "a", random_actions(rng, 4))  # a: 4..7
    tt.branch("a", at=5, new_id="b")
    record(tt, "b", random_actions(rng, 4))  # b: 6..9
    tt.branch("b", at=8, new_id="c")
    record(tt, "c", random_actions(rng, 3))  # c: 9..11
    tt.branch("a", at=6, new_id="d")
    record(tt, "d", random_actions(rng, 2))  # d: 7..8

    d = tt.diff(("c", None), ("d", None))
    assert d.base is not None and (d.base.session, d.base.version) == ("a", 5)
    assert (d.events_left, d.events_right) == (6, 3)
    j = d.to_json()
    assert j["left"] == {"session": "c", "version": 11}
    assert j["right"] == {"session": "d", "version": 8}
    assert j["base"] == {"session": "a", "version": 5}
    assert set(j["messages"]) == {"added", "removed", "changed"}
    assert set(j["status"]) == {"left", "right"}
    sd = diff_states(state(tt, "c"), state(tt, "d"))
    assert j["messages"] == {
        "added": list(sd.added),
        "removed": list(sd.removed),
        "changed": list(sd.changed),
    }
    # Older refs on the same lineage: the base is the older ref itself.
    assert tt.diff(("c", 7), ("c", None)).base.to_json() == {"session": "b", "version": 7}  # type: ignore[union-attr]
    assert tt.diff(("s", 2), ("d", None)).base.to_json() == {"session": "s", "version": 2}  # type: ignore[union-attr]
    # Siblings at the same fork point share the parent's state there.
    tt.branch("s", at=3, new_id="e")
    assert tt.diff(("e", None), ("a", None)).base.to_json() == {"session": "s", "version": 3}  # type: ignore[union-attr]
    # Unrelated sessions share nothing.
    record(tt, "other", random_actions(rng, 3))
    assert tt.diff(("other", None), ("s", None)).to_json()["base"] is None
    # Identical refs.
    same = tt.diff(("c", None), ("c", None))
    assert same.identical and same.events_left == 0


def test_diff_describes_changes_inside_messages(tt: EventStore) -> None:
    actions = demo_conversation()
    record(tt, "demo", actions)
    # Mid-stream of the first reply vs its end: a-1 changed (appended text, tool states).
    d = tt.diff(("demo", 6), ("demo", 20))
    assert "a-1" in d.changed
    lines = next(c for c in d.details if c.id == "a-1").lines
    assert any(line.startswith("text +") or line.startswith("+ ") for line in lines)
    with pytest.raises(VersionNotFound):
        tt.diff(("demo", 999), ("demo", None))


# -- replay and turns -------------------------------------------------------------------


def test_replay_yields_each_event_with_the_states_around_it(tt: EventStore) -> None:
    actions = demo_conversation()
    head = record(tt, "r", actions)
    steps = list(tt.replay("r"))
    assert [s.event.version for s in steps] == list(range(1, head + 1))
    for s in steps[::7]:
        assert s.after == state(tt, "r", s.event.version)
        assert s.before == state(tt, "r", s.event.version - 1)
    assert steps[0].changes[0].startswith("+ user u-1")
    part = list(tt.replay("r", after=10, upto=12))
    assert [s.event.version for s in part] == [11, 12]
    assert part[0].to_json()["version"] == 11
    with pytest.raises(VersionNotFound):
        tt.replay("r", after=12, upto=10)


def test_turn_view_from_the_store(tt: EventStore) -> None:
    record(tt, "t", demo_conversation())
    rows = tt.turns("t")
    assert [r.turn for r in rows] == [1, 2]
    assert rows[1].retries == 1 and rows[1].outcome == "idle"
    assert rows[0].actors  # recorded actors are shown
    assert tt.turns("t", upto=rows[0].last_version)[-1].turn == 1


# -- compaction -------------------------------------------------------------------------


@settings(max_examples=8)
@given(data=st.data())
def test_compaction_keeps_every_loadable_version_and_every_branch(tt: EventStore, data: st.DataObject) -> None:
    sid = uid("c")
    n = 30
    actions = random_actions(random.Random(data.draw(st.integers(0, 10_000))), n)
    record(tt, sid, actions)
    cut = data.draw(st.integers(1, n), label="cut")
    fork_low = data.draw(st.integers(0, n), label="fork")
    low = tt.branch(sid, at=fork_low, new_id=uid("low"))
    record(tt, low, random_actions(random.Random(1), 3))
    before = [state(tt, sid, v) for v in range(n + 1)]
    branch_before = [state(tt, low, v) for v in range(tt.head(low) + 1)]
    full = hashes(tt, sid)
    assert tt.verify(sid).ok

    r = tt.compact(sid, upto=cut)
    assert r.baseline == cut and r.previous_baseline == 0
    for v in range(cut, n + 1):
        assert state(tt, sid, v) == before[v]
    for v in range(0, cut):
        with pytest.raises(CompactedError) as exc:
            tt.load(sid, version=v)
        assert exc.value.baseline == cut and str(cut) in str(exc.value)
    assert [state(tt, low, v) for v in range(tt.head(low) + 1)] == branch_before
    assert hashes(tt, sid) == [h for h in full if h[1] > cut]
    assert tt.verify(sid).ok and tt.verify(low).ok
    # The log keeps growing from the baseline, and a second compaction moves it again.
    record(tt, sid, random_actions(random.Random(2), 4))
    assert tt.verify(sid).ok
    r2 = tt.compact(sid, upto=n + 2)
    assert r2.previous_baseline == cut and tt.verify(sid).ok
    with pytest.raises(CompactedError):
        tt.compact(sid, upto=cut)


@settings(max_examples=6)
@given(data=st.data())
def test_an_archive_undoes_its_compaction_in_place(tt: EventStore, data: st.DataObject) -> None:
    sid = uid("u")
    n = 25
    record(tt, sid, random_actions(random.Random(data.draw(st.integers(0, 10_000))), n))
    fork = data.draw(st.integers(0, n), label="fork")
    br = tt.branch(sid, at=fork, new_id=uid("ub"))
    record(tt, br, random_actions(random.Random(3), 2))
    cut = data.draw(st.integers(1, n), label="cut")
    before = [state(tt, sid, v) for v in range(n + 1)]
    full = hashes(tt, sid)
    buf = io.StringIO()
    tt.compact(sid, upto=cut, archive=buf)
    res = tt.import_(io.StringIO(buf.getvalue()))
    assert [r.status for r in res] == ["restored"]
    assert hashes(tt, sid) == full
    assert [state(tt, sid, v) for v in range(n + 1)] == before
    assert tt.verify(sid).ok and tt.verify(br).ok


def test_archive_then_import_restores_the_full_history(tt: EventStore, tmp_path: Path) -> None:
    record(tt, "arch", demo_conversation())
    tt.branch("arch", at=20, new_id="arch-b")
    record(tt, "arch-b", random_actions(random.Random(4), 5))
    full = hashes(tt, "arch")
    states = [state(tt, "arch", v) for v in range(tt.head("arch") + 1)]
    archive = tmp_path / "arch.jsonl"
    r = tt.compact("arch", upto=40, archive=archive)
    assert r.archived == len(full) and r.kept_for_branches == 20
    assert archive.exists()
    with sqlite_store(tmp_path / "restored.db") as other:
        res = other.import_(archive.open(encoding="utf-8"))
        assert [x.status for x in res] == ["created"]
        assert hashes(other, "arch") == full
        assert [state(other, "arch", v) for v in range(len(states))] == states
        assert other.verify("arch").ok
    # Importing the archive where the session lives undoes the compaction in place.
    with pytest.raises(CompactedError):
        tt.load("arch", version=39)
    again = tt.import_(archive.open(encoding="utf-8"))
    assert [x.status for x in again] == ["restored"]
    assert again[0].events == 40 - 20  # events 21..40 came back; 1..20 stayed for the branch
    assert hashes(tt, "arch") == full
    assert [state(tt, "arch", v) for v in range(len(states))] == states
    assert tt.verify("arch").ok and tt.verify("arch-b").ok
    assert [x.status for x in tt.import_(archive.open(encoding="utf-8"))] == ["present"]


def test_compact_all_keeps_the_last_turns(tt: EventStore) -> None:
    record(tt, "k1", chat_session(4, seed=1, deltas=3))
    record(tt, "k2", chat_session(1, seed=2, deltas=3))
    seen: list[tuple[int, int, str]] = []
    results = tt.compact_all(keep_last_turns=2, progress=lambda d, t, s: seen.append((d, t, s)))
    by = {r.session: r for r in results}
    assert by["k2"].removed == 0 and by["k2"].baseline == 0
    k1_turn3 = next(e.version for e in tt.history("k1") if e.turn == 3)
    assert by["k1"].baseline == k1_turn3 - 1
    assert [t.turn for t in tt.turns("k1")] == [3, 4]
    assert [d for d, _, _ in seen] == [1, 2]
    assert tt.verify("k1").ok


# -- export / import --------------------------------------------------------------------


def _export(store: EventStore, session: str) -> bytes:
    buf = io.StringIO()
    store.export(session, buf)
    return buf.getvalue().encode()


def _rich_session(store: EventStore) -> None:
    record(store, "x", demo_conversation())
    store.branch("x", at=15, new_id="x-b")
    record(store, "x-b", random_actions(random.Random(5), 12))
    store.append("x-b", [{"type": "send", "id": "m", "text": "meta"}], metadata={"k": [1, "é"]}, actor="me")
    store.compact("x", upto=30)
    store.branch("x-b", at=20, new_id="x-b-b")
    record(store, "x-b-b", random_actions(random.Random(6), 4))


def test_export_sqlite_to_postgres_and_back_is_byte_identical(tmp_path: Path, pg_schema: str) -> None:
    with sqlite_store(tmp_path / "a.db") as a:
        _rich_session(a)
        first = _export(a, "x-b-b")
        hist = hashes(a, "x-b-b")
        xhist = hashes(a, "x")
    with EventStore(pg_schema) as pg:
        pg.migrate()
        res = pg.import_(io.StringIO(first.decode()))
        assert [r.session for r in res] == ["x", "x-b", "x-b-b"]
        assert _export(pg, "x-b-b") == first
        assert hashes(pg, "x-b-b") == hist and hashes(pg, "x") == xhist
        assert pg.verify("x").ok and pg.verify("x-b-b").ok
        with pytest.raises(CompactedError):
            pg.load("x", version=29)
        back = _export(pg, "x-b-b")
    with sqlite_store(tmp_path / "b.db") as b:
        b.import_(io.StringIO(back.decode()))
        assert _export(b, "x-b-b") == first


def test_import_refuses_tampered_and_malformed_files(tt: EventStore, tmp_path: Path) -> None:
    with sqlite_store(tmp_path / "src.db") as src:
        record(src, "z", demo_conversation())
        good = _export(src, "z").decode()
    tampered = good.replace("dishwasher safe", "dishwasher-safe", 1)
    assert tampered != good
    with pytest.raises(InvalidEvent, match="hash"):
        tt.import_(io.StringIO(tampered))
    assert tt.sessions() == []
    with pytest.raises(InvalidEvent):
        tt.import_(io.StringIO(good.replace("}\n", "\n", 3)))
    with pytest.raises(InvalidEvent):
        tt.import_(io.StringIO('{"hello": 1}\n'))
    dropped = "\n".join(line for i, line in enumerate(good.splitlines()) if i != 5) + "\n"
    with pytest.raises(InvalidEvent):
        tt.import_(io.StringIO(dropped))
    assert tt.sessions() == []
    # A different session already using the id is never overwritten.
    tt.append("z", [{"type": "send", "id": "other", "text": "not the same"}])
    with pytest.raises(SessionExists, match="another history"):
        tt.import_(io.StringIO(good))


def test_import_extends_a_prefix_and_skips_what_is_present(tt: EventStore, tmp_path: Path) -> None:
    with sqlite_store(tmp_path / "src.db") as src:
        actions = demo_conversation()
        record(src, "y", actions[:20])
        prefix = _export(src, "y").decode()
        record(src, "y", actions[20:])
        full = _export(src, "y").decode()
        want = hashes(src, "y")
    assert [r.status for r in tt.import_(io.StringIO(prefix))] == ["created"]
    assert [r.status for r in tt.import_(io.StringIO(full))] == ["extended"]
    assert [r.status for r in tt.import_(io.StringIO(full))] == ["present"]
    assert hashes(tt, "y") == want


def test_import_writes_the_periodic_snapshots(tt: EventStore, tmp_path: Path) -> None:
    """An imported session loads like the original: from snapshots, not from its start."""
    with EventStore(f"sqlite:///{tmp_path / 'src.db'}", snapshot_every=7, seal=False) as src:
        src.migrate()
        record(src, "long", chat_session(3, seed=4, deltas=10))
        src.branch("long", at=30, new_id="long-b")
        record(src, "long-b", random_actions(random.Random(9), 20))
        src.compact("long", upto=50)
        data = _export(src, "long-b").decode()
        want = src.verify()
        states = {v: state(src, "long-b", v) for v in range(0, tt_head(src, "long-b") + 1)}
    tt.import_(io.StringIO(data))
    got = tt.verify()
    # Sealing the imported turns keeps one snapshot in two inside them (the source seals none).
    assert got.ok and want.snapshots // 2 <= got.snapshots <= want.snapshots
    assert got.snapshots > 0
    assert {v: state(tt, "long-b", v) for v in states} == states


def tt_head(store: EventStore, session: str) -> int:
    return store.head(session)


def test_branch_at_zero_shares_the_empty_state(tt: EventStore) -> None:
    record(tt, "z", random_actions(random.Random(1), 5))
    tt.branch("z", at=0, new_id="z0")
    record(tt, "z0", random_actions(random.Random(2), 3))
    assert tt.diff(("z0", None), ("z", None)).to_json()["base"] == {"session": "z", "version": 0}
