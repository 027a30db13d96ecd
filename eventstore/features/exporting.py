"""Export: a session and the lineage it descends from as lossless JSON Lines.

Every function takes an :class:`~eventstore.engine.engine.Engine`. The file format (header,
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
and the previous hash and refuses the whole file on the first mismatch
(:mod:`eventstore.features.importing`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import IO, Any

import orjson

from eventstore.core.records import to_datetime
from eventstore.core.rows import ZERO_HASH, CompactionRow, EventRow, RewindRow, SessionRow
from eventstore.core.text import iso
from eventstore.engine import catalogue as catalogue_rows
from eventstore.engine.engine import Engine, Tx
from eventstore.features.files import text_out

__all__ = ["EXPORT_FORMAT", "EXPORT_FORMAT_VERSION", "export"]


EXPORT_FORMAT = "eventstore-export"
EXPORT_FORMAT_VERSION = 1


JSON = dict[str, Any]
Progress = Callable[[int, int], None]


@functools.lru_cache(maxsize=1024)
def _iso(micros: int) -> str:
    # Cached: a batch's events share one timestamp, so most calls are repeats.
    return iso(to_datetime(micros))


def _fork_point(engine: Engine, tx: Tx, row: SessionRow) -> tuple[bytes, int]:
    """The hash and turn a branch's first own event chains from (zero for a root)."""
    if row.parent_pk is None or not row.fork_version:
        return ZERO_HASH, 0
    parent = engine.session_by_pk(tx, row.parent_pk)
    return engine.hash_turn_at(tx, parent, row.fork_version)


def _own_records(engine: Engine, tx: Tx, row: SessionRow) -> list[CompactionRow]:
    """The compaction records of a session's own events (none when its baseline is inherited)."""
    return engine.compactions(tx, row.pk) if row.baseline > (row.fork_version or 0) else []


def _record_json(engine: Engine, tx: Tx, row: SessionRow) -> JSON | None:
    """The compaction record of a session's own baseline, as an export carries it: it
    binds the exported ``baseline_state`` (by its digest) to the chain."""
    for rec in _own_records(engine, tx, row):
        if rec.upto == row.baseline:
            return {
                "upto": rec.upto,
                "baseline_hash": rec.baseline_hash.hex(),
                "baseline_turn": rec.baseline_turn,
                "state_digest": rec.state_digest.hex(),
                "compacted_at": rec.compacted_at,
                "actor": rec.actor,
            }
    return None


def _exportable(engine: Engine, tx: Tx, row: SessionRow, evs: list[EventRow]) -> list[EventRow]:
    """The events to export: below the baseline only those a compaction recorded (kept
    for branches); a row forged there is never carried into another database."""
    recs = _own_records(engine, tx, row)
    if not recs:
        return evs
    return [e for e in evs if e.version > row.baseline or any(r.hash_at(e.version) == e.hash for r in recs)]


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
    with engine.reading() as tx:
        row = engine.row(tx, session)
        chain, rewinds = _family(engine, tx, row)
        kept_from = {rec.kept_pk: rec.session_id for rec in rewinds}
        by_pk = {r.pk: r for r in chain}
        catalogue = catalogue_rows.rows_by_pk(tx, list(by_pk))
        changes = catalogue_rows.info_records(tx, list(by_pk))
        blocks: list[tuple[JSON, list[EventRow]]] = []
        for r in chain:
            fork_hash, fork_turn = _fork_point(engine, tx, r)
            parent = engine.session_by_pk(tx, r.parent_pk).id if r.parent_pk else None
            evs = _exportable(engine, tx, r, engine.events(tx, r.pk, after=r.fork_version or 0, upto=r.head))
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
                "baseline_record": _record_json(engine, tx, r),
                "created_at": r.created_at,
                "created_at_iso": _iso(r.created_at),
                "events": len(evs),
                "info": _info_json(catalogue.get(r.pk)),
                "info_changes": [
                    {"changed_at": at, "changed_at_iso": _iso(at), "actor": actor, "changes": orjson.Fragment(c)}
                    for pk, at, actor, c in changes
                    if pk == r.pk
                ],
            }
            if r.pk in kept_from:
                # A kept line's events were appended to the id it was rewound away from:
                # that id is in their hashes.
                head["appended_to"] = kept_from[r.pk]
            blocks.append((head, evs))
        lines = [
            {
                "session": rec.session_id,
                "kept": rec.kept_id,
                "made": by_pk[rec.new_pk].id,
                "from_head": rec.from_head,
                "from_hash": rec.from_hash.hex(),
                "to_version": rec.to_version,
                "rewound_at": rec.rewound_at,
                "rewound_at_iso": _iso(rec.rewound_at),
                "actor": rec.actor,
                "reason": rec.reason,
            }
            for rec in rewinds
        ]
    for r, (head, _) in zip(chain, blocks):
        if r.baseline:
            head["baseline_state"] = engine.load(r.id, r.baseline)
    total = sum(len(evs) for _, evs in blocks)
    with text_out(out) as fh:
        return _write(fh, session, chain, blocks, total, progress, lines)


def _family(engine: Engine, tx: Tx, row: SessionRow) -> tuple[list[SessionRow], list[RewindRow]]:
    """The rows an export of ``row`` carries, parents first, and the rewinds among them.

    The session's lineage, and for every rewind of the session's id, and every rewind that
    kept or made one of the rows carried, both of its rows with their lineages: a kept
    line cannot be imported without the rewind that names it, nor that rewind without
    the row it made. Rows are ordered by pk (a parent is always older than its branch).
    """
    chosen = {r.pk: r for r in engine.lineage(tx, row)}
    found: dict[int, RewindRow] = {}
    pending = engine.rewinds(tx, session_id=row.id)
    while True:
        pending += engine.rewinds(tx, pks=list(chosen))
        grew = False
        for rec in pending:
            if rec.seq in found:
                continue
            found[rec.seq] = rec
            for pk in (rec.kept_pk, rec.new_pk):
                other = chosen.get(pk) or engine.session_by_pk(tx, pk)
                if other is not None and pk not in chosen:
                    chosen.update((r.pk, r) for r in engine.lineage(tx, other))
                    grew = True
        pending = []
        if not grew:
            break
    rows = sorted(chosen.values(), key=lambda r: r.pk)
    kept = [rec for _, rec in sorted(found.items()) if rec.kept_pk in chosen and rec.new_pk in chosen]
    return rows, kept


def _info_json(row: Any) -> JSON:
    """A session's catalogue fields set by ``set_info`` (``None`` when unset)."""
    if row is None:
        return {"title": None, "owner": None, "metadata": None}
    meta = None if row.metadata is None else orjson.Fragment(row.metadata)
    return {"title": row.title, "owner": row.owner, "metadata": meta}


def _write(
    out: IO[str],
    session: str,
    chain: list[SessionRow],
    blocks: list[tuple[JSON, list[EventRow]]],
    total: int,
    progress: Progress | None,
    rewinds: list[JSON],
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
                "rewinds": rewinds,
            }
        ).decode()
        + "\n"
    )
    written = 0
    for r, (head, evs) in zip(chain, blocks):
        out.write(dumps(head).decode() + "\n")
        lines = []
        for e in evs:
            doc: JSON = {
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
            if e.native is not None:
                # A JSON string holding the exact text: the bytes come back as they were
                # (a parsed copy could differ in spacing, key order or number spelling).
                doc["native"] = e.native.decode()
            lines.append(dumps(doc).decode())
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
