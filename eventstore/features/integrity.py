"""The integrity check behind ``verify``: the hash chain recomputed, every snapshot refolded.

Also checked: turn numbers, the baseline snapshot of a compacted session against its
compaction record (the record keeps the digest of the baseline state and the hash at the
baseline), event rows below the baseline against the hashes the compaction recorded, and,
given a signed checkpoint, that the database still extends it
(:func:`eventstore.core.checkpoints.check_checkpoint`). One session that cannot be checked is a
finding about that session; it never stops the others.

:func:`verify` takes an :class:`~eventstore.engine.engine.Engine` and reads rows;
:class:`ChainCheck` is the pure half (rows in, :class:`~eventstore.core.records.Problem` records
out), so an async store reuses it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from eventstore.core.appends import State, segments
from eventstore.core.catalogue import info_drift, info_record_of
from eventstore.core.chain import ChainWalk
from eventstore.core.checkpoints import Checkpoint, CurrentSession, ErasedSession, RewoundSession, check_checkpoint
from eventstore.core.codec import decode_native, decode_payload, state_digest
from eventstore.core.records import Problem, VerifyReport, to_datetime
from eventstore.core.reducer import REDUCER_VERSION, fold_json
from eventstore.core.rows import (
    ZERO_HASH,
    CompactionRow,
    EventRow,
    RewindRow,
    Segment,
    SessionRow,
    SnapshotRow,
    TombstoneRow,
)
from eventstore.engine import catalogue
from eventstore.engine.engine import Engine, Tx
from eventstore.engine.reads import HISTORY_CHUNK
from eventstore.features.audit import baseline_digest
from eventstore.errors import CheckpointError, SegmentCorrupt, SessionErased

__all__ = ["ChainCheck", "verify", "hash_in_lineage"]


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
        if row.baseline:
            self.chain = ChainWalk(row.baseline, row.baseline_hash or ZERO_HASH, row.baseline_turn)
        else:
            self.chain = ChainWalk(0, ZERO_HASH, 0)
        self._pending: list[dict[str, Any]] = []

    def problem(self, version: int, kind: str, message: str) -> None:
        """Record a finding about this session."""
        self.problems.append(Problem(self.row.id, version, kind, message))

    def event(self, e: EventRow) -> SnapshotRow | None:
        """Check the next event; returns the snapshot due at it, if any (the caller decodes
        it and passes the state to :meth:`snapshot`)."""
        who = self.names[e.session_pk]
        where = f"session {who!r} version {e.version}"
        if who != self.row.id:
            where += f" (inherited by {self.row.id!r})"
        link = self.chain.step(who, e)
        if link.gap:
            self.problem(
                e.version, "missing-events", f"{where}: versions {link.expected_version}..{e.version - 1} are missing"
            )
        if not link.hash_ok:
            self.problem(e.version, "hash-mismatch", f"{where}: hash mismatch (the event or its chain was altered)")
        if not link.turn_ok:
            self.problem(e.version, "turn-mismatch", f"{where}: turn {e.turn}, expected {link.expected_turn}")
        self.events += 1
        try:
            self._pending.append(decode_payload(e.payload))
        except Exception:  # noqa: BLE001 - a corrupt payload is a finding
            self.problem(e.version, "bad-payload", f"{where}: payload is not valid JSON")
            self._pending.append({"type": "stop"})
        if e.native is not None:
            try:
                decode_native(e.native)
            except Exception:  # noqa: BLE001 - corrupt native data is a finding
                self.problem(e.version, "bad-native", f"{where}: native data is not valid JSON")
        return self.snapshots.get(e.version)

    def snapshot(self, snap: SnapshotRow, stored: State) -> None:
        """Compare a snapshot's stored state with the fold of the events up to it."""
        self.state = fold_json(self.state, self._pending)
        self._pending = []
        self.checked_snapshots += 1
        if stored != self.state:
            self.problem(
                snap.version,
                "snapshot-mismatch",
                f"session {self.names[snap.session_pk]!r} version {snap.version}: "
                "snapshot differs from the fold of its events",
            )

    def finish(self, beyond: EventRow | None) -> None:
        """The checks after the last event: nothing missing up to the head, the head hash
        matches the chain, and no row was forged past the head (``beyond``)."""
        row, chain = self.row, self.chain
        expected = chain.version + 1
        if expected != row.head + 1:
            self.problem(
                expected,
                "missing-events",
                f"session {row.id!r} version {expected}: events {expected}..{row.head} are missing",
            )
        elif row.head > row.baseline and chain.hash != row.head_hash:
            self.problem(
                row.head, "head-hash", f"session {row.id!r} version {row.head}: head hash does not match the chain"
            )
        elif row.head_turn != chain.turn:
            self.problem(
                row.head,
                "head-turn",
                f"session {row.id!r} version {row.head}: the session's head turn is {row.head_turn}, "
                f"its events say {chain.turn}",
            )
        if beyond is not None:
            self.problem(
                beyond.version,
                "beyond-head",
                f"session {row.id!r} version {beyond.version}: event rows beyond the head "
                f"({row.head}) were written behind the library's back",
            )


def verify(
    engine: Engine,
    session: Any = None,
    *,
    checkpoint: Any = None,
    public_key: Any = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> VerifyReport:
    """Check integrity: the hash chain, turns, and that snapshots equal the fold of their events.

    For each session, the chain is recomputed over its whole lineage (the inherited prefix
    included; from the baseline hash after a compaction), versions must be contiguous up
    to the head, turn numbers must count the ``send`` events, every snapshot made by this
    reducer version must equal the fold of the events it stands for, and a baseline must
    match its compaction record. A session that cannot be read is reported (kind
    ``unreadable``) and the others are still checked.

    With a ``checkpoint``, the database must also still extend it (see
    :func:`eventstore.core.checkpoints.check_checkpoint`): an anchored event changed, removed,
    reordered or re-created, a vanished session or a bad signature is a problem naming the
    session; an erasure through the API is a notice.

    The report also lists every recorded ``set_info`` of the sessions checked (who, when,
    what): a session's title, owner and metadata are kept outside its hash chain, and
    this is their record.

    Args:
        engine: the engine.
        session: one session; ``None`` checks every session.
        checkpoint: a :class:`~eventstore.core.checkpoints.Checkpoint` to verify against.
        public_key: the Ed25519 public key (PEM bytes) it must be signed with; required
            with ``checkpoint``.
        progress: called as ``progress(done, total, session)`` after each session.

    Returns:
        A :class:`VerifyReport` over every session checked.

    Raises:
        InvalidEvent: an argument is malformed.
        CheckpointError: ``checkpoint`` is not a Checkpoint, or the key is missing or unusable.
        SessionNotFound: ``session`` does not exist.
    """
    engine.validate.progress(progress)
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise CheckpointError(f"checkpoint must be a Checkpoint, not {type(checkpoint).__name__}")
    if (checkpoint is None) != (public_key is None):
        raise CheckpointError("verifying against a checkpoint needs both checkpoint= and public_key=")
    notices: list[Problem] = []
    if session is None:
        rows = engine.session_rows()
        with engine.reading() as tx:
            marks = engine.tombstones(tx)
        notices += [_erased(m) for m in marks]
    else:
        try:
            rows = [engine.session_row(session)]
        except SessionErased:
            with engine.reading() as tx:
                mark = engine.tombstone(tx, session)
            assert mark is not None
            rows, notices = [], [_erased(mark)]
    with engine.reading() as tx:
        rewinds = engine.rewinds(tx)
        changes = catalogue.all_info_changes(engine, tx) if session is None else []
        info_problems = _info_drift(tx, rows, rewinds, every=session is None)
    if session is not None and rows:
        changes = catalogue.info_changes(engine, session)
    notices += [_rewound(r) for r in rewinds if session is None or session in (r.session_id, r.kept_id)]
    problems: list[Problem] = []
    n_events = n_snaps = 0
    for i, row in enumerate(rows, 1):
        try:
            check = _check_one(engine, row)
        except Exception as exc:  # noqa: BLE001 - one unreadable session is a finding, never the end of the audit
            problems.append(Problem(row.id, row.head, "unreadable", f"session {row.id!r}: cannot be checked: {exc}"))
        else:
            problems += check.problems
            n_events += check.events
            n_snaps += check.checked_snapshots
        if progress is not None:
            progress(i, len(rows), row.id)
    problems += info_problems
    if checkpoint is not None:
        for p in _against_checkpoint(engine, checkpoint, public_key):
            # Findings about the checkpoint as a whole (a bad signature) have no session:
            # they hold whichever session is asked about.
            if session is None or p.session in ("", session):
                (notices if p.kind in ("erased", "rewound") else problems).append(p)
        notices = list({(n.session, n.kind): n for n in notices}.values())
    return VerifyReport(
        ok=not problems,
        problems=problems,
        sessions=[r.id for r in rows],
        events=n_events,
        snapshots=n_snaps,
        notices=notices,
        checkpoint=None if checkpoint is None else checkpoint.created_at.isoformat(),
        info_changes=changes,
    )


def _info_drift(tx: Tx, rows: list[SessionRow], rewinds: list[RewindRow], *, every: bool) -> list[Problem]:
    """An ``info-edited`` problem for each row whose title, owner or metadata column is not
    what its recorded ``set_info`` calls leave (see :func:`eventstore.core.catalogue.info_drift`)."""
    if not rows:
        return []
    pks = None if every else [*(r.pk for r in rows), *(r.kept_pk for r in rewinds)]
    records: dict[int, list[tuple[int, str]]] = {}
    for pk, at, _actor, what in catalogue.info_records(tx, pks):
        records.setdefault(pk, []).append((at, what))
    found = catalogue.rows_by_pk(tx, [r.pk for r in rows])
    out = []
    for r in rows:
        cat = found.get(r.pk)
        if cat is None:
            continue
        drift = info_drift(cat, info_record_of(r.pk, records, rewinds))
        if drift:
            out.append(
                Problem(
                    r.id,
                    r.head,
                    "info-edited",
                    f"session {r.id!r}: its {', '.join(drift)} column{'s' if len(drift) > 1 else ''} "
                    "differ from what its recorded set_info calls set (edited behind the library's back)",
                )
            )
    return out


def _erased(mark: TombstoneRow) -> Problem:
    by = f" by {mark.actor!r}" if mark.actor else ""
    via = f" (a branch of {mark.erased_with!r}, erased with it)" if mark.erased_with else ""
    return Problem(
        mark.session_id,
        mark.head,
        "erased",
        f"session {mark.session_id!r} was erased{by} at {to_datetime(mark.erased_at).isoformat()}{via}: {mark.reason}",
    )


def _rewound(r: RewindRow) -> Problem:
    by = f" by {r.actor!r}" if r.actor else ""
    why = f": {r.reason}" if r.reason else ""
    return Problem(
        r.session_id,
        r.to_version,
        "rewound",
        f"session {r.session_id!r} was rewound{by} at {to_datetime(r.rewound_at).isoformat()} from version "
        f"{r.from_head} to {r.to_version}{why}; the versions after it are kept as {r.kept_id!r}",
    )


def _against_checkpoint(engine: Engine, checkpoint: Checkpoint, public_key: Any) -> list[Problem]:
    """The checkpoint's findings as problems (version: the anchored head, 0 for the whole)."""
    heads: list[CurrentSession | ErasedSession | RewoundSession] = []
    with engine.reading() as tx:
        rows = {r.id: r for r in engine.all_rows(tx)}
        marks = {m.session_id: m for m in engine.tombstones(tx)}
        rewinds = engine.rewinds(tx)
        lineages: dict[int, list[SessionRow]] = {}

        def held(row: SessionRow, version: int) -> bytes | None:
            lineage = lineages.setdefault(row.pk, engine.lineage(tx, row))
            return hash_in_lineage(engine, tx, lineage, version) if version <= row.head else None

        for anchored in checkpoint.sessions:
            row = rows.get(anchored.id)
            if row is not None:
                at = held(row, anchored.head)
                rewound = None if at == anchored.head_hash else _kept_anchor(
                    rows, rewinds, anchored.id, anchored.head, anchored.head_hash, held
                )
                if rewound is not None:
                    r, kept_at = rewound
                    heads.append(
                        RewoundSession(
                            row.id, row.head, r.kept_id, r.to_version, kept_at,
                            to_datetime(r.rewound_at), r.actor, r.reason,
                        )
                    )
                    continue
                digest = None
                if anchored.baseline_digest is not None:
                    try:
                        digest = baseline_digest(engine, tx, row)
                    except Exception:  # noqa: BLE001 - an unreadable baseline does not match the anchor
                        digest = None
                heads.append(
                    CurrentSession(row.id, row.head, row.head_hash, row.baseline, row.baseline_hash, at, digest)
                )
            elif anchored.id in marks:
                m = marks[anchored.id]
                heads.append(ErasedSession(m.session_id, m.head, m.head_hash, to_datetime(m.erased_at), m.actor, m.reason))
    found = check_checkpoint(checkpoint, public_key, heads)
    return [
        Problem(
            p.session or "",
            a.head if p.session and (a := checkpoint.session(p.session)) is not None else 0,
            p.kind,
            p.message,
        )
        for p in found
    ]


def _kept_anchor(
    rows: Mapping[str, SessionRow],
    rewinds: list[RewindRow],
    session: str,
    version: int,
    anchored: bytes,
    held: Callable[[SessionRow, int], bytes | None],
) -> tuple[RewindRow, bytes | None] | None:
    """A rewind of ``session`` that moved ``version`` into its kept line, with the hash
    that line holds there: one whose line holds ``anchored`` if any (a version can be
    moved more than once, each time to another line), else the newest; ``None`` when no
    rewind moved it."""
    found: tuple[RewindRow, bytes | None] | None = None
    for r in reversed(rewinds):
        if r.session_id == session and r.to_version < version <= r.from_head:
            kept = rows.get(r.kept_id)
            h = None if kept is None or kept.pk != r.kept_pk else held(kept, version)
            if h == anchored:
                return r, h
            found = found or (r, h)
    return found


def hash_in_lineage(engine: Engine, tx: Tx, lineage: list[SessionRow], version: int) -> bytes | None:
    """The chain hash the database holds now at ``version`` of the lineage's last session:
    the event row's, or the one a compaction recorded for it."""
    if version == 0:
        return ZERO_HASH
    for seg in segments(lineage, version):
        if seg.after < version <= seg.upto:
            return engine.recorded_hash(tx, seg.session_pk, version)
    return None


def _baseline_record(engine: Engine, tx: Tx, lineage: list[SessionRow]) -> list[CompactionRow]:
    """The compaction records of the lineage's sessions at the last session's baseline."""
    row = lineage[-1]
    return [
        rec for r in reversed(lineage) for rec in engine.compactions(tx, r.pk) if rec.upto == row.baseline
    ]


def _check_baseline(engine: Engine, tx: Tx, lineage: list[SessionRow], state: State, check: ChainCheck) -> None:
    """The baseline state and hash against the compaction that made them."""
    row = lineage[-1]
    where = f"session {row.id!r} version {row.baseline}"
    recs = _baseline_record(engine, tx, lineage)
    if not recs:
        check.problem(
            row.baseline,
            "unrecorded-baseline",
            f"{where}: the baseline has no compaction record (compacted before revision 0002, "
            "or written behind the library's back); its snapshot cannot be checked",
        )
        return
    if not any(r.baseline_hash == row.baseline_hash and r.baseline_turn == row.baseline_turn for r in recs):
        check.problem(
            row.baseline,
            "baseline-mismatch",
            f"{where}: the session's baseline hash or turn is not the one its compaction recorded",
        )
    if not any(r.state_digest == state_digest(state) for r in recs):
        check.problem(
            row.baseline,
            "baseline-mismatch",
            f"{where}: the baseline snapshot is not the state its compaction recorded (it was rewritten)",
        )


def _check_below_baseline(engine: Engine, tx: Tx, row: SessionRow, check: ChainCheck) -> None:
    """Event rows a compaction left below the baseline (those branches read) must be the
    ones it recorded; any other row there was forged."""
    fork = row.fork_version or 0
    if row.baseline <= fork:
        return
    recs = engine.compactions(tx, row.pk)
    if not recs:
        return  # reported as an unrecorded baseline
    lo = fork
    while lo < row.baseline:
        events = engine.events(tx, row.pk, after=lo, upto=row.baseline, limit=HISTORY_CHUNK)
        if not events:
            break
        for e in events:
            if not any(r.hash_at(e.version) == e.hash for r in recs):
                check.problem(
                    e.version,
                    "below-baseline",
                    f"session {row.id!r} version {e.version}: an event row below the baseline "
                    f"({row.baseline}) that no compaction recorded was written behind the library's back",
                )
        lo = events[-1].version


def _check_one(engine: Engine, row: SessionRow) -> ChainCheck:
    try:
        with engine.reading() as tx:
            lineage = engine.lineage(tx, row)
            segs = segments(lineage, row.head)
            start = row.baseline
            # Snapshots this session can be served, by version (baselines stand for deleted
            # events and cannot be checked against them).
            snaps: dict[int, SnapshotRow] = {}
            for seg in segs:
                for s in engine.stored_snapshots(tx, Segment(seg.session_pk, max(seg.after, start), seg.upto)):
                    if s.reducer_version == REDUCER_VERSION:
                        snaps[s.version] = s
            base_state = engine.state_at(tx, row, start) if start else None
            check = ChainCheck(row, engine.event_names(tx, lineage), base_state, snaps)
            if base_state is not None:
                _check_baseline(engine, tx, lineage, base_state, check)
                _check_below_baseline(engine, tx, row, check)
            for seg in segs:
                lo = max(seg.after, start)
                while lo < seg.upto:
                    events = engine.events(tx, seg.session_pk, after=lo, upto=seg.upto, limit=HISTORY_CHUNK)
                    if not events:
                        break
                    for e in events:
                        snap = check.event(e)
                        if snap is not None:
                            check.snapshot(snap, engine.decode_snapshot(tx, snap))
                    lo = events[-1].version
            # INSERT is allowed to the application, so rows can be forged past the head too;
            # they are outside the chain walked above and would block the next append.
            beyond = engine.events(tx, row.pk, after=row.head, limit=1)
            check.finish(beyond[0] if beyond else None)
            for version, held, named in engine.sealed_id_mismatches(tx, row.pk):
                check.problem(
                    version,
                    "sealed-id",
                    f"session {row.id!r} version {version}: sealed_event_ids names "
                    f"{'no id' if named is None else repr(named)} but the sealed event there has "
                    f"{'none' if held is None else repr(held)}: the table was edited behind "
                    "the library's back (a retried append of this event would not be found)",
                )
    except SegmentCorrupt as exc:
        # A sealed segment that does not decode to its events: the session's reads fail.
        check = ChainCheck(row, {row.pk: row.id}, None, {})
        check.problem(int(exc.context.get("version", row.head)), "sealed-segment", exc.message)
    return check
