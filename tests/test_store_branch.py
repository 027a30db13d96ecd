"""Copy-on-write branches (issue 4, storage side), on both backends."""

from __future__ import annotations

import random
from typing import Any

import pytest

from conftest import make_store
from eventstore.errors import InvalidEvent, SessionExists, SessionNotFound, VersionNotFound
from eventstore.core.reducer import fold_json
from eventstore.samples import random_actions
from eventstore import EventStore

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin")]


def _session(store: EventStore, n: int, seed: int, session: str = "s1") -> list[dict[str, Any]]:
    actions = random_actions(random.Random(seed), n)
    for i in range(0, n, 9):
        store.append(session, actions[i : i + 9])
    return actions


def test_branch_at_every_version_is_the_fold_of_the_prefix(db_url: str) -> None:
    with make_store(db_url, snapshot_every=7) as store:
        actions = _session(store, 60, seed=21)
        for v in range(61):
            b = store.branch("s1", at=v, new_id=f"b{v}")
            assert b == f"b{v}"
            assert store.head(b) == v
            assert store.load(b).to_json() == fold_json(None, actions[:v]), f"at {v}"
            assert [e.version for e in store.history(b)] == list(range(1, v + 1))


def test_writes_to_a_branch_and_its_parent_are_independent(db_url: str) -> None:
    with make_store(db_url, snapshot_every=7) as store:
        actions = _session(store, 40, seed=22)
        store.branch("s1", at=25, new_id="alt")
        extra = random_actions(random.Random(23), 30)
        r = store.append("alt", extra, expected_version=25)
        assert (r.first_version, r.version) == (26, 55)
        more = random_actions(random.Random(24), 12)
        store.append("s1", more, expected_version=40)
        assert store.load("s1").to_json() == fold_json(None, actions + more)
        assert store.load("alt").to_json() == fold_json(None, actions[:25] + extra)
        for v in range(56):
            assert store.load("alt", version=v).to_json() == fold_json(None, (actions[:25] + extra)[:v])
        hist = list(store.history("alt"))
        assert [e.session_id for e in hist] == ["s1"] * 25 + ["alt"] * 30
        assert [e.version for e in hist] == list(range(1, 56))
        assert [e.session_id for e in store.history("s1")] == ["s1"] * 52
        assert store.verify().ok


def test_branches_of_branches(db_url: str) -> None:
    with make_store(db_url, snapshot_every=5) as store:
        a = _session(store, 30, seed=25)
        store.branch("s1", at=20, new_id="b")
        b_extra = random_actions(random.Random(26), 15)
        store.append("b", b_extra)
        store.branch("b", at=28, new_id="c")  # inside b's own events
        store.branch("b", at=12, new_id="d")  # inside what b inherits from s1
        c_extra = random_actions(random.Random(27), 8)
        store.append("c", c_extra)
        store.append("d", c_extra)
        b_line = a[:20] + b_extra
        assert store.load("c").to_json() == fold_json(None, b_line[:28] + c_extra)
        assert store.load("d").to_json() == fold_json(None, a[:12] + c_extra)
        for v in range(37):
            assert store.load("c", version=v).to_json() == fold_json(None, (b_line[:28] + c_extra)[:v])
        assert [e.session_id for e in store.history("c")] == ["s1"] * 20 + ["b"] * 8 + ["c"] * 8
        assert [e.session_id for e in store.history("d")] == ["s1"] * 12 + ["d"] * 8
        assert [e.session_id for e in store.history("c", after=18, upto=30)] == ["s1"] * 2 + [
            "b"
        ] * 8 + ["c"] * 2
        info = {s.id: s for s in store.sessions()}
        assert (info["c"].parent, info["c"].fork_version) == ("b", 28)
        assert (info["d"].parent, info["d"].fork_version) == ("b", 12)
        report = store.verify()
        assert report.ok, report.problems


def test_turns_continue_across_the_fork(store: EventStore) -> None:
    send = lambda i: {"type": "send", "id": f"u-{i}", "text": "x"}  # noqa: E731
    store.append("s1", [send(1), {"type": "stop"}, send(2), {"type": "stop"}])
    store.branch("s1", at=3, new_id="b")
    store.append("b", [send(3)])
    assert [e.turn for e in store.history("b")] == [1, 1, 2, 3]


def test_branch_errors(store: EventStore) -> None:
    store.append("s1", [{"type": "stop"}] * 3)
    with pytest.raises(SessionNotFound):
        store.branch("missing")
    with pytest.raises(VersionNotFound):
        store.branch("s1", at=4)
    with pytest.raises(VersionNotFound):
        store.branch("s1", at=-1)
    store.branch("s1", new_id="taken")
    with pytest.raises(SessionExists):
        store.branch("s1", at=1, new_id="taken")
    with pytest.raises(SessionExists):
        store.branch("s1", at=1, new_id="s1")
    with pytest.raises(InvalidEvent):
        store.branch("s1", new_id="")
    generated = store.branch("s1")
    assert generated.startswith("s1-") and store.head(generated) == 3
    assert len({store.branch("s1") for _ in range(5)}) == 5
