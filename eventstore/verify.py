"""Verify: recompute the hash chain and check every snapshot against the fold of its events.

:func:`verify` takes an :class:`~eventstore.engine.Engine` and reads rows;
:class:`ChainCheck` is the pure half (rows in, :class:`~eventstore.records.Problem` records
out), so an async store reuses it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .codec import decode_payload, recorded_hash
from .engine import HISTORY_CHUNK, Engine
from .planning import State, segments
from .records import Problem, VerifyReport
from .reducer import REDUCER_VERSION, fold_json
from .storage.base import ZERO_HASH, EventRow, SessionRow, SnapshotRow
from .validate import MAX_VERSION

__all__ = ["ChainCheck", "verify"]


class ChainCheck:
    """The checks of one session's lineage, fed its events in version order.

    Args:
        row: the session checked.
        names: session id by pk, for every session of its lineage.
        state: the state at the session's baseline (``None``: never compacted).
        snapshots: the snapshots it can be served, by version.
    """

    def __init__(
        self,
        row: SessionRow,
        names: Mapping[int, str],
        state: State | None,
        snapshots: Mapping[int, SnapshotRow],
    ) -> None:
        self.row = row
        self.names = names
        self.state = state
        self.snapshots = snapshots
        self.problems: list[Problem] = []
        self.events = 0
        self.checked_snapshots = 0
        self.expected = row.baseline + 1
        self.prev = (row.baseline_hash or ZERO_HASH) if row.baseline else ZERO_HASH
        self._pending: list[dict[str, Any]] = []

    def _problem(self, version: int, kind: str, message: str) -> None:
        self.problems.append(Problem(self.row.id, version, kind, message))

    def event(self, e: EventRow) -> SnapshotRow | None:
        """Check the next event; returns the snapshot due at it, if any (the caller decodes
        it and passes the state to :meth:`snapshot`)."""
        who = self.names[e.session_pk]
        where = f"session {who!r} version {e.version}"
        if who != self.row.id:
            where += f" (inherited by {self.row.id!r})"
        if e.version != self.expected:
            self._problem(
                e.version, "missing-events", f"{where}: versions {self.expected}..{e.version - 1} are missing"
            )
        self.expected = e.version + 1
        if recorded_hash(self.prev, who, e) != e.hash:
            self._problem(e.version, "hash-mismatch", f"{where}: hash mismatch (the event or its chain was altered)")
        self.prev = e.hash
        self.events += 1
        try:
            self._pending.append(decode_payload(e.payload))
        except Exception:  # noqa: BLE001 - a corrupt payload is a finding
            self._problem(e.version, "bad-payload", f"{where}: payload is not valid JSON")
            self._pending.append({"type": "stop"})
        return self.snapshots.get(e.version)

    def snapshot(self, snap: SnapshotRow, stored: State) -> None:
        """Compare a snapshot's stored state with the fold of the events up to it."""
        self.state = fold_json(self.state, self._pending)
        self._pending = []
        self.checked_snapshots += 1
        if stored != self.state:
            self._problem(
                snap.version,
                "snapshot-mismatch",
                f"session {self.names[snap.session_pk]!r} version {snap.version}: "
                "snapshot differs from the fold of its events",
            )

    def finish(self, beyond: EventRow | None) -> None:
        """The checks after the last event: nothing missing up to the head, the head hash
        matches the chain, and no row was forged past the head (``beyond``)."""
        row = self.row
        if self.expected != row.head + 1:
            self._problem(
                self.expected,
                "missing-events",
                f"session {row.id!r} version {self.expected}: events {self.expected}..{row.head} are missing",
            )
        elif row.head > row.baseline and self.prev != row.head_hash:
            self._problem(
                row.head, "head-hash", f"session {row.id!r} version {row.head}: head hash does not match the chain"
            )
        if beyond is not None:
            self._problem(
                beyond.version,
                "beyond-head",
                f"session {row.id!r} version {beyond.version}: event rows beyond the head "
                f"({row.head}) were written behind the library's back",
            )


def verify(
    engine: Engine, session: Any = None, *, progress: Callable[[int, int, str], None] | None = None
) -> VerifyReport:
    """Check integrity: the hash chain and that snapshots equal the fold of their events.

    For each session, the chain is recomputed over its whole lineage (the inherited prefix
    included; from the baseline hash after a compaction), versions must be contiguous up
    to the head, and every snapshot made by this reducer version must equal the fold of
    the events it stands for.

    Args:
        engine: the engine.
        session: one session; ``None`` checks every session.
        progress: called as ``progress(done, total, session)`` after each session.

    Returns:
        A :class:`VerifyReport` over every session checked.

    Raises:
        InvalidEvent: an argument is malformed.
        SessionNotFound: ``session`` does not exist.
    """
    engine.validate.progress(progress)
    rows = engine.session_rows() if session is None else [engine.session_row(session)]
    problems: list[Problem] = []
    n_events = n_snaps = 0
    for i, row in enumerate(rows, 1):
        check = _check_one(engine, row)
        problems += check.problems
        n_events += check.events
        n_snaps += check.checked_snapshots
        if progress is not None:
            progress(i, len(rows), row.id)
    return VerifyReport(
        ok=not problems, problems=problems, sessions=[r.id for r in rows], events=n_events, snapshots=n_snaps
    )


def _check_one(engine: Engine, row: SessionRow) -> ChainCheck:
    st = engine.storage
    with st.read() as tx:
        lineage = engine.lineage(tx, row)
        segs = segments(lineage, row.head)
        start = row.baseline
        # Snapshots this session can be served, by version (baselines stand for deleted
        # events and cannot be checked against them).
        snaps: dict[int, SnapshotRow] = {}
        for seg in segs:
            for s in st.list_snapshots(tx, seg.session_pk, after=max(seg.after, start), upto=seg.upto):
                if s.reducer_version == REDUCER_VERSION:
                    snaps[s.version] = s
        check = ChainCheck(
            row, {r.pk: r.id for r in lineage}, engine.state_at(tx, row, start) if start else None, snaps
        )
        for seg in segs:
            lo = max(seg.after, start)
            while lo < seg.upto:
                events = st.read_events(tx, seg.session_pk, after=lo, upto=seg.upto, limit=HISTORY_CHUNK)
                if not events:
                    break
                for e in events:
                    snap = check.event(e)
                    if snap is not None:
                        check.snapshot(snap, engine.decode_snapshot(tx, snap))
                lo = events[-1].version
        # INSERT is allowed to the application, so rows can be forged past the head too;
        # they are outside the chain walked above and would block the next append.
        beyond = st.read_events(tx, row.pk, after=row.head, upto=MAX_VERSION, limit=1)
        check.finish(beyond[0] if beyond else None)
    return check
