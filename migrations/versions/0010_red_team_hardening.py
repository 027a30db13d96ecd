"""Snapshot blobs must be what their digest says: a check on PostgreSQL's ``snapshot_blobs``.

Blobs are shared by digest and a snapshot write skips a digest that is already stored, so
a role that may insert blobs (the application role) could plant other content under the
digest of a chunk an honest writer stores later, and every load through that snapshot
would show it. The check ``digest = first 16 bytes of sha256(body)`` (the codec's digest,
``eventstore.core.codec.SnapshotCodec``) makes the database refuse such a row whoever
inserts it; only the owner, who can drop the check, could still plant one.

Blobs stored before this revision are checked once: a snapshot that refers to a blob whose
body does not match its digest is deleted (a snapshot is a cache: loads fold the events
instead), except a compacted session's baseline snapshot, which is all that remains of the
versions below it (``verify`` reports it); then the unreferenced mismatching blobs go. The
check is added ``NOT VALID`` (no scan under an exclusive lock; new rows are checked), which
also leaves such a baseline's blob in place.

SQLite: nothing changes. It has no roles: whoever can insert a blob can also rewrite a
snapshot or an event, and ``verify`` compares every snapshot with the fold of its events.

Revision ID: 0010_red_team_hardening
Revises: 0009_event_provider_data
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0010_red_team_hardening"
down_revision = "0009_event_provider_data"
branch_labels = None
depends_on = None

_BAD_BLOBS = "SELECT digest FROM snapshot_blobs WHERE substr(sha256(body), 1, 16) <> digest"

_DROP_POISONED_SNAPSHOTS = f"""
DELETE FROM snapshots s
WHERE EXISTS (
        SELECT 1 FROM generate_series(0, length(s.message_digests) / 16 - 1) AS i
        WHERE substr(s.message_digests, i * 16 + 1, 16) IN ({_BAD_BLOBS}))
  AND NOT EXISTS (
        SELECT 1 FROM sessions b WHERE b.pk = s.session_pk AND b.baseline = s.version AND b.baseline > 0)
"""

_DROP_UNUSED_BAD_BLOBS = f"""
DELETE FROM snapshot_blobs d
WHERE d.digest IN ({_BAD_BLOBS})
  AND NOT EXISTS (
        SELECT 1 FROM snapshots s, generate_series(0, length(s.message_digests) / 16 - 1) AS i
        WHERE substr(s.message_digests, i * 16 + 1, 16) = d.digest)
"""

_ADD_CHECK = (
    "ALTER TABLE snapshot_blobs ADD CONSTRAINT ck_snapshot_blobs_digest "
    "CHECK (digest = substr(sha256(body), 1, 16)) NOT VALID"
)
_DROP_CHECK = "ALTER TABLE snapshot_blobs DROP CONSTRAINT ck_snapshot_blobs_digest"


def upgrade() -> None:
    if _dialect() == "postgresql":
        # The snapshot writers' own lock (compaction and blob collection take it too): no
        # snapshot can start referring to a blob between the check and the deletes.
        op.execute("LOCK TABLE snapshots, snapshot_blobs IN EXCLUSIVE MODE")
        op.execute(_DROP_POISONED_SNAPSHOTS)
        op.execute(_DROP_UNUSED_BAD_BLOBS)
        op.execute(_ADD_CHECK)


def downgrade() -> None:
    if _dialect() == "postgresql":
        op.execute(_DROP_CHECK)


def _dialect() -> str:
    name = op.get_bind().dialect.name
    if name not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"eventstore supports PostgreSQL and SQLite, not {name}")
    return str(name)
