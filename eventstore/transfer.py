"""Export and import: a session as lossless JSON Lines, and back, verbatim.

Every function takes an :class:`~eventstore.engine.Engine`. The file format (header,
session lines, event lines) is described in ``docs/format.md``, section "Export files".

Export format (JSON Lines, UTF-8), one object per line::

    {"format": "eventstore-export", "format_version": 1, "session": "s1-alt",
     "sessions": ["s1", "s1-alt"]}                                  # header
    {"kind": "session", "id": "s1", "parent": null, ...}            # each session of the
    {"kind": "event", "session": "s1", "version": 1, ...}           # lineage, root first,
    ...                                                             # then its own events
    {"kind": "session", "id": "s1-alt", "parent": "s1", "fork_version": 3, ...}
    {"kind": "event", "session": "s1-alt", "version": 4, ...}

A branch's file carries every session it descends from, so it can be imported into an
empty database. Timestamps are integers (microseconds since the epoch, UTC) next to an
ISO 8601 copy; hashes are hex. Import recomputes each event's hash from its content
and the previous hash and refuses the whole file on the first mismatch.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import orjson

from .codec import canonical, recorded_hash
from .engine import Engine
from .errors import CompactedError, InvalidEvent, SessionExists, SessionNotFound
from .files import text_out
from .ids import check_new_session_id
from .models import parse_action
from .planning import snapshot_boundaries
from .records import to_datetime
from .text import iso
from .reducer import fold_json
from .storage.base import ZERO_HASH, EventRow, NewSession, SessionRow

__all__ = ["EXPORT_FORMAT", "EXPORT_FORMAT_VERSION", "ImportResult", "export", "import_"]

EXPORT_FORMAT = "eventstore-export"
EXPORT_FORMAT_VERSION = 1

JSON = dict[str, Any]
Progress = Callable[[int, int], None]


@functools.lru_cache(maxsize=1024)
def _iso(micros: int) -> str:
    # Cached: a batch's events share one timestamp, so most calls are repeats.
    return iso(to_datetime(micros))


def _fork_point(engine: Engine, tx: Any, row: SessionRow) -> tuple[bytes, int]:
    """The hash and turn a branch's first own event chains from (zero for a root)."""
    if row.parent_pk is None or not row.fork_version:
        return ZERO_HASH, 0
    parent = engine.storage.get_session_by_pk(tx, row.parent_pk)
    return engine.hash_turn_at(tx, parent, row.fork_version)


def _hash_at(engine: Engine, tx: Any, row: SessionRow, version: int) -> bytes | None:
    """The chain hash at ``version`` of ``row``'s lineage, or ``None`` when it is gone."""
    try:
        return engine.hash_turn_at(tx, row, version)[0]
    except CompactedError:
        return None


def export(
    engine: Engine,
    session: Any,
    out: str | os.PathLike[str] | IO[str],
    *,
    progress: Progress | None = None,
) -> int:
    """Write a session (and the sessions it descends from) as JSON Lines.

    Args:
        engine: the engine.
        session: the session to export.
        out: a text file object, or a path (written to ``PATH.part`` and renamed when
            complete, so a crash never leaves a truncated export under the name).
        progress: called as ``progress(events_written, total_events)``.

    Returns:
        The number of event lines written.

    Raises:
        InvalidEvent: an argument is malformed.
        SessionNotFound: no such session.
    """
    engine.validate.progress(progress)
    storage = engine.storage
    with storage.read() as tx:
        row = engine.row(tx, session)
        chain = engine.lineage(tx, row)
        blocks: list[tuple[JSON, list[EventRow]]] = []
        for r in chain:
            fork_hash, fork_turn = _fork_point(engine, tx, r)
            parent = storage.get_session_by_pk(tx, r.parent_pk).id if r.parent_pk else None
            evs = storage.read_events(tx, r.pk, after=r.fork_version or 0, upto=r.head)
            head: JSON = {
                "kind": "session",
                "id": r.id,
                "parent": parent,
                "fork_version": r.fork_version,
                "fork_hash": fork_hash.hex(),
                "fork_turn": fork_turn,
                "head": r.head,
                "head_hash": r.head_hash.hex(),
                "head_turn": r.head_turn,
                "baseline": r.baseline,
                "baseline_hash": r.baseline_hash.hex() if r.baseline_hash else None,
                "baseline_turn": r.baseline_turn,
                "baseline_state": None,
                "created_at": r.created_at,
                "created_at_iso": _iso(r.created_at),
                "events": len(evs),
            }
            blocks.append((head, evs))
    for r, (head, _) in zip(chain, blocks):
        if r.baseline:
            head["baseline_state"] = engine.load(r.id, r.baseline)
    total = sum(len(evs) for _, evs in blocks)
    with text_out(out) as fh:
        return _write(fh, session, chain, blocks, total, progress)


def _write(
    out: IO[str],
    session: str,
    chain: list[SessionRow],
    blocks: list[tuple[JSON, list[EventRow]]],
    total: int,
    progress: Progress | None,
) -> int:
    def dumps(obj: Any) -> bytes:
        # Sorted keys: the same session exports to the same bytes from any backend.
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)

    out.write(
        dumps(
            {
                "format": EXPORT_FORMAT,
                "format_version": EXPORT_FORMAT_VERSION,
                "session": session,
                "sessions": [r.id for r in chain],
                "events": total,
            }
        ).decode()
        + "\n"
    )
    written = 0
    for r, (head, evs) in zip(chain, blocks):
        out.write(dumps(head).decode() + "\n")
        lines = []
        for e in evs:
            lines.append(
                dumps(
                    {
                        "kind": "event",
                        "session": r.id,
                        "version": e.version,
                        "event_id": e.event_id,
                        "type": e.type,
                        "turn": e.turn,
                        "action": orjson.Fragment(e.payload),
                        "recorded_at": e.recorded_at,
                        "recorded_at_iso": _iso(e.recorded_at),
                        "actor": e.actor,
                        "metadata": orjson.Fragment(e.metadata) if e.metadata is not None else None,
                        "hash": e.hash.hex(),
                    }
                ).decode()
            )
            written += 1
            if len(lines) >= 1000:
                out.write("\n".join(lines) + "\n")
                lines = []
                if progress is not None:
                    progress(written, total)
        if lines:
            out.write("\n".join(lines) + "\n")
    if progress is not None:
        progress(written, total)
    return written


@dataclass(frozen=True)
class ImportResult:
    """What :func:`import_` did with one session of the file.

    Attributes:
        session: the session id.
        status: ``"created"``; ``"extended"`` (it existed with a prefix of this history and
            got the rest); ``"restored"`` (it had been compacted, and the file — its archive
            — put the removed events back and lowered the baseline); or ``"present"`` (it
            already held all of it; nothing written).
        events: events written.
        head: the session's head after the import.
    """

    session: str
    status: str
    events: int
    head: int

    def to_json(self) -> JSON:
        return {"session": self.session, "status": self.status, "events": self.events, "head": self.head}


@dataclass
class _Block:
    meta: JSON
    events: list[EventRow]  # session_pk is filled in at write time
    line: int


def _bad(line: int, reason: str, field: str | None = None) -> InvalidEvent:
    return InvalidEvent(f"import line {line}: {reason}", field=field)


def _hex(value: Any, line: int, name: str) -> bytes:
    try:
        out = bytes.fromhex(value)
    except (TypeError, ValueError):
        raise _bad(line, f"{name} is not a hex string", name) from None
    if len(out) != 32:
        raise _bad(line, f"{name} is not a SHA-256 digest", name)
    return out


def _int(obj: Mapping[str, Any], key: str, line: int, *, optional: bool = False) -> Any:
    v = obj.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise _bad(line, f"{key} must be a non-negative integer", key)
    return v


def _parse(lines: Iterable[str]) -> list[_Block]:
    """The session blocks of an export file (its header line checked and dropped)."""
    header: JSON | None = None
    blocks: list[_Block] = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise _bad(n, f"not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise _bad(n, "not a JSON object")
        if header is None:
            if obj.get("format") != EXPORT_FORMAT:
                raise _bad(n, "not an eventstore export (the first line has no 'format' header)")
            if obj.get("format_version") != EXPORT_FORMAT_VERSION:
                raise _bad(n, f"unsupported export format version {obj.get('format_version')!r}")
            header = obj
            continue
        kind = obj.get("kind")
        if kind == "session":
            if not isinstance(obj.get("id"), str) or not obj["id"]:
                raise _bad(n, "session id must be a non-empty string", "id")
            for k in ("head", "head_turn", "baseline", "baseline_turn", "created_at", "fork_turn"):
                _int(obj, k, n)
            _int(obj, "fork_version", n, optional=True)
            blocks.append(_Block(obj, [], n))
        elif kind == "event":
            if not blocks or obj.get("session") != blocks[-1].meta["id"]:
                raise _bad(n, "event outside its session's block", "session")
            action = obj.get("action")
            if not isinstance(action, dict):
                raise _bad(n, "action must be a JSON object", "action")
            try:
                parsed = parse_action(action)
            except InvalidEvent as exc:
                raise _bad(n, exc.reason, exc.field) from None
            metadata = obj.get("metadata")
            if metadata is not None and not isinstance(metadata, dict):
                raise _bad(n, "metadata must be an object or null", "metadata")
            eid, actor = obj.get("event_id"), obj.get("actor")
            if eid is not None and not isinstance(eid, str):
                raise _bad(n, "event_id must be a string or null", "event_id")
            if actor is not None and not isinstance(actor, str):
                raise _bad(n, "actor must be a string or null", "actor")
            # The stored bytes are the canonical form of the validated action: a file whose
            # action differs from it (extra keys, other values) is refused, not normalised.
            if parsed.to_json() != action:
                raise _bad(n, "action is not in canonical form", "action")
            payload = canonical(action)
            blocks[-1].events.append(
                EventRow(
                    session_pk=0,
                    version=_int(obj, "version", n),
                    event_id=eid,
                    type=str(action.get("type")),
                    turn=_int(obj, "turn", n),
                    payload=payload,
                    recorded_at=_int(obj, "recorded_at", n),
                    actor=actor,
                    metadata=canonical(metadata) if metadata is not None else None,
                    hash=_hex(obj.get("hash"), n, "hash"),
                )
            )
        else:
            raise _bad(n, f"unknown line kind {kind!r}", "kind")
    if header is None:
        raise InvalidEvent("import: the file is empty")
    return blocks


def _verify_block(b: _Block) -> None:
    """Recompute the hash chain and turns of a block; raise on the first mismatch."""
    m = b.meta
    sid = m["id"]
    fork = m.get("fork_version") or 0
    fork_hash = _hex(m.get("fork_hash"), b.line, "fork_hash")
    baseline = m["baseline"]
    baseline_hash = _hex(m["baseline_hash"], b.line, "baseline_hash") if m.get("baseline_hash") else None
    if baseline and baseline_hash is None:
        raise _bad(b.line, f"session {sid!r} has a baseline but no baseline_hash", "baseline_hash")
    prev_v, prev_hash, prev_turn = fork, fork_hash, m["fork_turn"]
    for e in b.events:
        if e.version <= prev_v:
            raise _bad(b.line, f"session {sid!r}: version {e.version} out of order", "version")
        if e.version != prev_v + 1:
            # The only gap allowed: events compacted away below the baseline.
            if baseline_hash is None or e.version != baseline + 1 or prev_v >= baseline:
                raise _bad(b.line, f"session {sid!r}: version {prev_v + 1} is missing", "version")
            prev_hash, prev_turn = baseline_hash, m["baseline_turn"]
        elif baseline_hash is not None and e.version == baseline + 1 and prev_hash != baseline_hash:
            raise _bad(
                b.line, f"session {sid!r}: baseline hash does not match its events", "baseline_hash"
            )
        expected_turn = prev_turn + (1 if e.type == "send" else 0)
        if e.turn != expected_turn:
            raise _bad(b.line, f"session {sid!r}: event {e.version} has turn {e.turn}, expected {expected_turn}", "turn")
        h = recorded_hash(prev_hash, sid, e)
        if h != e.hash:
            raise _bad(
                b.line,
                f"session {sid!r}: event {e.version} does not match its hash "
                "(the file was modified or damaged); nothing was imported",
                "hash",
            )
        prev_v, prev_hash, prev_turn = e.version, e.hash, e.turn
    if prev_v < baseline:
        prev_v, prev_hash, prev_turn = baseline, baseline_hash or prev_hash, m["baseline_turn"]
    if prev_v != m["head"] or prev_hash != _hex(m["head_hash"], b.line, "head_hash") or prev_turn != m["head_turn"]:
        raise _bad(b.line, f"session {sid!r}: head {m['head']} does not match its events", "head")


def import_(
    engine: Engine,
    src: IO[str] | Iterable[str],
    *,
    progress: Progress | None = None,
) -> list[ImportResult]:
    """Recreate sessions from an :func:`export` file, verbatim and atomically.

    Every event keeps its id, version, timestamp, actor, metadata and hash. The whole
    file is parsed and its hash chains recomputed before anything is written; then all
    of it is written in one transaction. A session that already exists is left alone
    when it holds the same history (``present``), extended when it holds a prefix of it
    (``extended``), and a compacted session gets back the events its archive holds and
    its earlier baseline (``restored``); any other difference refuses the import.

    Args:
        engine: the engine.
        src: a text file object (or any iterable of lines).
        progress: called as ``progress(events_done, total_events)``.

    Returns:
        One :class:`ImportResult` per session of the file, root first.

    Raises:
        InvalidEvent: the file is malformed or was tampered with, or an argument is
            malformed; nothing was written.
        SessionExists: a session of the file exists with a different history.
        SessionNotFound: a branch's parent is neither in the file nor in the store.
    """
    if isinstance(src, (str, bytes)) or not isinstance(src, Iterable):
        raise InvalidEvent(
            f"src must be a text file object or an iterable of lines, got {type(src).__name__}",
            field="src",
        )
    engine.validate.progress(progress)
    blocks = _parse(src)
    for b in blocks:
        _verify_block(b)
    total = sum(len(b.events) for b in blocks)
    done = 0
    results: list[ImportResult] = []
    storage = engine.storage
    new_blobs: set[bytes] = set()
    with storage.write() as tx:
        for b in blocks:
            m = b.meta
            sid = m["id"]
            # Locked: an import that extends or restores a session serialises with its appends.
            existing = storage.lock_session(tx, sid)
            parent_pk = None
            if m.get("parent"):
                prow = storage.get_session(tx, m["parent"])
                if prow is None:
                    raise SessionNotFound(m["parent"])
                parent_pk = prow.pk
                fv = m.get("fork_version") or 0
                if fv > prow.head:
                    raise _conflict(prow.id, f"has only versions up to {prow.head}, but {sid!r} forks at {fv}")
                fork_hash = _hash_at(engine, tx, prow, fv) if fv else ZERO_HASH
                if fork_hash is None:
                    raise CompactedError(prow.id, fv, prow.baseline, prow.head)
                if fork_hash.hex() != m["fork_hash"]:
                    raise _conflict(prow.id, f"holds another history than the file's up to version {fv}")
            if existing is not None:
                status, n = _merge_existing(engine, tx, existing, b, parent_pk, new_blobs)
                results.append(ImportResult(sid, status, n, max(existing.head, m["head"])))
                done += len(b.events)
                if progress is not None:
                    progress(done, total)
                continue
            baseline = m["baseline"]
            check_new_session_id(sid)
            new = storage.insert_session(
                tx,
                NewSession(
                    id=sid,
                    created_at=m["created_at"],
                    parent_pk=parent_pk,
                    fork_version=m.get("fork_version") if parent_pk else None,
                    head=(m.get("fork_version") or 0) if parent_pk else 0,
                    head_hash=bytes.fromhex(m["fork_hash"]),
                    head_turn=m["fork_turn"],
                    baseline=baseline,
                    baseline_hash=bytes.fromhex(m["baseline_hash"]) if baseline else None,
                    baseline_turn=m["baseline_turn"],
                ),
            )
            if new is None:
                raise SessionExists(sid)
            if baseline > (m.get("fork_version") or 0):
                # The session's own baseline: its snapshot stands for the events that are gone.
                state = m.get("baseline_state")
                if not isinstance(state, dict):
                    raise _bad(b.line, f"session {sid!r} has a baseline but no baseline_state", "baseline_state")
                engine.put_snapshot(tx, new.pk, baseline, state, new_blobs)
            rows = [_with_pk(e, new.pk) for e in b.events]
            for chunk in storage.iter_chunks(rows, 500):
                storage.insert_events(tx, chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
            _snapshot_runs(engine, tx, new, rows, new_blobs)
            storage.set_head(tx, new.pk, m["head"], bytes.fromhex(m["head_hash"]), m["head_turn"])
            results.append(ImportResult(sid, "created", len(rows), m["head"]))
    engine.planner.committed(blobs=new_blobs)
    if progress is not None:
        progress(done, total)
    return results


def _snapshot_runs(
    engine: Engine,
    tx: Any,
    row: SessionRow,
    rows: Sequence[EventRow],
    new_blobs: set[bytes],
) -> None:
    """Write the periodic snapshots an append of these events would have written.

    Without them every load of an imported session would fold from its start. ``rows``
    may have one gap (events compacted away below the baseline); each contiguous run is
    folded from the state just before it, which is loadable by then (the parent's state
    at the fork, or the baseline snapshot).
    """
    n = engine.snapshot_every
    fresh = engine.storage.get_session(tx, row.id) or row
    run: list[EventRow] = []
    seq: list[EventRow | None] = [*rows, None]
    for e in seq:
        if run and (e is None or e.version != run[-1].version + 1):
            start, end = run[0].version - 1, run[-1].version
            boundaries = snapshot_boundaries(start, end, n)
            if boundaries:
                state: JSON = engine.state_at(tx, fresh, start)
                pos = start
                for b in boundaries:
                    state = fold_json(
                        state, [orjson.loads(r.payload) for r in run[pos - start : b - start]]
                    )
                    pos = b
                    engine.put_snapshot(tx, row.pk, b, state, new_blobs)
            run = []
        if e is not None:
            run.append(e)


def _conflict(session: str, why: str) -> SessionExists:
    err = SessionExists(session)
    err.message = (
        f"session {session!r} already exists and {why}; import into another database, "
        "or rename the session there"
    )
    return err


def _with_pk(e: EventRow, pk: int) -> EventRow:
    return EventRow(
        pk, e.version, e.event_id, e.type, e.turn, e.payload, e.recorded_at, e.actor, e.metadata, e.hash
    )


def _merge_existing(
    engine: Engine,
    tx: Any,
    row: SessionRow,
    b: _Block,
    parent_pk: int | None,
    new_blobs: set[bytes],
) -> tuple[str, int]:
    """Leave an existing session alone or extend it; refuse a different history."""
    m = b.meta
    storage = engine.storage
    if row.parent_pk != parent_pk or (row.fork_version or None) != (m.get("fork_version") or None):
        raise _conflict(row.id, "holds another history than the file's")
    common = min(row.head, m["head"])
    mine = {e.version: e for e in b.events}
    theirs = _hash_at(engine, tx, row, common) if common else ZERO_HASH
    if common in mine:
        ours: bytes | None = mine[common].hash
    elif common == m["head"]:
        ours = bytes.fromhex(m["head_hash"])
    elif common == m["baseline"] and m.get("baseline_hash"):
        ours = bytes.fromhex(m["baseline_hash"])
    elif common == (m.get("fork_version") or 0):
        ours = bytes.fromhex(m["fork_hash"])
    else:
        ours = None
    if theirs is None or ours is None or theirs != ours:
        raise _conflict(row.id, "holds another history than the file's")
    restored = 0
    if row.baseline > m["baseline"]:
        restored = _restore_prefix(engine, tx, row, b, new_blobs)
    if m["head"] <= row.head:
        return ("restored" if restored or row.baseline > m["baseline"] else "present"), restored
    rows = [_with_pk(e, row.pk) for e in b.events if e.version > row.head]
    if not rows or rows[0].version != row.head + 1:
        raise _conflict(row.id, "holds another history than the file's")
    storage.insert_events(tx, rows)
    _snapshot_runs(engine, tx, row, rows, new_blobs)
    storage.set_head(tx, row.pk, m["head"], bytes.fromhex(m["head_hash"]), m["head_turn"])
    return "extended", len(rows) + restored


def _restore_prefix(
    engine: Engine,
    tx: Any,
    row: SessionRow,
    b: _Block,
    new_blobs: set[bytes],
) -> int:
    """Undo a compaction from an archive: put back the events the file holds below the
    session's baseline and lower the baseline to the file's.

    The file's chain must reach the session's baseline with the very hash the session
    restarts from, so the restored events are exactly the ones compaction removed.

    Returns:
        the number of events put back.
    """
    m = b.meta
    storage = engine.storage
    fork = row.fork_version or 0
    bl = row.baseline
    mine = {e.version: e for e in b.events}
    # Below the fork the events are the parent's (restored with the parent's block).
    if bl > fork and (bl not in mine or mine[bl].hash != row.baseline_hash):
        raise _conflict(
            row.id, f"was compacted up to version {bl}, and the file does not lead to that state"
        )
    present = {e.version for e in storage.read_events(tx, row.pk, after=fork, upto=bl)}
    back = [_with_pk(e, row.pk) for e in b.events if e.version <= bl and e.version not in present]
    for chunk in storage.iter_chunks(back, 500):
        storage.insert_events(tx, chunk)
    new_baseline = m["baseline"]
    if new_baseline > fork:
        state = m.get("baseline_state")
        if not isinstance(state, dict):
            raise _bad(b.line, f"session {row.id!r} has a baseline but no baseline_state", "baseline_state")
        engine.put_snapshot(tx, row.pk, new_baseline, state, new_blobs)
    # The compaction primitive is also how a baseline moves down: with keep_upto at the
    # head it deletes nothing, and only the baseline columns change.
    storage.compact(
        tx,
        row.pk,
        upto=new_baseline,
        keep_upto=row.head,
        baseline_hash=bytes.fromhex(m["baseline_hash"]) if new_baseline else ZERO_HASH,
        baseline_turn=m["baseline_turn"],
    )
    _snapshot_runs(engine, tx, row, back, new_blobs)
    return len(back)
