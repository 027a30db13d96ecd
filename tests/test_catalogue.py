"""The conversations catalogue: set_info, info, list_sessions — on both backends, both twins."""

from __future__ import annotations

import io
import random
from typing import Any

import pytest
from sqlalchemy import Engine, text

from conftest import make_store
from eventstore import EventStore, SessionPage
from eventstore.core.catalogue import TITLE_CHARS
from eventstore.core.reducer import fold_json
from eventstore.errors import InvalidEvent, SessionErased, SessionNotFound
from eventstore.samples import random_actions

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin")]


def send(i: int | str, text: str = "hello") -> dict[str, Any]:
    return {"type": "send", "id": f"u-{i}", "text": text}


FINISH = {"type": "part", "part": {"type": "finish"}}
ERROR = {"type": "part", "part": {"type": "error", "error": "boom"}}


def first_user_text(state: dict[str, Any]) -> str | None:
    for m in state["messages"]:
        if m["role"] == "user":
            return str(m["parts"][0]["text"])[:TITLE_CHARS]
    return None


def ids(page: SessionPage) -> list[str]:
    return [s.id for s in page.items]


def test_info_follows_the_fold_through_every_write(store: EventStore) -> None:
    # Random batches (resets and retries included, so a retry meets states with and
    # without a user message): after each, the catalogue says what a fold says.
    rng = random.Random(7)
    actions = random_actions(rng, 300)
    actions[40:40] = [{"type": "reset"}, {"type": "retry"}, send("r", "after reset")]
    actions[90:90] = [{"type": "reset"}, {"type": "retry"}]
    i = 0
    while i < len(actions):
        n = rng.randint(1, 9)
        batch = actions[i : i + n]
        # Every other batch through the locked path (expected_version), the rest optimistic.
        store.append("s1", batch, expected_version=i if rng.random() < 0.5 else None)
        i += len(batch)
        state = fold_json(None, actions[:i])
        info = store.info("s1")
        assert info.status == state["status"], i
        assert info.title == first_user_text(state), i
        history = list(store.history("s1"))
        assert info.updated_at == history[-1].recorded_at
        assert info.turns == history[-1].turn == info.head_turn
    listed = store.list_sessions().items
    assert [(s.id, s.status, s.title) for s in listed] == [("s1", info.status, info.title)]
    assert store.sessions()[0].to_json() == listed[0].to_json()


def test_a_new_session_has_no_title_until_a_send(store: EventStore) -> None:
    store.append("s1", [{"type": "part", "part": {"type": "message-start", "messageId": "a"}}])
    info = store.info("s1")
    assert (info.title, info.owner, info.metadata, info.status) == (None, None, {}, "idle")
    store.append("s1", [send(1, "x" * 200)])
    assert store.info("s1").title == "x" * 80
    store.append("s1", [send(2, "second")])
    assert store.info("s1").title == "x" * 80


def test_streaming_turns_and_branches_keep_the_catalogue(store: EventStore) -> None:
    with store.turn("s1", send(1, "Coffee mugs")) as turn:
        turn.write({"type": "message-start", "messageId": "a-1"})
        turn.write({"type": "text-delta", "messageId": "a-1", "text": "Hi"})
        turn.flush()
        assert store.info("s1").status == "streaming"
        turn.write({"type": "finish"})
    info = store.info("s1")
    assert (info.status, info.title, info.turns) == ("idle", "Coffee mugs", 1)
    assert info.updated_at == list(store.history("s1"))[-1].recorded_at
    store.append("s1", [send(2), ERROR])
    assert store.info("s1").status == "error"
    # A branch starts with its fork point's status and title.
    early = store.branch("s1", at=1, new_id="early")
    assert (store.info(early).status, store.info(early).title) == ("streaming", "Coffee mugs")
    empty = store.branch("s1", at=0, new_id="empty")
    assert (store.info(empty).status, store.info(empty).title) == ("idle", None)
    assert store.info(store.branch("s1", new_id="tip")).status == "error"


def test_set_info_sets_what_is_given_and_records_it(store: EventStore) -> None:
    store.append("s1", [send(1, "auto title")])
    head, events = store.head("s1"), [e.to_json() for e in store.history("s1")]
    info = store.set_info("s1", title="Coffee mugs", owner="user:ada", metadata={"tenant": "acme"}, actor="user:ada")
    assert (info.title, info.owner, info.metadata) == ("Coffee mugs", "user:ada", {"tenant": "acme"})
    # None leaves a field alone; metadata is replaced whole.
    info = store.set_info("s1", metadata={"plan": "pro"})
    assert (info.title, info.owner, info.metadata) == ("Coffee mugs", "user:ada", {"plan": "pro"})
    info = store.set_info("s1", metadata={})
    assert info.metadata == {}
    # An empty title clears it: the first user text shows again.
    assert store.set_info("s1", title="").title == "auto title"
    # Not an event: the head and the log are as they were.
    assert store.head("s1") == head
    assert [e.to_json() for e in store.history("s1")] == events
    assert store.verify("s1").ok
    changes = store.info_changes("s1")
    assert [c.changes for c in changes] == [
        {"title": "Coffee mugs", "owner": "user:ada", "metadata": {"tenant": "acme"}},
        {"metadata": {"plan": "pro"}},
        {"metadata": {}},
        {"title": ""},
    ]
    assert changes[0].actor == "user:ada" and changes[1].actor is None
    assert changes[0].to_json()["changed_at"].endswith("Z")
    with pytest.raises(SessionNotFound):
        store.set_info("nope", title="x")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"title": "a\x1b[31mred"},
        {"title": "x" * 201},
        {"title": 5},
        {"title": "\ud800"},
        {"owner": ""},
        {"owner": "a\nb"},
        {"owner": ["user"]},
        {"metadata": ["not", "an", "object"]},
        {"metadata": {"k": "line\nbreak"}},
        {"metadata": {"k\x00": "v"}},
        {"metadata": {"": "v"}},
        {"metadata": {"k": float("nan")}},
        {"metadata": {f"k{i}": i for i in range(65)}},
        {"metadata": {"k": "x" * 9000}},
        {"metadata": {"k": {"nested": "\x07"}}},
        {"actor": "a\x00"},
    ],
)
def test_set_info_refuses_hostile_input(store: EventStore, kwargs: dict[str, Any]) -> None:
    store.append("s1", [send(1)])
    store.set_info("s1", title="kept", owner="o", metadata={"k": "v"})
    with pytest.raises(InvalidEvent):
        store.set_info("s1", **kwargs)
    info = store.info("s1")
    assert (info.title, info.owner, info.metadata) == ("kept", "o", {"k": "v"})
    assert len(store.info_changes("s1")) == 1


def _catalogue(store: EventStore) -> None:
    store.append("a", [send(1, "Coffee MUGS and cups"), FINISH])
    store.append("b", [send(1, "tea 100% pure")])
    store.append("c", [send(1, "mugshot"), ERROR])
    store.append("d", [send(1, "closed one"), FINISH])
    store.close_session("d", reason="done")
    store.set_info("a", owner="user:ada", metadata={"tenant": "acme", "n": 1, "tags": ["x", "y"]})
    store.set_info("b", owner="user:ada", metadata={"tenant": "acme", "n": True})
    store.set_info("c", owner="user:bob", metadata={"tenant": "acme", "n": "1", "tags": {"a": 1, "b": 2}})
    store.set_info("d", owner="user:ada", title="Renamed")


def test_list_sessions_filters(store: EventStore) -> None:
    _catalogue(store)
    ls = store.list_sessions
    assert ids(ls()) == ["d", "c", "b", "a"]
    assert ids(ls(order="created")) == ["a", "b", "c", "d"]
    assert ids(ls(owner="user:ada")) == ["d", "b", "a"]
    assert ids(ls(owner="user:ad")) == []
    assert ids(ls(metadata={"tenant": "acme"})) == ["c", "b", "a"]
    # Values compare as JSON values: 1, true and "1" differ; nested values by value.
    assert ids(ls(metadata={"n": 1})) == ["a"]
    assert ids(ls(metadata={"n": True})) == ["b"]
    assert ids(ls(metadata={"n": "1"})) == ["c"]
    assert ids(ls(metadata={"tags": {"b": 2, "a": 1}})) == ["c"]
    assert ids(ls(metadata={"tags": ["x", "y"]})) == ["a"]
    assert ids(ls(metadata={"tags": ["y", "x"]})) == []
    assert ids(ls(metadata={"tenant": "acme", "n": 1})) == ["a"]
    assert ids(ls(metadata={"missing": None})) == []
    assert ids(ls(query="MUG")) == ["c", "a"]
    assert ids(ls(query="renamed")) == ["d"]
    assert ids(ls(query="closed")) == []  # a set title replaces the first user text
    assert ids(ls(query="%")) == ["b"]  # LIKE wildcards are plain characters
    assert ids(ls(query="_")) == []
    assert ids(ls(status="idle")) == ["a"]
    assert ids(ls(status="streaming")) == ["b"]
    assert ids(ls(status="error")) == ["c"]
    assert ids(ls(status="closed")) == ["d"]
    assert ids(ls(owner="user:ada", status="idle", query="cup", metadata={"n": 1})) == ["a"]
    page = ls(owner="user:ada", limit=2)
    assert page.to_json()["next_cursor"] == page.next_cursor is not None
    assert [s["id"] for s in page.to_json()["items"]] == ["d", "b"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": 0},
        {"limit": 1001},
        {"limit": True},
        {"limit": "5"},
        {"order": "oldest"},
        {"status": "running"},
        {"owner": 3},
        {"metadata": "tenant=acme"},
        {"query": "a\x1b"},
        {"include_lines": "yes"},
    ],
)
def test_list_sessions_refuses_bad_arguments(store: EventStore, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidEvent):
        store.list_sessions(**kwargs)


def test_limit_bounds_are_inclusive(store: EventStore) -> None:
    store.append("a", [send(1)])
    assert ids(store.list_sessions(limit=1)) == ["a"]
    assert ids(store.list_sessions(limit=1000)) == ["a"]


def test_cursors_are_checked(store: EventStore) -> None:
    for i in range(3):
        store.append(f"s{i}", [send(i)])
    cursor = store.list_sessions(limit=1).next_cursor
    assert cursor is not None
    data, _, check = cursor.partition(".")
    flipped = data[:-1] + ("A" if data[-1] != "A" else "B")
    for bad in [flipped + "." + check, data + ".", data, "", "x" * 5000, "not a cursor", "é.é", 42, ["c"]]:
        with pytest.raises(InvalidEvent) as exc:
            store.list_sessions(limit=1, cursor=bad)  # type: ignore[arg-type]
        assert exc.value.field == "cursor"
    # A cursor of another listing (other filters, another order) is refused too.
    for other in [{"order": "created"}, {"owner": "x"}, {"query": "h"}, {"include_lines": True}]:
        with pytest.raises(InvalidEvent):
            store.list_sessions(limit=1, cursor=cursor, **other)
    # The limit may change between pages.
    assert len(store.list_sessions(limit=5, cursor=cursor).items) == 2


@pytest.mark.parametrize("order", ["recent", "created"])
def test_paging_is_stable_while_sessions_are_written(store: EventStore, order: str) -> None:
    rng = random.Random(order)
    for i in range(40):
        store.append(f"s{i:02}", [send(i)])
    seen: list[str] = []
    written: set[str] = set()
    cursor = None
    n = 100
    while True:
        page = store.list_sessions(order=order, limit=6, cursor=cursor)
        seen += ids(page)
        # Between pages: new sessions, and writes to sessions on both sides of the cursor.
        for _ in range(3):
            victim = f"s{rng.randrange(40):02}"
            store.append(victim, [FINISH])
            written.add(victim)
        store.append(f"new{n}", [send(n)])
        n += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    unchanged = {f"s{i:02}" for i in range(40)} - (written if order == "recent" else set())
    for sid in unchanged:
        assert seen.count(sid) == 1, sid
    # Under `created` no key changes: the listing is exactly the creation order.
    if order == "created":
        assert seen[:40] == [f"s{i:02}" for i in range(40)]
    assert len(seen) == len(set(seen)) or order == "recent"


def test_ties_are_ordered_by_id(store: EventStore, raw_engine: Engine) -> None:
    for sid in ["b", "c", "a", "d"]:
        store.append(sid, [send(1)])
    with raw_engine.begin() as conn:
        conn.execute(text("UPDATE sessions SET updated_at = 5, created_at = 7"))
    assert ids(store.list_sessions()) == ["a", "b", "c", "d"]
    assert ids(store.list_sessions(order="created")) == ["a", "b", "c", "d"]
    pages, cursor = [], None
    for _ in range(4):
        page = store.list_sessions(limit=1, cursor=cursor)
        pages += ids(page)
        cursor = page.next_cursor
    assert pages == ["a", "b", "c", "d"] and cursor is None


def test_erased_sessions_are_never_listed(store: EventStore) -> None:
    store.append("a", [send(1)])
    store.append("b", [send(1)])
    store.set_info("a", title="secret title", owner="o")
    store.branch("a", new_id="a-branch")
    store.erase("a", reason="user asked")
    assert ids(store.list_sessions()) == ["b"]
    assert ids(store.list_sessions(owner="o")) == []
    assert [s.id for s in store.sessions()] == ["b"]
    with pytest.raises(SessionErased):
        store.info_changes("a")


def test_kept_lines_are_listed_only_when_asked(store: EventStore) -> None:
    store.append("s1", [send(1, "first"), FINISH])
    store.set_info("s1", title="Mugs", owner="user:ada", metadata={"tenant": "acme"})
    kept = store.rewind("s1", to=1)
    assert kept == "s1~1"
    assert ids(store.list_sessions()) == ["s1"]
    assert sorted(ids(store.list_sessions(include_lines=True))) == ["s1", "s1~1"]
    # The conversation keeps its title, owner and metadata under its id after the rewind,
    # and a rewind is activity: the session comes first in the recent order.
    info = store.list_sessions(owner="user:ada").items[0]
    assert (info.id, info.title, info.metadata) == ("s1", "Mugs", {"tenant": "acme"})
    assert info.updated_at >= list(store.history("s1~1"))[-1].recorded_at


def test_export_import_keeps_status_and_title(
    db_url: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    with make_store(db_url) as store:
        store.append("s1", [send(1, "imported"), FINISH, send(2, "more")])
        store.append("s1", [{"type": "toolPhase", "name": "x", "state": "running"}])
        out = io.StringIO()
        store.export("s1", out)
    # Into an empty database of the same backend.
    other = f"sqlite:///{tmp_path / 'other.db'}" if db_url.startswith("sqlite") else _other_schema(request)
    with make_store(other) as again:
        again.import_(io.StringIO(out.getvalue()))
        info = again.info("s1")
        assert (info.status, info.title, info.turns) == ("streaming", "imported", 2)
        assert info.updated_at == list(again.history("s1"))[-1].recorded_at


def _other_schema(request: pytest.FixtureRequest) -> str:
    """A second empty PostgreSQL schema for this test (dropped after it)."""
    import uuid

    import psycopg

    from conftest import pg_admin_url

    admin = pg_admin_url()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    dsn = admin.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')

    def drop() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')

    request.addfinalizer(drop)
    sep = "&" if "?" in admin else "?"
    return f"{admin}{sep}options=-csearch_path%3D{schema}"


def test_a_send_with_nul_gets_a_title_the_database_can_hold(store: EventStore) -> None:
    store.append("s1", [send(1, "a\x00b")])
    assert store.info("s1").title == "a\ufffdb"
    assert ids(store.list_sessions(query="a\ufffdb")) == ["s1"]


@pytest.mark.parametrize("seed", [3, 11])
def test_a_branch_or_rewind_gets_the_columns_a_fold_gives(
    db_url: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Random sessions (resets and retries in them, snapshots every few versions): the
    # columns of a branch or a rewound head at any version are the fold's at that version,
    # and making them never folds the state (their cost must not grow with the session).
    from eventstore.engine.engine import Engine as StoreEngine

    rng = random.Random(seed)
    actions = random_actions(rng, 120)
    actions[0:0] = [{"type": "toolPhase", "name": "x", "state": "running"}, {"type": "retry"}]
    for at in sorted(rng.sample(range(5, len(actions)), 4), reverse=True):
        actions[at:at] = rng.choice([[{"type": "reset"}], [{"type": "reset"}, {"type": "retry"}]])
    with make_store(db_url, snapshot_every=5) as store:
        i = 0
        while i < len(actions):
            batch = actions[i : i + rng.randint(1, 4)]
            store.append("s", batch)
            i += len(batch)
        store.branch("s", at=len(actions) - 3, new_id="mid")

        def folded(state_at: Any, *args: Any) -> Any:
            raise AssertionError("a branch or a rewind folded the state")

        versions = sorted({0, 1, 2, len(actions) - 1, *rng.sample(range(len(actions)), 25)})
        n = 0
        for v in versions:
            state = fold_json(None, actions[:v])
            want = (state["status"], first_user_text(state))
            with monkeypatch.context() as m:
                m.setattr(StoreEngine, "state_at", folded)
                b = store.branch("s", at=v, new_id=f"b{v}")
                # A branch of a branch reads its lineage's snapshots and events.
                bb = store.branch("mid", at=v, new_id=f"bb{v}") if v <= len(actions) - 3 else None
                store.append(f"r{v}", actions[: min(len(actions), v + 7)])
                store.rewind(f"r{v}", to=v)
            for sid in (b, bb, f"r{v}"):
                if sid is not None:
                    info = store.info(sid)
                    assert (info.status, info.title) == want, (sid, v)
                    n += 1
        assert n > 2 * len(versions)
