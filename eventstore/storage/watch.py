"""The change watcher both backends share: one daemon thread around a backend's probe.

A backend supplies a :class:`Probe`: how to open its dedicated connection, and how to wait
on it for a sign that something was committed (PostgreSQL: a notification on a LISTEN
connection; SQLite: ``PRAGMA data_version`` moving). The thread turns every sign into a new
*generation*; readers block in :meth:`ThreadWatcher.wait` until the generation moves.

When the connection is lost the watcher says so (``healthy`` false), wakes every reader
(commits may have been missed) and reconnects with a back-off; meanwhile :meth:`wait`
returns every ``fallback_poll`` seconds, so readers poll until the watcher is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

from .base import AsyncChangeWatcher, ChangeWatcher

__all__ = ["Probe", "ThreadWatcher", "AsyncProbe", "TaskWatcher"]


class Probe(ABC):
    """A backend's way of noticing commits on a dedicated connection."""

    @abstractmethod
    def connect(self) -> Any:
        """Open the dedicated connection and start watching (e.g. LISTEN)."""

    @abstractmethod
    def changed(self, handle: Any, timeout: float, stop: threading.Event) -> bool:
        """Wait up to ``timeout`` seconds (less once ``stop`` is set) for a sign of a
        commit on ``handle``; ``True`` when one came. Raises when the connection is lost."""

    @abstractmethod
    def close(self, handle: Any) -> None:
        """Close the dedicated connection (never raises)."""


class ThreadWatcher(ChangeWatcher):
    """A :class:`ChangeWatcher` run by one daemon thread, started by the first reader.

    Args:
        probe: the backend's probe.
        name: the thread's name.
        interval: how long one probe wait lasts (bounds how late :meth:`close` returns).
        fallback_poll: while the connection is down, :meth:`wait` returns this often.
    """

    def __init__(self, probe: Probe, *, name: str, interval: float = 0.2, fallback_poll: float = 0.25) -> None:
        self._probe = probe
        self._name = name
        self._interval = interval
        self._fallback = fallback_poll
        self._cond = threading.Condition()
        self._gen = 0
        self._healthy = False
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    @property
    def healthy(self) -> bool:
        """Whether the dedicated connection is up (else readers poll)."""
        return self._healthy

    def _ensure_started(self) -> None:
        if self._thread is not None or self._stop.is_set():
            return
        with self._start_lock:
            if self._thread is None and not self._stop.is_set():
                t = threading.Thread(target=self._run, name=self._name, daemon=True)
                t.start()
                self._thread = t
        # A reader's generation must be noted while the watcher watches; a first connect
        # that fails leaves it unhealthy, and readers poll.
        self._ready.wait(10.0)

    def _bump(self, healthy: bool | None = None) -> None:
        with self._cond:
            self._gen += 1
            if healthy is not None:
                self._healthy = healthy
            self._cond.notify_all()

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            handle: Any = None
            try:
                handle = self._probe.connect()
                # Commits may have happened while no one watched.
                self._bump(healthy=True)
                self._ready.set()
                backoff = 0.05
                while not self._stop.is_set():
                    if self._probe.changed(handle, self._interval, self._stop):
                        self._bump()
            except Exception:  # noqa: BLE001 - any failure: readers poll, we reconnect
                self._bump(healthy=False)
                self._ready.set()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                if handle is not None:
                    self._probe.close(handle)

    def generation(self) -> int:
        self._ensure_started()
        return self._gen

    def wait(self, seen: int, timeout: float | None) -> int:
        self._ensure_started()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._gen == seen:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                if not self._healthy or self._stop.is_set():
                    # Polling fallback: let the reader look again this often.
                    self._cond.wait(self._fallback if left is None else min(left, self._fallback))
                    break
                self._cond.wait(left)
            return self._gen

    def wake(self) -> None:
        self._bump()

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(self._interval + 2.0)


class AsyncProbe(ABC):
    """The asyncio twin of :class:`Probe`."""

    @abstractmethod
    async def connect(self) -> Any:
        """Open the dedicated connection and start watching."""

    @abstractmethod
    async def changed(self, handle: Any, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a sign of a commit; raise when the
        connection is lost."""

    @abstractmethod
    async def close(self, handle: Any) -> None:
        """Close the dedicated connection (never raises)."""


class TaskWatcher(AsyncChangeWatcher):
    """The asyncio twin of :class:`ThreadWatcher`: one task on the store's event loop,
    started by the first reader, with the same generation protocol and polling fallback.
    """

    def __init__(self, probe: AsyncProbe, *, interval: float = 0.2, fallback_poll: float = 0.25) -> None:
        self._probe = probe
        self._interval = interval
        self._fallback = fallback_poll
        self._gen = 0
        self._healthy = False
        self._closed = False
        self._changed: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def _bump(self, healthy: bool | None = None) -> None:
        self._gen += 1
        if healthy is not None:
            self._healthy = healthy
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    async def _ensure_started(self) -> None:
        if self._task is None and not self._closed:
            self._changed = asyncio.Event()
            self._ready = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        if self._ready is not None and not self._closed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ready.wait(), 10.0)

    async def _run(self) -> None:
        assert self._ready is not None
        backoff = 0.05
        while not self._closed:
            handle: Any = None
            try:
                handle = await self._probe.connect()
                self._bump(healthy=True)  # commits may have happened while no one watched
                self._ready.set()
                backoff = 0.05
                while not self._closed:
                    if await self._probe.changed(handle, self._interval):
                        self._bump()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - any failure: readers poll, we reconnect
                self._bump(healthy=False)
                self._ready.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                if handle is not None:
                    await self._probe.close(handle)

    async def generation(self) -> int:
        """As :meth:`ThreadWatcher.generation`."""
        await self._ensure_started()
        return self._gen

    async def wait(self, seen: int, timeout: float | None) -> int:
        """As :meth:`ThreadWatcher.wait`, without blocking the event loop."""
        await self._ensure_started()
        if self._gen != seen or self._changed is None:
            return self._gen
        if not self._healthy or self._closed:
            timeout = self._fallback if timeout is None else min(timeout, self._fallback)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)
        return self._gen

    def wake(self) -> None:
        """Wake every reader now."""
        self._bump()

    async def close(self) -> None:
        """Stop the task and close its connection."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
