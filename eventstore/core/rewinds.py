"""Rewind: the record of one and the rules that name sessions and events around it.

A rewind of session ``s`` to version ``v`` writes no event and copies none. The row that
held ``s`` (and every event it recorded) is renamed to the kept id ``s~n`` and closed to
writes; a new row takes the id ``s``, a branch of the kept row at ``v``. So:

- every event keeps its row, its version, its hash and its feed position;
- an event is reported under the id of the session it was appended to (``s`` for every
  event of the kept line, since nothing can be appended to a kept line), so ``history``
  of ``s`` and of ``s~n`` report exactly what ``history`` of ``s`` reported before, up to
  their ends;
- ``sessions()`` reports the kept line as the branch (parent ``s``, fork version ``v``)
  and ``s`` with the parent it had before; a branch made from ``s`` before the rewind
  still names ``s`` as its parent.

Everything here is pure: the storage reads the records, the engine asks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from eventstore.core.rows import RewindRow, SessionRow

__all__ = [
    "Rewinds",
    "is_kept_line",
    "kept_id",
    "kept_reason",
]

_KEPT_NUMBER = re.compile(r"~([0-9]+)\Z")


def kept_id(session: str, taken: Iterable[str]) -> str:
    """The id of the next line kept from ``session``: ``"{session}~{n}"`` with ``n`` one
    past the highest already used (``taken``: the kept ids recorded for it)."""
    n = 0
    prefix = session + "~"
    for t in taken:
        m = _KEPT_NUMBER.search(t)
        if t.startswith(prefix) and m is not None and m.start() == len(session):
            n = max(n, int(m.group(1)))
    return f"{session}~{n + 1}"


def is_kept_line(session: str, parent: str | None) -> bool:
    """Whether ``session``, listed with ``parent``, is a line a rewind of ``parent`` kept
    (its id is ``parent~N``; no other session can have such an id)."""
    if parent is None or not session.startswith(parent + "~"):
        return False
    m = _KEPT_NUMBER.search(session)
    return m is not None and m.start() == len(parent)


def kept_reason(session: str, to: int) -> str:
    """The closed reason of a kept line (it takes no more events)."""
    return f"kept line of {session!r}, rewound to version {to}"


class Rewinds:
    """The rewind records that concern a set of rows, indexed for naming.

    Args:
        records: rewind rows (any order).
    """

    def __init__(self, records: Iterable[RewindRow]) -> None:
        self.by_kept: dict[int, RewindRow] = {r.kept_pk: r for r in records}
        self.by_new: dict[int, RewindRow] = {r.new_pk: r for r in self.by_kept.values()}

    def __bool__(self) -> bool:
        return bool(self.by_kept)

    def event_names(self, names: Mapping[int, str]) -> dict[int, str]:
        """``names`` (row pk → current id) with each kept line's row named by the id its
        events were appended to."""
        out = dict(names)
        for pk in out:
            r = self.by_kept.get(pk)
            if r is not None:
                out[pk] = r.session_id
        return out

    def parent(self, row: SessionRow, rows: Mapping[int, SessionRow]) -> tuple[str | None, int | None]:
        """What ``sessions()`` reports as a row's ``(parent, fork_version)``.

        A kept line: the id it was rewound away from, at the version it was rewound to. A
        row a rewind made: the parent the rewound row had before. Any other branch: its
        parent's id as it was when the branch was made (row pks grow, and the rewind
        locks the row it renames, so a branch made before the rename has the lower pk).
        """
        r = self.by_kept.get(row.pk)
        if r is not None:
            return r.session_id, r.to_version
        # A row a rewind made stands where the rewound row stood (which may itself have
        # been made by an earlier rewind of the same id).
        while (made := self.by_new.get(row.pk)) is not None and made.kept_pk in rows:
            row = rows[made.kept_pk]
        return self._named_parent(row, rows), row.fork_version

    def _named_parent(self, row: SessionRow, rows: Mapping[int, SessionRow]) -> str | None:
        if row.parent_pk is None:
            return None
        parent = rows.get(row.parent_pk)
        if parent is None:
            return None
        r = self.by_kept.get(parent.pk)
        if r is not None and row.pk < r.new_pk:
            return r.session_id
        return parent.id
