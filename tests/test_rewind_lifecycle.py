"""Rewinds with erasure and compaction: the documented interactions hold (both backends,
both twins)."""

from __future__ import annotations

from typing import Any

import pytest

from eventstore import CompactedError, EventStore, SessionErased, generate_keypair
from eventstore.core.reducer import fold_json

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin")]


def send(i: int, text: str = "x") -> dict[str, Any]:
    return {"type": "send", "id": f"u-{i}", "text": text}


def _rewound_thrice(store: EventStore) -> None:
    """s1 with kept lines s1~1..s1~3, a title, and x: a branch made before the rewinds
    (its parent row is now s1~1)."""
    store.append("s1", [send(i) for i in range(6)])
    store.set_info("s1", title="private title", actor="user:ada")
    store.branch("s1", at=3, new_id="x")
    store.rewind("s1", to=4)
    store.append("s1", [send(10)])
    store.rewind("s1", to=2)
    store.rewind("s1", to=1)
    store.append("other", [send(0)])
    store.set_info("other", title="not erased")


@pytest.mark.parametrize("target", ["s1", "s1~1", "s1~2", "s1~3"])
def test_erasing_any_line_erases_the_whole_conversation(store: EventStore, target: str) -> None:
    _rewound_thrice(store)
    assert [line.id for line in store.lines("s1")] == ["s1~1", "s1~2", "s1~3"]
    erased = store.erase(target, reason="user request", actor="admin:kim")
    # The lines share their events: none of them can stay, nor a branch reading them.
    assert set(erased) == {"s1", "s1~1", "s1~2", "s1~3", "x"}
    for gone in erased:
        with pytest.raises(SessionErased):
            store.load(gone)
        with pytest.raises(SessionErased):
            list(store.history(gone))
    with pytest.raises(SessionErased):
        store.lines("s1")
    assert [s.id for s in store.sessions()] == ["other"]
    assert [s.id for s in store.list_sessions(include_lines=True).items] == ["other"]
    report = store.verify()
    assert report.ok, report.problems
    assert {n.session for n in report.notices if n.kind == "erased"} == set(erased)
    # The title was user text: its record went with the sessions.
    assert [(c.session, c.changes) for c in report.info_changes] == [("other", {"title": "not erased"})]
    with pytest.raises(SessionErased):
        store.info_changes("s1")


def test_compacting_a_kept_line_below_the_rewind_keeps_what_the_session_reads(store: EventStore) -> None:
    actions = [send(i) for i in range(12)]
    store.append("s1", actions)
    store.rewind("s1", to=8)
    store.append("s1", [send(20)])
    session_history = [e.to_json() for e in store.history("s1")]
    kept_state = store.load("s1~1").to_json()
    # The kept line's events up to 8 are the session's too: compaction keeps them for it.
    result = store.compact("s1~1", upto=10)
    assert result.kept_for_branches == 8
    assert [e.to_json() for e in store.history("s1")] == session_history
    assert store.load("s1").to_json() == fold_json(None, [*actions[:8], send(20)])
    assert store.load("s1~1").to_json() == kept_state
    with pytest.raises(CompactedError):
        store.load("s1~1", version=9)
    assert store.load("s1~1", version=10).to_json() == fold_json(None, actions[:10])
    assert store.verify().ok


def test_a_compacted_session_rewinds_down_to_its_baseline_not_below(store: EventStore) -> None:
    actions = [send(i) for i in range(10)]
    store.append("s1", actions)
    store.compact("s1", upto=5)
    with pytest.raises(CompactedError):
        store.rewind("s1", to=4)
    assert store.head("s1") == 10  # nothing moved
    kept = store.rewind("s1", to=5)
    assert kept == "s1~1"
    assert store.load("s1").to_json() == fold_json(None, actions[:5])
    assert [e.version for e in store.history(kept)] == [6, 7, 8, 9, 10]
    store.append("s1", [send(30)])
    assert store.load("s1").to_json() == fold_json(None, [*actions[:5], send(30)])
    assert store.verify().ok


def test_a_checkpoint_before_a_rewind_still_verifies_after_compacting_both_lines(store: EventStore) -> None:
    private, public = generate_keypair()
    store.append("s1", [send(i) for i in range(10)])
    cp = store.checkpoint(private)
    store.rewind("s1", to=6)
    store.append("s1", [send(20), send(21)])
    store.compact("s1", upto=7)
    store.compact("s1~1", upto=9)
    report = store.verify(checkpoint=cp, public_key=public)
    assert report.ok, report.problems
    assert "rewound" in {n.kind for n in report.notices}
