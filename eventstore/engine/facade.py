"""What the two public facades share: the engine under them and its settings.

:class:`~eventstore.EventStore` and :class:`~eventstore.AsyncEventStore` differ only in
how their methods call the engine (directly, or awaited on the event loop); both are
built on one :class:`~eventstore.engine.engine.Engine`, opened here with the same arguments.
"""

from __future__ import annotations

from typing import Any

from eventstore.engine.engine import DEFAULT_SNAPSHOT_EVERY, Engine
from eventstore.engine.sealer import SealPolicy

__all__ = ["StoreBase"]


class StoreBase:
    """The constructor and read-only settings of both facades (not used on its own): each
    facade adds only its writers (:meth:`_open_writers`)."""

    #: Open the storage with asyncio drivers (the async facade sets this).
    _asyncio_storage = False

    def __init__(
        self,
        url: str,
        *,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        max_event_bytes: int = 1 << 20,
        max_id_length: int = 256,
        seal: bool | SealPolicy = True,
        **storage_options: Any,
    ) -> None:
        if self._asyncio_storage:
            storage_options["use_asyncio"] = True
        self._engine = Engine(
            url,
            snapshot_every=snapshot_every,
            max_event_bytes=max_event_bytes,
            max_id_length=max_id_length,
            seal=seal,
            **storage_options,
        )
        self._open_writers()

    def _open_writers(self) -> None:
        """Open what each facade writes through beside the engine (its turn writer; the
        async one's group commit too)."""
        raise NotImplementedError

    @property
    def url(self) -> str:
        """The database URL with any password masked."""
        return self._engine.storage.safe_url

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._engine.storage.dialect

    @property
    def read_counts(self) -> dict[str, int]:
        """How many reads went to a replica and how many to the primary (``{}`` for a
        store without ``replicas``): for monitoring, and to see that reads are offloaded."""
        return dict(getattr(self._engine.storage, "reads", {}))

    @property
    def snapshot_every(self) -> int:
        """How often (in versions) the state is stored as a snapshot."""
        return self._engine.snapshot_every

    @property
    def max_event_bytes(self) -> int:
        """The largest encoded action (and metadata) accepted."""
        return self._engine.validate.limits.max_event_bytes

    @property
    def max_id_length(self) -> int:
        """The longest session id, event id or actor accepted."""
        return self._engine.validate.limits.max_id_length

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, snapshot_every={self.snapshot_every})"
