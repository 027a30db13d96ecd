"""Compaction without an archive (the engine's primitive, Engine.compact_baseline), on both backends.

compact() with archives is built on it in eventstore/features/compaction.py; here: the baseline
snapshot, the guarded delete, CompactedError below the cut, everything at or above the
cut unchanged, branches untouched, verify passing before and after.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from conftest import make_store
from eventstore.errors import CompactedError, SessionNotFound, VersionNotFound
from eventstore.core.reducer import fold_json
from eventstore.samples import random_actions
from eventstore import EventStore
from eventstore.engine import engine as engine_module
from eventstore.engine import transaction_steps

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin")]


def _fill(store: EventStore, n: int, seed: int, session: str = "s1") -> list[dict[str, Any]]:
    actions = random_actions(random.Random(seed), n)
    for i in range(0, n, 11):
        store.append(session, actions[i : i + 11])
    return actions


def _count_events(engine: Engine, session: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM events e JOIN sessions s ON s.pk = e.session_pk "
                    "WHERE s.id = :s"
                ),
                {"s": session},
            ).scalar_one()
        )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_loadable_version_loads_the_same_after_compaction(
    db_url: str, raw_engine: Engine, seed: int
) -> None:
    rng = random.Random(seed)
    with make_store(db_url, snapshot_every=rng.choice([4, 9, 50])) as store:
        actions = _fill(store, 80, seed)
        cut = rng.randint(1, 79)
        before = {v: store.load("s1", version=v).to_json() for v in range(81)}
        assert store.verify("s1").ok
        rec = store.compact("s1", upto=cut)
        assert (rec.baseline, rec.previous_baseline, rec.removed, rec.kept_for_branches) == (
            cut,
            0,
            cut,
            None,
        )
        assert _count_events(raw_engine, "s1") == 80 - cut
        for v in range(81):
            if v < cut:
                with pytest.raises(CompactedError) as err:
                    store.load("s1", version=v)
                assert err.value.baseline == cut and str(cut) in str(err.value)
            else:
                assert store.load("s1", version=v).to_json() == before[v] == fold_json(None, actions[:v])
        assert [e.version for e in store.history("s1")] == list(range(cut + 1, 81))
        assert store.sessions()[0].baseline == cut
        report = store.verify("s1")
        assert report.ok, report.problems
        # Appends continue the chain from the baseline; a second, later cut works too.
        more = random_actions(random.Random(seed + 100), 20)
        store.append("s1", more, expected_version=80)
        second = store.compact("s1", upto=90)
        assert second.previous_baseline == cut and second.removed == 90 - cut
        assert store.load("s1").to_json() == fold_json(None, actions + more)
        assert store.verify("s1").ok
        with pytest.raises(CompactedError):
            store.compact("s1", upto=cut)
    with EventStore(db_url) as reopened:
        assert reopened.load("s1", version=95).to_json() == fold_json(None, (actions + more)[:95])


def test_compaction_keeps_what_branches_read(db_url: str, raw_engine: Engine) -> None:
    with make_store(db_url, snapshot_every=6) as store:
        actions = _fill(store, 60, seed=7)
        store.branch("s1", at=20, new_id="early")
        store.append("early", [{"type": "retry"}, {"type": "stop"}])
        store.branch("early", at=10, new_id="grand")
        branches = {
            b: {v: store.load(b, version=v).to_json() for v in range(store.head(b) + 1)}
            for b in ("early", "grand")
        }
        rec = store.compact("s1", upto=45)
        assert rec.kept_for_branches == 20 and rec.removed == 25
        assert _count_events(raw_engine, "s1") == 60 - 25
        for b, states in branches.items():
            for v, state in states.items():
                assert store.load(b, version=v).to_json() == state, (b, v)
        assert store.verify().ok, store.verify().problems
        # The parent itself cannot load below its baseline even where events remain.
        with pytest.raises(CompactedError):
            store.load("s1", version=10)
        # A branch made after the compaction starts at the baseline too.
        late = store.branch("s1", at=50, new_id="late")
        assert store.load(late).to_json() == fold_json(None, actions[:50])
        assert store.load(late, version=45).to_json() == fold_json(None, actions[:45])
        with pytest.raises(CompactedError):
            store.load(late, version=44)
        with pytest.raises(CompactedError):
            store.branch("s1", at=44)
        store.append(late, [{"type": "reset"}])
        assert store.verify(late).ok


def test_compacting_a_branch(db_url: str) -> None:
    with make_store(db_url, snapshot_every=5) as store:
        actions = _fill(store, 30, seed=8)
        store.branch("s1", at=12, new_id="b")
        extra = random_actions(random.Random(9), 25)
        store.append("b", extra)
        line = actions[:12] + extra
        store.compact("b", upto=8)  # below the fork: only the baseline moves
        assert store.load("b", version=8).to_json() == fold_json(None, line[:8])
        store.compact("b", upto=30)
        for v in range(30, 38):
            assert store.load("b", version=v).to_json() == fold_json(None, line[:v])
        assert store.load("s1").to_json() == fold_json(None, actions)  # parent untouched
        assert store.verify().ok, store.verify().problems


def test_compaction_arguments_and_the_guard_afterwards(
    store: EventStore, raw_engine: Engine
) -> None:
    _fill(store, 20, seed=10)
    with pytest.raises(SessionNotFound):
        store.compact("missing", upto=1)
    with pytest.raises(VersionNotFound):
        store.compact("s1", upto=21)
    assert store.compact("s1", upto=0).removed == 0
    store.compact("s1", upto=10)
    assert store.compact("s1", upto=10).removed == 0
    # No permit outlives the compaction: raw deletes are refused again.
    with raw_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM compaction_permits")).scalar_one() == 0
    with pytest.raises(DBAPIError, match="immutable"):
        with raw_engine.begin() as conn:
            conn.execute(text("DELETE FROM events"))
    assert _count_events(raw_engine, "s1") == 10


def test_a_branch_forked_below_a_later_baseline_never_gets_that_snapshot(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with make_store(db_url, snapshot_every=1000) as store:
        actions = _fill(store, 60, seed=12)
        store.branch("s1", at=20, new_id="b")
        own = random_actions(random.Random(13), 50)
        store.append("b", own)
        store.branch("b", at=15, new_id="c")  # below b's fork: inherits s1 directly
        store.append("c", own[:40])
        store.compact("s1", upto=45)
        store.compact("b", upto=50)  # a baseline of b inside b's own events
        # Even with every regular snapshot stale, baselines are served only where they apply.
        for module in (engine_module, transaction_steps):
            monkeypatch.setattr(module, "REDUCER_VERSION", engine_module.REDUCER_VERSION + 1)
        b_line = actions[:20] + own
        for v in range(50, 71):
            assert store.load("b", version=v).to_json() == fold_json(None, b_line[:v]), v
        c_line = actions[:15] + own[:40]
        for v in range(0, 56):
            assert store.load("c", version=v).to_json() == fold_json(None, c_line[:v]), v
        assert store.load("s1").to_json() == fold_json(None, actions)
        assert store.verify().ok
