"""Import: an export file read, its hash chain and turns checked, and written back verbatim.

The file format is :mod:`eventstore.features.exporting`'s (and ``docs/format.md``, section
"Export files"). A session that exists already is left alone, extended, or restored from
its archive (the events a compaction removed), as :func:`import_` says.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import IO, Any

import orjson

from eventstore.core.appends import snapshot_boundaries
from eventstore.core.catalogue import check_metadata, check_title
from eventstore.core.chain import ChainWalk
from eventstore.core.codec import canonical, state_digest
from eventstore.core.ids import check_new_session_id
from eventstore.core.models import check_json, parse_action
from eventstore.core.reducer import fold_json
from eventstore.core.rewinds import is_kept_line, kept_reason
from eventstore.core.rows import ZERO_HASH, CompactionRow, EventRow, NewSession, RewindRow, SessionRow
from eventstore.engine import catalogue as catalogue_rows
from eventstore.engine.engine import Engine
from eventstore.errors import CompactedError, InvalidEvent, SessionExists
from eventstore.features.audit import check_reason
from eventstore.features.exporting import EXPORT_FORMAT, EXPORT_FORMAT_VERSION, JSON, Progress

__all__ = ["ImportResult", "import_"]


def _hash_at(engine: Engine, tx: Any, row: SessionRow, version: int) -> bytes | None:
    """The chain hash at ``version`` of ``row``'s lineage, or ``None`` when it is gone."""
    try:
        return engine.hash_turn_at(tx, row, version)[0]
    except CompactedError:
        return None


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


class _Lines:
    """An export file's objects one at a time, its header line checked first.

    Each session and event line is validated with the rules an append applies (the store's
    :class:`~eventstore.core.validation.Validator`: ids, actors, sizes, metadata), so an import
    can store nothing an append would refuse.
    """

    def __init__(self, lines: Iterable[str], engine: Engine) -> None:
        self._it = enumerate(lines, 1)
        self._v = engine.validate
        self.header: JSON | None = None
        self.line = 0

    def _next_object(self) -> JSON | None:
        for n, raw in self._it:
            self.line = n
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise _bad(n, f"not valid JSON ({exc})") from None
            if not isinstance(obj, dict):
                raise _bad(n, "not a JSON object")
            return obj
        return None

    def read_header(self) -> JSON:
        obj = self._next_object()
        if obj is None:
            raise InvalidEvent("import: the file is empty")
        n = self.line
        if obj.get("format") != EXPORT_FORMAT:
            raise _bad(n, "not an eventstore export (the first line has no 'format' header)")
        if obj.get("format_version") != EXPORT_FORMAT_VERSION:
            raise _bad(n, f"unsupported export format version {obj.get('format_version')!r}")
        self.header = obj
        return obj

    def __iter__(self) -> Iterator[JSON | EventRow]:
        """Session objects (checked) and event rows (``session_pk`` 0), in file order."""
        current: str | None = None
        while (obj := self._next_object()) is not None:
            n = self.line
            kind = obj.get("kind")
            try:
                if kind == "session":
                    current = self._session(obj, n)
                    yield obj
                elif kind == "event":
                    if current is None or obj.get("session") != current:
                        raise _bad(n, "event outside its session's block", "session")
                    yield self._event(obj, n)
                else:
                    raise _bad(n, f"unknown line kind {kind!r}", "kind")
            except InvalidEvent as exc:
                if exc.message.startswith("import line"):
                    raise
                raise _bad(n, exc.reason, exc.field) from None

    def _session(self, obj: JSON, n: int) -> str:
        sid = self._v.id(obj.get("id"), "id")
        if obj.get("parent") is not None:
            self._v.id(obj.get("parent"), "parent")
        for k in ("head", "head_turn", "baseline", "baseline_turn", "created_at", "fork_turn"):
            _int(obj, k, n)
        _int(obj, "fork_version", n, optional=True)
        return sid

    def _event(self, obj: JSON, n: int) -> EventRow:
        v = self._v
        action = obj.get("action")
        if not isinstance(action, dict):
            raise _bad(n, "action must be a JSON object", "action")
        parsed = parse_action(action, max_bytes=v.limits.max_event_bytes)
        metadata = obj.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise _bad(n, "metadata must be an object or null", "metadata")
        eid = v.optional_id(obj.get("event_id"), "event_id")
        actor = v.optional_id(obj.get("actor"), "actor")
        # The stored bytes are the canonical form of the validated action: a file whose
        # action differs from it (extra keys, other values) is refused, not normalised.
        if parsed.to_json() != action:
            raise _bad(n, "action is not in canonical form", "action")
        payload = canonical(action)
        v.size(payload, "the action", field="action")
        meta: bytes | None = None
        if metadata is not None:
            check_json(metadata, "metadata", max_bytes=v.limits.max_event_bytes, what="metadata")
            meta = canonical(metadata)
            v.size(meta, "metadata", field="metadata")
        native = obj.get("native")
        if native is not None and not isinstance(native, str):
            raise _bad(n, "native must be a string of JSON text or absent", "native")
        return EventRow(
            session_pk=0,
            version=_int(obj, "version", n),
            event_id=eid,
            type=str(action.get("type")),
            turn=_int(obj, "turn", n),
            payload=payload,
            recorded_at=_int(obj, "recorded_at", n),
            actor=actor,
            metadata=meta,
            hash=_hex(obj.get("hash"), n, "hash"),
            native=v.native(native),
        )


class _ChainCheck:
    """A block's hash chain and turns, recomputed event by event (the rule of
    :mod:`eventstore.core.chain`); raises on the first mismatch."""

    def __init__(self, meta: JSON, line: int, name: str | None = None) -> None:
        self.meta, self.line = meta, line
        self.sid = meta["id"]
        # The id the events were appended to (a kept line's: the id it was rewound from).
        self.name = name or self.sid
        self.baseline = meta["baseline"]
        self.baseline_hash = (
            _hex(meta["baseline_hash"], line, "baseline_hash") if meta.get("baseline_hash") else None
        )
        if self.baseline and self.baseline_hash is None:
            raise _bad(line, f"session {self.sid!r} has a baseline but no baseline_hash", "baseline_hash")
        self.chain = ChainWalk(
            meta.get("fork_version") or 0, _hex(meta.get("fork_hash"), line, "fork_hash"), meta["fork_turn"]
        )

    def add(self, e: EventRow) -> None:
        sid, line, chain = self.sid, self.line, self.chain
        if e.version <= chain.version:
            raise _bad(line, f"session {sid!r}: version {e.version} out of order", "version")
        if e.version != chain.version + 1:
            # The only gap allowed: events compacted away below the baseline.
            if self.baseline_hash is None or e.version != self.baseline + 1 or chain.version >= self.baseline:
                raise _bad(line, f"session {sid!r}: version {chain.version + 1} is missing", "version")
            chain.jump(self.baseline, self.baseline_hash, self.meta["baseline_turn"])
        elif self.baseline_hash is not None and e.version == self.baseline + 1 and chain.hash != self.baseline_hash:
            raise _bad(line, f"session {sid!r}: baseline hash does not match its events", "baseline_hash")
        link = chain.step(self.name, e)
        if not link.turn_ok:
            raise _bad(
                line, f"session {sid!r}: event {e.version} has turn {e.turn}, expected {link.expected_turn}", "turn"
            )
        if not link.hash_ok:
            raise _bad(
                line,
                f"session {sid!r}: event {e.version} does not match its hash "
                "(the file was modified or damaged); nothing was imported",
                "hash",
            )

    def finish(self) -> None:
        m = self.meta
        prev_v, prev_hash, prev_turn = self.chain.version, self.chain.hash, self.chain.turn
        if prev_v < self.baseline:
            prev_v, prev_hash, prev_turn = self.baseline, self.baseline_hash or prev_hash, m["baseline_turn"]
        if prev_v != m["head"] or prev_hash != _hex(m["head_hash"], self.line, "head_hash") or prev_turn != m["head_turn"]:
            raise _bad(self.line, f"session {self.sid!r}: head {m['head']} does not match its events", "head")


def _baseline_record(meta: JSON, line: int, below: Sequence[EventRow]) -> CompactionRow | None:
    """The compaction record a compacted session's block carries, checked against its
    baseline state: an edited ``baseline_state`` is refused even with every hash intact.

    ``below``: the block's events at or below its baseline (those kept for branches); the
    record keeps their hashes, so ``verify`` accepts them after the import.

    Returns ``None`` when the session's own baseline is at or below its fork.
    """
    sid, baseline, fork = meta["id"], meta["baseline"], meta.get("fork_version") or 0
    if baseline <= fork:
        return None
    state = meta.get("baseline_state")
    if not isinstance(state, dict):
        raise _bad(line, f"session {sid!r} has a baseline but no baseline_state", "baseline_state")
    rec = meta.get("baseline_record")
    if not isinstance(rec, dict):
        raise _bad(
            line,
            f"session {sid!r} has a baseline but no baseline_record binding its state "
            "(exported before compaction records, or edited)",
            "baseline_record",
        )
    digest = _hex(rec.get("state_digest"), line, "baseline_record.state_digest")
    if digest != state_digest(state):
        raise _bad(
            line,
            f"session {sid!r}: baseline_state is not the state its compaction recorded "
            "(the file was modified); nothing was imported",
            "baseline_state",
        )
    if (
        rec.get("upto") != baseline
        or rec.get("baseline_hash") != meta.get("baseline_hash")
        or rec.get("baseline_turn") != meta["baseline_turn"]
    ):
        raise _bad(line, f"session {sid!r}: baseline_record does not match its baseline", "baseline_record")
    actor = rec.get("actor")
    when = rec.get("compacted_at")
    if (actor is not None and not isinstance(actor, str)) or not isinstance(when, int) or isinstance(when, bool):
        raise _bad(line, f"session {sid!r}: baseline_record is malformed", "baseline_record")
    kept = [e for e in below if e.version <= baseline]
    contiguous = bool(kept) and [e.version for e in kept] == list(range(fork + 1, fork + 1 + len(kept)))
    return CompactionRow(
        session_pk=0,
        upto=baseline,
        previous_baseline=fork,
        baseline_hash=bytes.fromhex(meta["baseline_hash"]),
        baseline_turn=meta["baseline_turn"],
        state_digest=digest,
        first_version=fork + 1 if contiguous else baseline + 1,
        removed_hashes=b"".join(e.hash for e in kept) if contiguous else b"",
        compacted_at=when,
        actor=actor,
    )


def import_(
    engine: Engine,
    src: IO[str] | Iterable[str],
    *,
    progress: Progress | None = None,
) -> list[ImportResult]:
    """Recreate sessions from an :func:`~eventstore.features.exporting.export` file, verbatim and atomically.

    Every event keeps its id, version, timestamp, actor, metadata and hash, and is checked
    with the rules an append applies (ids, actors, sizes, metadata). The file is read line
    by line inside one write transaction: each event's hash and turn are recomputed as it
    is read, events are written in chunks, and the first problem rolls everything back, so
    nothing is written unless the whole file is sound, and memory stays bounded by a
    chunk and one session's state, not by the file. A compacted session must carry the
    compaction record of its baseline, and its ``baseline_state`` must be the state that
    record's digest names. A session that already exists is left alone when it holds the
    same history (``present``), extended when it holds a prefix of it (``extended``), and a
    compacted session gets back the events its archive holds and its earlier baseline
    (``restored``); any other difference refuses the import. Restored events come back in
    the feed right before the session's first remaining event, so each session's events keep
    coming in version order (see :meth:`Engine.write_events
    <eventstore.engine.row_steps.RowSteps.write_events>`). (An existing session's block is
    held in memory while it is compared.)

    Args:
        engine: the engine.
        src: a text file object (or any iterable of lines).
        progress: called as ``progress(events_done, total_events)``.

    Returns:
        One :class:`ImportResult` per session of the file, root first.

    Raises:
        InvalidEvent: the file is malformed or was tampered with, or an argument is
            malformed; nothing was written.
        SessionExists: a session of the file exists with a different history, or (SQLite)
            its restored events find no free feed positions before its remaining ones.
        SessionErased: a session of the file was erased here (its id is not reused).
        SessionNotFound: a branch's parent is neither in the file nor in the store.
    """
    if isinstance(src, (str, bytes)) or not isinstance(src, Iterable):
        raise InvalidEvent(
            f"src must be a text file object or an iterable of lines, got {type(src).__name__}",
            field="src",
        )
    engine.validate.progress(progress)
    reader = _Lines(src, engine)
    header = reader.read_header()
    total = header.get("events")
    total = total if isinstance(total, int) and not isinstance(total, bool) and total >= 0 else 0
    results: list[ImportResult] = []
    new_blobs: set[bytes] = set()
    rewinds = _rewinds(engine, header)
    kept_names = {r.kept_id: r.session_id for r, _ in rewinds}
    with engine.writing() as tx:
        block: _Import | None = None
        done = 0
        for item in reader:
            if isinstance(item, dict):
                if block is not None:
                    results.append(block.finish())
                block = _Import(engine, tx, item, reader.line, new_blobs, kept_names)
            else:
                assert block is not None
                block.add(item)
                done += 1
                if progress is not None and done % 1000 == 0:
                    progress(done, max(total, done))
        if block is not None:
            results.append(block.finish())
        _restore_rewinds(engine, tx, rewinds, {r.session for r in results if r.status == "created"})
    if progress is not None:
        progress(done, max(total, done))
    return results


def _rewinds(engine: Engine, header: JSON) -> list[tuple[RewindRow, str]]:
    """The header's rewind records, checked, each with the id of the row it made (the
    pks are filled in once the rows exist)."""
    found = header.get("rewinds", [])
    if not isinstance(found, list):
        raise _bad(1, "rewinds must be a list", "rewinds")
    v = engine.validate
    out: list[tuple[RewindRow, str]] = []
    for i, r in enumerate(found):
        where = f"rewinds[{i}]"
        if not isinstance(r, dict):
            raise _bad(1, f"{where} is not an object", "rewinds")
        try:
            session, kept, made = (v.id(r.get(k), k) for k in ("session", "kept", "made"))
            actor = v.optional_id(r.get("actor"), "actor")
            reason = r.get("reason")
            if reason is not None:
                reason = check_reason(reason)
        except InvalidEvent as exc:
            raise _bad(1, f"{where}: {exc.reason}", "rewinds") from None
        if not is_kept_line(kept, session):
            raise _bad(1, f"{where}: {kept!r} is not a line kept from {session!r}", "rewinds")
        rec = RewindRow(
            session_id=session,
            kept_id=kept,
            kept_pk=0,
            new_pk=0,
            from_head=_int(r, "from_head", 1),
            from_hash=_hex(r.get("from_hash"), 1, f"{where}.from_hash"),
            to_version=_int(r, "to_version", 1),
            rewound_at=_int(r, "rewound_at", 1),
            actor=actor,
            reason=reason,
        )
        out.append((rec, made))
    if len({r.kept_id for r, _ in out}) != len(out):
        raise _bad(1, "rewinds: a kept id appears twice", "rewinds")
    return out


def _restore_rewinds(engine: Engine, tx: Any, rewinds: list[tuple[RewindRow, str]], created: set[str]) -> None:
    """Write back the file's rewinds once its rows exist: each kept line is closed, marked
    as a line of the row its rewind made, and its record written; a record already here
    (the same file imported again) is left as it is."""
    for rec, made in rewinds:
        kept_row, made_row = engine.find_row(tx, rec.kept_id), engine.find_row(tx, made)
        if kept_row is None or made_row is None:
            raise _bad(1, f"the rewind that kept {rec.kept_id!r} names a session the file does not hold", "rewinds")
        if (
            kept_row.head != rec.from_head
            or kept_row.head_hash != rec.from_hash
            or made_row.parent_pk != kept_row.pk
            or (made_row.fork_version or 0) != rec.to_version
        ):
            raise _bad(1, f"the rewind that kept {rec.kept_id!r} does not match its sessions", "rewinds")
        here = [r for r in engine.rewinds(tx, session_id=rec.session_id) if r.kept_id == rec.kept_id]
        if here:
            if (here[0].kept_pk, here[0].new_pk, here[0].to_version) != (kept_row.pk, made_row.pk, rec.to_version):
                raise _conflict(rec.kept_id, "was kept by another rewind than the file's")
            continue
        if rec.kept_id not in created:
            raise _conflict(rec.kept_id, "is not the line the file's rewind kept")
        engine.record_rewind(
            tx,
            replace(rec, kept_pk=kept_row.pk, new_pk=made_row.pk),
            closed_at=rec.rewound_at,
            reason=kept_reason(rec.session_id, rec.to_version),
        )
        catalogue_rows.touch(tx, made_row.pk, rec.rewound_at)


class _Import:
    """One session block of an import, written as its lines arrive (a new session) or
    held and compared at its end (an existing one)."""

    CHUNK = 500

    def __init__(
        self, engine: Engine, tx: Any, meta: JSON, line: int, new_blobs: set[bytes], kept_names: Mapping[str, str]
    ) -> None:
        self.engine, self.tx, self.meta, self.line, self.new_blobs = engine, tx, meta, line, new_blobs
        sid = meta["id"]
        self.kept_line = sid in kept_names
        if meta.get("appended_to") != kept_names.get(sid):
            raise _bad(line, f"session {sid!r}: appended_to does not match the file's rewinds", "appended_to")
        self.check = _ChainCheck(meta, line, kept_names.get(sid))
        self.info = _info(engine, meta, line)
        # Locked: an import that extends or restores a session serialises with its appends.
        self.existing = engine.find_row(tx, sid, lock=True)
        self.parent_pk = _check_parent(engine, tx, meta)
        self.events: list[EventRow] = []  # held: an existing session's, or one chunk
        self.below: list[EventRow] = []  # a new session's events at or below its baseline
        self.count = 0
        self.row: SessionRow | None = None
        self.state: JSON | None = None
        self.state_at: int | None = None
        self.pending: list[bytes] = []
        self.last = 0
        if self.existing is None:
            self.row = self._create()

    def _create(self) -> SessionRow:
        m, engine, tx = self.meta, self.engine, self.tx
        sid = m["id"]
        baseline = m["baseline"]
        try:
            if not self.kept_line:  # a kept id is the file's rewind's, checked with it
                check_new_session_id(sid)
        except InvalidEvent as exc:
            raise _bad(self.line, exc.reason, exc.field) from None
        fork = m.get("fork_version") if self.parent_pk else None
        if baseline > (fork or 0):
            # The digest check comes first (again at the end, with the kept events).
            _baseline_record(m, self.line, ())
        new = engine.insert_new_session(
            tx,
            NewSession(
                id=sid,
                created_at=m["created_at"],
                parent_pk=self.parent_pk,
                fork_version=fork,
                head=(fork or 0),
                head_hash=bytes.fromhex(m["fork_hash"]),
                head_turn=m["fork_turn"],
                baseline=baseline,
                baseline_hash=bytes.fromhex(m["baseline_hash"]) if baseline else None,
                baseline_turn=m["baseline_turn"],
            ),
        )
        if new is None:
            raise SessionExists(sid)
        if baseline > (fork or 0):
            # The session's own baseline: its snapshot stands for the events that are gone.
            engine.put_snapshot(tx, new.pk, baseline, m["baseline_state"], self.new_blobs)
        return new

    def add(self, e: EventRow) -> None:
        self.check.add(e)
        self.count += 1
        if self.row is None:
            self.events.append(e)
            return
        e = _with_pk(e, self.row.pk)
        if e.version <= self.meta["baseline"]:
            self.below.append(e)
        if e.version != self.last + 1:
            self.state_at, self.pending = None, []  # after the gap below the baseline
        self.last = e.version
        self.events.append(e)
        self.pending.append(e.payload)
        if e.version % self.engine.snapshot_every == 0:
            self._flush()
            self._snapshot(e.version)
        elif len(self.events) >= self.CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self.events:
            self.engine.write_events(self.tx, self.events)
            self.events = []

    def _snapshot(self, version: int) -> None:
        """The periodic snapshot an append would have written (without it every load of
        the imported session would fold from its start)."""
        engine, row = self.engine, self.row
        assert row is not None
        if self.state_at is None:
            self.state = engine.state_at(self.tx, row, version)
        else:
            self.state = fold_json(self.state, [orjson.loads(p) for p in self.pending])
        self.state_at, self.pending = version, []
        engine.put_snapshot(self.tx, row.pk, version, self.state, self.new_blobs)

    def finish(self) -> ImportResult:
        self.check.finish()
        m, engine, tx = self.meta, self.engine, self.tx
        sid = m["id"]
        if self.existing is not None:
            b = _Block(m, self.events, self.line)
            status, n = _merge_existing(engine, tx, self.existing, b, self.parent_pk, self.new_blobs)
            return ImportResult(sid, status, n, max(self.existing.head, m["head"]))
        assert self.row is not None
        self._flush()
        rec = _baseline_record(m, self.line, self.below)
        if rec is not None:
            engine.write_compaction(tx, replace(rec, session_pk=self.row.pk))
        engine.move_head(tx, self.row.pk, m["head"], bytes.fromhex(m["head_hash"]), m["head_turn"])
        engine.refresh_catalogue(tx, self.row.pk)
        if self.info is not None:
            fields, changes = self.info
            catalogue_rows.restore_info(tx, self.row.pk, **fields, changes=changes)
        return ImportResult(sid, "created", self.count, m["head"])


def _info(engine: Engine, meta: JSON, line: int) -> tuple[dict[str, Any], list[tuple[int, str | None, str]]] | None:
    """A block's ``info`` and ``info_changes``, checked as ``set_info`` checks them
    (``None``: the file has neither, as files written before them)."""
    info, changes = meta.get("info"), meta.get("info_changes", [])
    if info is None and not changes:
        return None
    v = engine.validate
    sid = meta["id"]
    if not isinstance(info, dict) or not isinstance(changes, list):
        raise _bad(line, f"session {sid!r}: info must be an object and info_changes a list", "info")
    try:
        title = check_title(info.get("title")) or None
        owner = None if info.get("owner") is None else v.id(info.get("owner"), "owner")
        meta_obj = check_metadata(info.get("metadata"))
        records = []
        for c in changes:
            if not isinstance(c, dict) or not isinstance(c.get("changes"), dict):
                raise InvalidEvent("an info change must be an object with changes", field="info_changes")
            what = c["changes"]
            check_title(what.get("title"))
            check_metadata(what.get("metadata"))
            if set(what) - {"title", "owner", "metadata"}:
                raise InvalidEvent("an info change sets only title, owner and metadata", field="info_changes")
            records.append((_int(c, "changed_at", line), v.optional_id(c.get("actor"), "actor"), canonical(what).decode()))
    except InvalidEvent as exc:
        raise _bad(line, f"session {sid!r}: {exc.reason}", exc.field) from None
    fields = {
        "title": title,
        "owner": owner,
        "metadata": canonical(meta_obj).decode() if meta_obj else None,
    }
    return fields, records


def _check_parent(engine: Engine, tx: Any, m: JSON) -> int | None:
    """The pk of a branch's parent, after checking that it holds the file's history up
    to the fork (``None`` for a root)."""
    if not m.get("parent"):
        return None
    sid = m["id"]
    prow = engine.find_row(tx, m["parent"])
    if prow is None:
        raise engine.missing(tx, m["parent"])
    fv = m.get("fork_version") or 0
    if fv > prow.head:
        raise _conflict(prow.id, f"has only versions up to {prow.head}, but {sid!r} forks at {fv}")
    fork_hash = _hash_at(engine, tx, prow, fv) if fv else ZERO_HASH
    if fork_hash is None:
        raise CompactedError(prow.id, fv, prow.baseline, prow.head)
    if fork_hash.hex() != m["fork_hash"]:
        raise _conflict(prow.id, f"holds another history than the file's up to version {fv}")
    return prow.pk


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
    fresh = engine.find_row(tx, row.id) or row
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
        pk,
        e.version,
        e.event_id,
        e.type,
        e.turn,
        e.payload,
        e.recorded_at,
        e.actor,
        e.metadata,
        e.hash,
        e.native,
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
    engine.write_events(tx, rows)
    _snapshot_runs(engine, tx, row, rows, new_blobs)
    engine.move_head(tx, row.pk, m["head"], bytes.fromhex(m["head_hash"]), m["head_turn"])
    engine.refresh_catalogue(tx, row.pk)
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
    fork = row.fork_version or 0
    bl = row.baseline
    mine = {e.version: e for e in b.events}
    # Below the fork the events are the parent's (restored with the parent's block).
    if bl > fork and (bl not in mine or mine[bl].hash != row.baseline_hash):
        raise _conflict(
            row.id, f"was compacted up to version {bl}, and the file does not lead to that state"
        )
    present = {e.version for e in engine.events(tx, row.pk, after=fork, upto=bl)}
    back = [_with_pk(e, row.pk) for e in b.events if e.version <= bl and e.version not in present]
    # In the feed, right before the session's first remaining event, not after it: each
    # session's events keep coming in version order (see docs/live.md).
    if not engine.write_events(tx, back, before=bl + 1):
        raise _conflict(
            row.id,
            f"its events below version {bl + 1} cannot be put back before it in the feed's order",
        )
    new_baseline = m["baseline"]
    rec = _baseline_record(m, b.line, [e for e in b.events if e.version <= new_baseline])
    if rec is not None:
        engine.put_snapshot(tx, row.pk, new_baseline, m["baseline_state"], new_blobs)
        if all(r.upto != new_baseline for r in engine.compactions(tx, row.pk)):
            engine.write_compaction(tx, replace(rec, session_pk=row.pk))
    # The compaction primitive is also how a baseline moves down: with keep_upto at the
    # head it deletes nothing, and only the baseline columns change.
    engine.move_baseline(
        tx,
        row.pk,
        upto=new_baseline,
        keep_upto=row.head,
        baseline_hash=bytes.fromhex(m["baseline_hash"]) if new_baseline else ZERO_HASH,
        baseline_turn=m["baseline_turn"],
    )
    _snapshot_runs(engine, tx, row, back, new_blobs)
    return len(back)
