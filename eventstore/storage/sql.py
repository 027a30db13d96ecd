"""Statements shared by both backends (SQLAlchemy Core), and the one error mapper.

The dialect modules override only what differs: how a write transaction begins, row
locking, "insert unless present" / upsert, and how a driver error is classified.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    delete,
    func,
    insert,
    inspect,
    or_,
    select,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from ..errors import ConcurrencyError, EventStoreError, SchemaError, StorageError
from .base import (
    EventIdRace,
    EventRow,
    NewSession,
    Segment,
    SessionRow,
    SnapshotRow,
    Storage,
    Tx,
)
from .schema import (
    VERSION_TABLE,
    compaction_permits,
    events,
    sessions,
    snapshot_blobs,
    snapshots,
)

__all__ = ["ErrorKind", "SqlStorage", "mask_url"]

# SQLite's default limit is 32766 bound parameters; stay far below it.
_CHUNK = 500

_EVENT_COLS = (
    events.c.session_pk,
    events.c.version,
    events.c.event_id,
    events.c.type,
    events.c.turn,
    events.c.payload,
    events.c.recorded_at,
    events.c.actor,
    events.c.metadata,
    events.c.hash,
)
_SESSION_COLS = tuple(sessions.c)
_SNAPSHOT_COLS = tuple(snapshots.c)


class ErrorKind(enum.Enum):
    """What a driver error means to eventstore (decided per dialect)."""

    VERSION_TAKEN = "version-taken"  # unique violation on the events primary key
    EVENT_ID_TAKEN = "event-id-taken"  # unique violation on (session_pk, event_id)
    RETRYABLE = "retryable"  # lost connection, serialization failure, busy database
    NO_SCHEMA = "no-schema"  # a table is missing: not migrated
    OTHER = "other"


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (safe to put in a message)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown without its userinfo
        return url.split("@")[-1]


def _session(r: Any) -> SessionRow:
    return SessionRow(
        pk=r.pk,
        id=r.id,
        parent_pk=r.parent_pk,
        fork_version=r.fork_version,
        head=r.head,
        head_hash=bytes(r.head_hash),
        head_turn=r.head_turn,
        baseline=r.baseline,
        baseline_hash=None if r.baseline_hash is None else bytes(r.baseline_hash),
        baseline_turn=r.baseline_turn,
        created_at=r.created_at,
    )


def _event(r: Any) -> EventRow:
    return EventRow(
        session_pk=r[0],
        version=r[1],
        event_id=r[2],
        type=r[3],
        turn=r[4],
        payload=bytes(r[5]),
        recorded_at=r[6],
        actor=r[7],
        metadata=None if r[8] is None else bytes(r[8]),
        hash=bytes(r[9]),
    )


def _snapshot(r: Any) -> SnapshotRow:
    return SnapshotRow(
        session_pk=r.session_pk,
        version=r.version,
        reducer_version=r.reducer_version,
        rest=bytes(r.rest),
        message_digests=bytes(r.message_digests),
    )


class SqlStorage(Storage):
    """Storage on a SQLAlchemy engine; subclasses supply the dialect-specific parts."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.safe_url = mask_url(url)

    # -- dialect hooks ------------------------------------------------------------------

    def _classify(self, exc: DBAPIError) -> ErrorKind:
        """Decide what a driver error means (per dialect)."""
        raise NotImplementedError

    def _begin_write(self, conn: Connection) -> None:
        """Mark a connection so that its next BEGIN takes the write lock (SQLite)."""

    def _lock_clause(self, stmt: Any) -> Any:
        """Add row locking to a SELECT (PostgreSQL: FOR UPDATE)."""
        return stmt

    def _insert_ignore(self, table: Any) -> Any:
        """An INSERT that skips rows whose key exists."""
        raise NotImplementedError

    def _upsert_snapshot(self) -> Any:
        """An INSERT into snapshots that replaces a row with the same key."""
        raise NotImplementedError

    def _migration_lock(self, conn: Connection) -> None:
        """Serialise concurrent migrations (PostgreSQL: an advisory lock)."""

    # -- the one error mapper -----------------------------------------------------------

    @contextmanager
    def _errors(self, *, session: str | None = None, expected: int | None = None) -> Iterator[None]:
        """Turn every driver exception raised inside the block into the error tree."""
        try:
            yield
        except EventStoreError:
            raise
        except DBAPIError as exc:
            kind = self._classify(exc)
            if kind is ErrorKind.VERSION_TAKEN:
                actual = self._peek_head(session) if session is not None else -1
                raise ConcurrencyError(
                    session or "?", -1 if expected is None else expected, actual
                ) from exc
            if kind is ErrorKind.EVENT_ID_TAKEN:
                raise EventIdRace() from exc
            if kind is ErrorKind.NO_SCHEMA:
                raise SchemaError(
                    f"the database {self.safe_url} has no eventstore schema "
                    f"({_first_line(exc.orig)}); run `eventstore migrate`"
                ) from exc
            if kind is ErrorKind.RETRYABLE:
                raise StorageError(
                    f"database {self.safe_url} is unavailable or busy: {_first_line(exc.orig)}; "
                    "try again",
                    retryable=True,
                ) from exc
            raise StorageError(
                f"database {self.safe_url} failed: {_first_line(exc.orig)}", retryable=False
            ) from exc
        except SQLAlchemyError as exc:
            raise StorageError(f"database {self.safe_url} failed: {exc}") from exc

    def _peek_head(self, session: str) -> int:
        try:
            with self.engine.connect() as conn:
                head = conn.execute(
                    select(sessions.c.head).where(sessions.c.id == session)
                ).scalar()
            return int(head or 0)
        except SQLAlchemyError:
            return -1

    # -- transactions -------------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[Tx]:
        with self._errors(), self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def write(self, *, session: str | None = None, expected: int | None = None) -> Iterator[Tx]:
        with self._errors(session=session, expected=expected), self.engine.connect() as conn:
            self._begin_write(conn)
            with conn.begin():
                yield conn

    def close(self) -> None:
        self.engine.dispose()

    # -- schema -------------------------------------------------------------------------

    def migrate(self) -> None:
        from .migrate import upgrade

        with self._errors(), self.engine.connect() as conn:
            self._begin_write(conn)
            with conn.begin():
                self._migration_lock(conn)
                upgrade(conn)

    def schema_revision(self) -> str | None:
        with self._errors(), self.engine.connect() as conn:
            if not inspect(conn).has_table(VERSION_TABLE):
                return None
            rev = conn.exec_driver_sql(
                # A constant identifier from schema.py, not user input.
                "SELECT version_num FROM " + VERSION_TABLE
            ).scalar()
            return None if rev is None else str(rev)

    # -- sessions -----------------------------------------------------------------------

    def get_session(self, tx: Tx, session_id: str) -> SessionRow | None:
        r = tx.execute(select(*_SESSION_COLS).where(sessions.c.id == session_id)).first()
        return None if r is None else _session(r)

    def get_session_by_pk(self, tx: Tx, pk: int) -> SessionRow:
        r = tx.execute(select(*_SESSION_COLS).where(sessions.c.pk == pk)).one()
        return _session(r)

    def lock_session(self, tx: Tx, session_id: str) -> SessionRow | None:
        stmt = self._lock_clause(select(*_SESSION_COLS).where(sessions.c.id == session_id))
        r = tx.execute(stmt).first()
        return None if r is None else _session(r)

    def insert_session(self, tx: Tx, new: NewSession) -> SessionRow | None:
        stmt = (
            self._insert_ignore(sessions)
            .values(
                id=new.id,
                parent_pk=new.parent_pk,
                fork_version=new.fork_version,
                head=new.head,
                head_hash=new.head_hash,
                head_turn=new.head_turn,
                baseline=new.baseline,
                baseline_hash=new.baseline_hash,
                baseline_turn=new.baseline_turn,
                created_at=new.created_at,
            )
            .returning(*_SESSION_COLS)
        )
        r = tx.execute(stmt).first()
        return None if r is None else _session(r)

    def set_head(self, tx: Tx, pk: int, head: int, head_hash: bytes, head_turn: int) -> None:
        tx.execute(
            update(sessions)
            .where(sessions.c.pk == pk)
            .values(head=head, head_hash=head_hash, head_turn=head_turn)
        )

    def list_sessions(self, tx: Tx) -> list[SessionRow]:
        rows = tx.execute(select(*_SESSION_COLS).order_by(sessions.c.pk)).all()
        return [_session(r) for r in rows]

    def max_child_fork(self, tx: Tx, pk: int) -> int | None:
        v = tx.execute(
            select(func.max(sessions.c.fork_version)).where(sessions.c.parent_pk == pk)
        ).scalar()
        return None if v is None else int(v)

    # -- events -------------------------------------------------------------------------

    def insert_events(self, tx: Tx, rows: Sequence[EventRow]) -> None:
        # SQLAlchemy's "insertmanyvalues" sends the batch as multi-row INSERTs: one round
        # trip per 1000 rows on both drivers.
        tx.execute(
            insert(events),
            [
                {
                    "session_pk": r.session_pk,
                    "version": r.version,
                    "event_id": r.event_id,
                    "type": r.type,
                    "turn": r.turn,
                    "payload": r.payload,
                    "recorded_at": r.recorded_at,
                    "actor": r.actor,
                    "metadata": r.metadata,
                    "hash": r.hash,
                }
                for r in rows
            ],
        )

    def events_by_id(self, tx: Tx, session_pk: int, event_ids: Sequence[str]) -> list[EventRow]:
        out: list[EventRow] = []
        for chunk in self.iter_chunks(list(event_ids), _CHUNK):
            rows = tx.execute(
                select(*_EVENT_COLS).where(
                    events.c.session_pk == session_pk, events.c.event_id.in_(chunk)
                )
            ).all()
            out.extend(_event(r) for r in rows)
        out.sort(key=lambda e: e.version)
        return out

    def read_events(
        self,
        tx: Tx,
        session_pk: int,
        *,
        after: int,
        upto: int,
        limit: int | None = None,
        desc: bool = False,
    ) -> list[EventRow]:
        stmt = select(*_EVENT_COLS).where(
            events.c.session_pk == session_pk,
            events.c.version > after,
            events.c.version <= upto,
        )
        stmt = stmt.order_by(events.c.version.desc() if desc else events.c.version)
        if limit is not None:
            stmt = stmt.limit(limit)
        return [_event(r) for r in tx.execute(stmt)]

    def read_payloads(self, tx: Tx, session_pk: int, *, after: int, upto: int) -> list[bytes]:
        stmt = (
            select(events.c.payload)
            .where(
                events.c.session_pk == session_pk,
                events.c.version > after,
                events.c.version <= upto,
            )
            .order_by(events.c.version)
        )
        return [bytes(p) for p in tx.execute(stmt).scalars()]

    def event_at(self, tx: Tx, session_pk: int, version: int) -> EventRow | None:
        r = tx.execute(
            select(*_EVENT_COLS).where(
                events.c.session_pk == session_pk, events.c.version == version
            )
        ).first()
        return None if r is None else _event(r)

    # -- snapshots ----------------------------------------------------------------------

    def latest_snapshot(
        self,
        tx: Tx,
        segments: Sequence[Segment],
        reducer_version: int,
        baselines: Sequence[tuple[int, int]] = (),
    ) -> SnapshotRow | None:
        if not segments and not baselines:
            return None
        at_baseline = [
            and_(snapshots.c.session_pk == pk, snapshots.c.version == v) for pk, v in baselines
        ]
        usable: Any = or_(snapshots.c.reducer_version == reducer_version, *at_baseline)
        # A snapshot *at* a segment's lower end is the state of the previous segment's
        # tip, so it is as good as one inside: `version >= after` (except version 0).
        within = or_(
            *(
                and_(
                    snapshots.c.session_pk == s.session_pk,
                    snapshots.c.version > 0,
                    snapshots.c.version >= s.after,
                    snapshots.c.version <= s.upto,
                )
                for s in segments
            ),
            *at_baseline,
        )
        stmt = (
            select(*_SNAPSHOT_COLS)
            .where(within, usable)
            .order_by(snapshots.c.version.desc())
            .limit(1)
        )
        r = tx.execute(stmt).first()
        return None if r is None else _snapshot(r)

    def list_snapshots(self, tx: Tx, session_pk: int, *, after: int, upto: int) -> list[SnapshotRow]:
        rows = tx.execute(
            select(*_SNAPSHOT_COLS)
            .where(
                snapshots.c.session_pk == session_pk,
                snapshots.c.version > after,
                snapshots.c.version <= upto,
            )
            .order_by(snapshots.c.version)
        ).all()
        return [_snapshot(r) for r in rows]

    def put_snapshot(self, tx: Tx, snap: SnapshotRow, blobs: Mapping[bytes, bytes]) -> None:
        if blobs:
            items = [{"digest": d, "body": b} for d, b in blobs.items()]
            stmt = self._insert_ignore(snapshot_blobs)
            for chunk in self.iter_chunks(items, _CHUNK):
                tx.execute(stmt, list(chunk))
        tx.execute(
            self._upsert_snapshot(),
            {
                "session_pk": snap.session_pk,
                "version": snap.version,
                "reducer_version": snap.reducer_version,
                "rest": snap.rest,
                "message_digests": snap.message_digests,
            },
        )

    def get_blobs(self, tx: Tx, digests: Sequence[bytes]) -> dict[bytes, bytes]:
        out: dict[bytes, bytes] = {}
        unique = list(dict.fromkeys(digests))
        for chunk in self.iter_chunks(unique, _CHUNK):
            rows = tx.execute(
                select(snapshot_blobs.c.digest, snapshot_blobs.c.body).where(
                    snapshot_blobs.c.digest.in_(bindparam("d", expanding=True))
                ),
                {"d": list(chunk)},
            ).all()
            for d, b in rows:
                out[bytes(d)] = bytes(b)
        return out

    # -- compaction ---------------------------------------------------------------------

    def compact(
        self,
        tx: Tx,
        session_pk: int,
        *,
        upto: int,
        keep_upto: int,
        baseline_hash: bytes,
        baseline_turn: int,
    ) -> int:
        tx.execute(
            update(sessions)
            .where(sessions.c.pk == session_pk)
            .values(baseline=upto, baseline_hash=baseline_hash, baseline_turn=baseline_turn)
        )
        # The permit is what the DELETE trigger checks; it never outlives this transaction.
        tx.execute(insert(compaction_permits).values(session_pk=session_pk, upto=upto))
        deleted = tx.execute(
            delete(events).where(
                events.c.session_pk == session_pk,
                events.c.version > keep_upto,
                events.c.version <= upto,
            )
        ).rowcount
        tx.execute(
            delete(snapshots).where(
                snapshots.c.session_pk == session_pk,
                snapshots.c.version > keep_upto,
                snapshots.c.version < upto,
            )
        )
        tx.execute(delete(compaction_permits).where(compaction_permits.c.session_pk == session_pk))
        return int(deleted or 0)


def _first_line(exc: BaseException | None) -> str:
    text = str(exc) if exc is not None else ""
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
