"""The change watcher both backends share: one daemon thread around a backend's probe.

A backend supplies a :class:`Probe`: how to open its dedicated connection, and how to wait
on it for a sign that something was committed (PostgreSQL: a notification on a LISTEN
connection; SQLite: ``PRAGMA data_version`` moving). The thread turns every sign into a new
*generation*; readers block in :meth:`ThreadWatcher.wait` until the generation moves.

When the connection is lost the watcher says so (``healthy`` false), wakes every reader
(commits may have been missed) and reconnects with a back-off; meanwhile :meth:`wait`
returns every ``fallback_poll`` seconds, so readers poll until the watcher is back.
A watcher given a ``safety_poll`` also returns that often while healthy: on PostgreSQL the
sign is sent after the commit, not by it, so a writer that commits without sending one
(raw SQL, a process killed between its commit and its sign) is found within that time.

:class:`Notifier` is the sending side of PostgreSQL's sign: writers mark their commits and
one thread per storage sends one sign for every commit marked while it was sending.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import time
import weakref
from abc import ABC, abstractmethod
from typing import Any

from eventstore.storage.interface import AsyncChangeWatcher, ChangeWatcher

__all__ = ["Probe", "ThreadWatcher", "AsyncProbe", "TaskWatcher", "Signal", "Notifier"]

#: The longest a sync reader waits for a change in one go (s): it then checks again, so a
#: waiting main thread runs a pending signal handler (Ctrl-C) at least this often.
_SIGNAL_CHECK = 0.5


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
        safety_poll: while it is up, :meth:`wait` returns at least this often (``None``:
            only on a sign; for probes that see every commit).
    """

    def __init__(
        self,
        probe: Probe,
        *,
        name: str,
        interval: float = 0.2,
        fallback_poll: float = 0.25,
        safety_poll: float | None = None,
    ) -> None:
        self._probe = probe
        self._name = name
        self._interval = interval
        self._fallback = fallback_poll
        self._safety = safety_poll
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
        timeout = _capped(timeout, self._safety)
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
                # Never one untimed wait: a signal (Ctrl-C) the kernel hands to another thread
                # only reaches the main thread's handler once that thread runs Python again.
                self._cond.wait(_SIGNAL_CHECK if left is None else min(left, _SIGNAL_CHECK))
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

    def __init__(
        self,
        probe: AsyncProbe,
        *,
        interval: float = 0.2,
        fallback_poll: float = 0.25,
        safety_poll: float | None = None,
    ) -> None:
        self._probe = probe
        self._interval = interval
        self._fallback = fallback_poll
        self._safety = safety_poll
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
        timeout = _capped(timeout, self._fallback if not self._healthy or self._closed else self._safety)
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


def _capped(timeout: float | None, cap: float | None) -> float | None:
    """``timeout`` (``None``: no limit) at most ``cap`` (``None``: no cap)."""
    if cap is None:
        return timeout
    return cap if timeout is None else min(timeout, cap)


class Signal(ABC):
    """A backend's way of telling other processes that something was committed: a sign
    is started without waiting for the server, then waited for by the notifier's thread."""

    @abstractmethod
    def connect(self) -> Any:
        """Open the dedicated connection the signs are sent on."""

    @abstractmethod
    def start(self, handle: Any) -> None:
        """Send one sign on ``handle`` without waiting for its result (raises when the
        connection is lost). Never called while another sign is in flight."""

    @abstractmethod
    def finish(self, handle: Any, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the sign in flight to be done; ``True`` when
        it is. Raises when the connection is lost or the sign failed."""

    @abstractmethod
    def close(self, handle: Any) -> None:
        """Close the dedicated connection (never raises)."""

    def summarize_feed_index(self, handle: Any, *, final: bool) -> None:
        """Summarize what the commits added to the feed's index, without slowing the writers
        (PostgreSQL: the BRIN index's newly complete ranges; nothing by default): run on the
        notifier's thread after a sign, before another one can start, and once more
        (``final``) when no commit came for a while. Raises, like :meth:`finish`, only when
        the connection is lost."""


# Notifiers still open: a process that exits without closing its store sends its last sign.
_OPEN: weakref.WeakSet[Notifier] = weakref.WeakSet()


@atexit.register
def _flush_open_notifiers() -> None:
    for notifier in list(_OPEN):
        notifier.close()


class Notifier:
    """Sends a sign after commits on a connection of its own, coalescing them.

    A writer calls :meth:`mark` once its transaction has committed. When no sign is in
    flight and the last one started at least ``spacing`` seconds ago, the writer's thread
    sends one at once without waiting for the server (no hand-over to another thread on
    the way: under load a woken thread waits for the interpreter lock); otherwise the
    commit is noted and one more sign follows when the one in flight is done and
    ``spacing`` has passed. The spacing is what keeps a busy writer from paying a sign per
    commit: each is a transaction of its own on the server and a wake-up of this thread,
    together more than the append statement itself; a few milliseconds later is nothing
    to a follower (who reads on at every sign, and finds every commit since). A thread of the notifier's own (started on demand,
    gone after ``thread_idle_timeout`` seconds without a mark) waits for each sign's result,
    summarizes the feed's index (:meth:`Signal.summarize_feed_index`) between signs,
    connects and reconnects: at most
    one sign per commit, far fewer under load, and none inside a writer's transaction (on
    PostgreSQL a transaction that notifies holds a database-wide lock through its commit,
    which would serialise every writer). A sign that cannot be sent is retried with a
    back-off on a new connection; readers meanwhile find the commits by their own polling.

    Args:
        signal: the backend's signal.
        name: the thread's name.
        thread_idle_timeout: how long the idle thread waits for the next mark before it ends.
        flush_timeout: how long :meth:`close` waits for the signs still due.
        spacing: the least time between the starts of two signs (``close`` does not wait it).
    """

    def __init__(
        self,
        signal: Signal,
        *,
        name: str,
        thread_idle_timeout: float = 0.5,
        flush_timeout: float = 5.0,
        spacing: float = 0.005,
    ) -> None:
        self._signal = signal
        self._spacing = spacing
        self._next_at = 0.0  # monotonic: no sign starts before it
        self._name = name
        self._thread_idle_timeout = thread_idle_timeout
        self._flush_timeout = flush_timeout
        self._cond = threading.Condition()
        self._dirty = False  # a commit no sign in flight or sent covers
        self._inflight = False
        self._running = False
        self._closed = False
        self._handle: Any = None
        _OPEN.add(self)

    def mark(self) -> None:
        """Something was committed: send a sign now or soon (never waits for the server)."""
        with self._cond:
            if self._closed:
                return
            was_dirty = self._dirty
            if (
                self._inflight
                or self._handle is None
                or time.monotonic() < self._next_at
                or not self._start()
            ):
                self._dirty = True
            if self._running:
                # A commit already noted was told to the thread then: one wake-up per sign.
                if not was_dirty:
                    self._cond.notify()
                return
            self._running = True
        threading.Thread(target=self._run, name=self._name, daemon=True).start()

    def _start(self) -> bool:
        """Start a sign (holding the lock); ``False`` when the connection failed."""
        try:
            self._signal.start(self._handle)
        except Exception:  # noqa: BLE001 - the thread reconnects
            self._drop()
            return False
        self._dirty, self._inflight = False, True
        self._next_at = time.monotonic() + self._spacing
        return True

    def _run(self) -> None:
        backoff = 0.05
        summarized = True  # no sign since the index was last summarized
        while True:
            final = False
            with self._cond:
                if not (self._dirty or self._inflight or self._closed):
                    self._cond.wait(self._thread_idle_timeout)
                while self._dirty and not (self._inflight or self._closed):
                    delay = self._next_at - time.monotonic()
                    if delay <= 0:
                        break
                    self._cond.wait(delay)
                if not (self._dirty or self._inflight):
                    if summarized or self._closed or self._handle is None:
                        self._stopped()
                        return
                    # Quiet for a while: summarize what a burst of commits left, then stop. The
                    # connection is reserved as for a sign, so no writer starts one meanwhile.
                    final = self._inflight = True
                handle = self._handle
            try:
                if handle is None:
                    handle = self._signal.connect()
                    with self._cond:
                        self._handle = handle
                with self._cond:
                    if self._dirty and not self._inflight and not self._start():
                        raise ConnectionError("the sign could not be sent")
                    inflight = self._inflight
                while inflight and not final and not self._signal.finish(handle, 1.0):
                    pass
                if inflight:  # still marked in flight: no writer starts a sign meanwhile
                    self._signal.summarize_feed_index(handle, final=final)
                    summarized = final
                with self._cond:
                    self._inflight = False
                backoff = 0.05
            except Exception:  # noqa: BLE001 - any failure: reconnect and send again
                with self._cond:
                    self._drop()
                    self._dirty, self._inflight = True, False
                    if self._closed:
                        self._stopped()
                        return
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _stopped(self) -> None:
        """The thread ends (called holding the lock)."""
        self._running = False
        if self._closed:
            self._drop()
        self._cond.notify_all()

    def _drop(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            self._signal.close(handle)

    def close(self) -> None:
        """Send the signs still due (waiting at most ``flush_timeout`` seconds), then
        close the connection; later marks are ignored."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._running, self._flush_timeout)
            if not self._running:
                self._drop()
        _OPEN.discard(self)
