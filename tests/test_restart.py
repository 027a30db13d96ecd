"""PostgreSQL goes away under a writer: connections terminated, the server restarted.

What must hold:

- idle pooled connections killed behind the store's back are replaced silently (pool
  pre-ping): the next call just works;
- the call in flight when its connection dies raises ``StorageError(retryable=True)`` with a
  message a person can act on (never a raw driver error);
- a writer that retries exactly those errors with the same ``event_ids`` ends with every
  acknowledged event recorded exactly once, versions contiguous, the chain intact.

Terminations use ``pg_terminate_backend`` on the shared test server, aimed only at this
test's own connections (tagged with ``application_name``), so they are safe while anything
else runs (also under pytest-xdist). A real restart would hit every other test using the
shared server, so the restart tests get a **private PostgreSQL cluster** of their own
(``initdb`` in a temporary directory, its own port, ~1 s to create), restarted with
``pg_ctl restart -m fast`` and stopped with ``-m immediate`` (crash recovery on start).
"""

from __future__ import annotations

import logging
import os
import pwd
import random
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from conftest import pg_admin_url, wait_until
from eventstore.errors import EventStoreError, StorageError
from eventstore.samples import chat_session
from eventstore import EventStore

# --------------------------------------------------------------------------- a private cluster


class PrivateCluster:
    """A throwaway PostgreSQL cluster on a free loopback port, for tests that restart it.

    Uses the binaries and the ``run as owner`` prefix of the suite's server
    (``EVENTSTORE_TEST_PG_CTL``); ``auth``/``password`` set up password authentication.
    """

    def __init__(self, *, auth: str = "trust", password: str | None = None) -> None:
        pg_admin_url()  # fail (never skip) without the suite's server
        ctl = shlex.split(os.environ.get("EVENTSTORE_TEST_PG_CTL", ""))
        if not ctl:
            pytest.fail("EVENTSTORE_TEST_PG_CTL is not set: run the suite through scripts/with-postgres")
        self._prefix, self._pg_ctl = ctl[:-1], ctl[-1]
        bindir = os.path.dirname(self._pg_ctl)
        self.workdir = tempfile.mkdtemp(prefix="eventstore-private-pg.")
        os.chmod(self.workdir, 0o755)
        self.datadir = os.path.join(self.workdir, "data")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        args = [*self._prefix, os.path.join(bindir, "initdb"), "-D", self.datadir, "-U", "postgres",
                "-E", "UTF8", "--locale=C", "--no-sync", f"--auth={auth}"]
        if password is not None:
            pwfile = os.path.join(self.workdir, "pwfile")
            with open(pwfile, "w") as f:
                f.write(password)
            args += ["--pwfile", pwfile]
        if self._prefix:  # initdb runs as the server's owner, who must own the directory
            owner = pwd.getpwnam("postgres")
            for path in [self.workdir] + ([pwfile] if password is not None else []):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        self._run(args)
        self.start()

    def _run(self, args: list[str]) -> None:
        # Output to a file, never a pipe: a server started by pg_ctl inherits the pipe and
        # would hold it open for its whole life.
        log = os.path.join(self.workdir, "ctl.log")
        with open(log, "a") as out:
            r = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=120)
        if r.returncode != 0:
            with open(log) as f:
                pytest.fail(f"{' '.join(args)} failed: {f.read()[-2000:]}")

    def _ctl(self, *args: str) -> None:
        self._run([*self._prefix, self._pg_ctl, "-D", self.datadir, *args])

    def start(self) -> None:
        self._ctl("-l", os.path.join(self.workdir, "server.log"), "-w", "-t", "60",
                  "-o", f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.workdir}", "start")

    def restart(self) -> None:
        self._ctl("-l", os.path.join(self.workdir, "server.log"), "-m", "fast", "-w", "-t", "60", "restart")

    def crash(self) -> None:
        """Stop without a shutdown checkpoint; the next start runs crash recovery."""
        self._ctl("-m", "immediate", "-w", "stop")

    def url(self, user: str = "postgres", password: str | None = None) -> str:
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql+psycopg://{auth}@127.0.0.1:{self.port}/postgres"

    def close(self) -> None:
        try:
            self._ctl("-m", "immediate", "-w", "stop")
        except BaseException:  # noqa: BLE001 - already stopped
            pass
        shutil.rmtree(self.workdir, ignore_errors=True)


# --------------------------------------------------------------------------- helpers


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _tagged(url: str, tag: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={tag}"


def _terminate(admin: psycopg.Connection[Any], tag: str, *, busy_only: bool = False) -> int:
    states = "('active', 'idle in transaction')" if busy_only else "('active', 'idle', 'idle in transaction')"
    row = admin.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        f"WHERE application_name = %s AND pid <> pg_backend_pid() AND state IN {states}",
        (tag,),
    ).fetchone()
    return int(row[0]) if row else 0


def _assert_retryable(exc: BaseException) -> None:
    assert isinstance(exc, StorageError), f"{type(exc).__name__}: {exc}"
    assert exc.retryable is True, str(exc)
    assert "try again" in str(exc) and exc.__cause__ is not None


@dataclass
class Writer:
    """Appends small batches with event ids in a loop; retries retryable errors with the
    same ids (and the same expected version) until acknowledged."""

    store: EventStore
    session: str
    acked: list[str] = field(default_factory=list)
    retryable_errors: int = 0
    failures: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    max_retry_seconds: float = 60.0

    def run(self) -> None:
        head, i = 0, 0
        try:
            while not self.stop.is_set():
                n = 1 + i % 3
                ids = [f"{self.session}-{i}-{k}" for k in range(n)]
                actions = [{"type": "send", "id": ids[k], "text": f"message {i}.{k}"} for k in range(n)]
                deadline = time.monotonic() + self.max_retry_seconds
                while True:
                    try:
                        r = self.store.append(self.session, actions, expected_version=head, event_ids=ids)
                        break
                    except StorageError as exc:
                        if not exc.retryable or time.monotonic() > deadline:
                            raise
                        self.retryable_errors += 1
                        time.sleep(0.02)
                assert r.version == head + n and r.first_version == head + 1
                head = r.version
                self.acked += ids
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.failures.append(exc)

    def check(self) -> None:
        assert not self.failures, self.failures
        events = list(self.store.history(self.session))
        assert [e.event_id for e in events] == self.acked  # each exactly once, in order
        assert [e.version for e in events] == list(range(1, len(self.acked) + 1))
        assert self.store.head(self.session) == len(self.acked)
        assert self.store.verify(self.session).ok
        texts = [p["text"] for m in self.store.load(self.session).to_json()["messages"] for p in m["parts"]]
        assert len(texts) == len(self.acked)


# --------------------------------------------------------------------------- terminations


@pytest.fixture
def tag() -> str:
    return f"es-restart-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def admin() -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(_dsn(pg_admin_url()), autocommit=True) as conn:
        yield conn


@pytest.fixture
def pg_store(pg_schema: str, tag: str) -> Iterator[EventStore]:
    store = EventStore(_tagged(pg_schema, tag), snapshot_every=16)
    store.migrate()
    try:
        yield store
    finally:
        store.close()


def test_killed_idle_connections_are_replaced_silently(
    pg_store: EventStore, admin: psycopg.Connection[Any], tag: str
) -> None:
    pg_store.append("s", [{"type": "send", "id": "u-0", "text": "hi"}])
    for round_ in range(1, 4):
        assert _terminate(admin, tag) >= 1  # the pool's idle connection(s)
        # No error surfaces: pre-ping finds the dead connection and opens a new one.
        assert pg_store.head("s") == round_
        pg_store.append("s", [{"type": "stop"}], expected_version=round_)
        assert len(list(pg_store.history("s"))) == round_ + 1
    assert pg_store.verify("s").ok


def test_the_in_flight_append_gets_a_retryable_error_and_its_retry_lands_once(
    pg_schema: str,
    pg_store: EventStore,
    admin: psycopg.Connection[Any],
    tag: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    batch = chat_session(turns=12, seed=6)
    ids = [f"big-{i}" for i in range(len(batch))]
    pg_store.append("s", [{"type": "stop"}], expected_version=0)
    outcome: list[Any] = []

    def write() -> None:
        try:
            outcome.append(pg_store.append("s", batch, expected_version=1, event_ids=ids))
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    # The session's row held by another transaction: the append waits inside its own
    # transaction, where it is cut, however fast or slow this machine is.
    with psycopg.connect(_dsn(pg_schema)) as holder:
        holder.execute("SELECT 1 FROM sessions WHERE id = 's' FOR UPDATE")
        thread = threading.Thread(target=write)
        thread.start()
        deadline = time.monotonic() + 60  # only bounds a broken build's run
        waiting: list[Any] = []
        while thread.is_alive() and time.monotonic() < deadline and not waiting:
            waiting = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
                (tag,),
            ).fetchall()
            time.sleep(0.01)  # paces the polling only
        killed = _terminate(admin, tag, busy_only=True) if waiting else 0
        holder.rollback()
    thread.join(60)
    assert killed, "the append never waited for the held row"
    (result,) = outcome
    _assert_retryable(result)
    # Nothing of the batch was committed (the transaction died with its connection)...
    assert pg_store.head("s") == 1
    # ...the store recovered by itself, and the retry with the same ids lands exactly once.
    first = pg_store.append("s", batch, expected_version=1, event_ids=ids)
    assert not first.replayed and first.version == 1 + len(batch)
    again = pg_store.append("s", batch, expected_version=1, event_ids=ids)
    assert again.replayed and again == first
    assert [e.event_id for e in pg_store.history("s")][1:] == ids
    assert pg_store.verify("s").ok
    # The dead connection was dropped, not handed back to the pool to be rolled back (which
    # logs an ERROR with a driver traceback on the user's stderr).
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_writer_loop_survives_repeated_terminations_with_nothing_lost_or_doubled(
    pg_store: EventStore, admin: psycopg.Connection[Any], tag: str
) -> None:
    writer = Writer(pg_store, "loop")
    thread = threading.Thread(target=writer.run)
    thread.start()
    terminations = 0
    rng = random.Random(6)

    def seen_enough() -> bool:
        return len(writer.acked) > 20 and terminations >= 3 and writer.retryable_errors >= 1

    deadline = time.monotonic() + 60  # only bounds a broken build's run
    try:
        while thread.is_alive() and not seen_enough() and time.monotonic() < deadline:
            # A few tens of milliseconds after the writer's last acknowledged batch, kill
            # whatever the store has: idle pooled connections (pre-ping must replace them)
            # and the one inside an append. Waiting for an acknowledgement first keeps a
            # loaded machine's slow reconnects from being killed again before any write.
            acked = len(writer.acked)
            wait_until(
                lambda: len(writer.acked) > acked or not thread.is_alive(),
                f"no batch acknowledged since the last termination ({writer.retryable_errors} retries)",
            )
            time.sleep(rng.uniform(0.02, 0.08))
            terminations += _terminate(admin, tag)
    finally:
        writer.stop.set()
        thread.join(90)
    assert not thread.is_alive()
    writer.check()
    assert seen_enough(), (len(writer.acked), terminations, writer.retryable_errors)


# --------------------------------------------------------------------------- real restarts


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    c = PrivateCluster()
    try:
        yield c
    finally:
        c.close()


def _until_acked(writer: Writer, n: int) -> None:
    deadline = time.monotonic() + 60
    while len(writer.acked) < n:
        assert time.monotonic() < deadline, f"the writer acknowledged {len(writer.acked)} of {n}: {writer.failures}"
        time.sleep(0.01)


def test_a_writer_loop_survives_server_restarts_and_a_crash(cluster: PrivateCluster) -> None:
    store = EventStore(cluster.url(), snapshot_every=16)
    store.migrate()
    session = f"restart-{uuid.uuid4().hex[:8]}"
    writer = Writer(store, session)
    thread = threading.Thread(target=writer.run)
    thread.start()
    try:
        for stop in (cluster.restart, lambda: (cluster.crash(), cluster.start())):
            _until_acked(writer, len(writer.acked) + 5)  # writing before the outage
            before = len(writer.acked)
            stop()
            _until_acked(writer, before + 5)  # and writing again after it
            assert thread.is_alive(), writer.failures
    finally:
        writer.stop.set()
        thread.join(120)
    try:
        assert not thread.is_alive()
        writer.check()
        assert writer.retryable_errors >= 2  # at least one per outage
        # A fresh store after all this sees exactly the same log.
        with EventStore(cluster.url()) as fresh:
            assert [e.event_id for e in fresh.history(session)] == writer.acked
    finally:
        store.close()


def test_a_call_while_the_server_is_down_is_a_clear_retryable_error(cluster: PrivateCluster) -> None:
    store = EventStore(cluster.url())
    store.migrate()
    store.append("down", [{"type": "stop"}])
    cluster.crash()
    try:
        for call in (lambda: store.head("down"), lambda: store.append("down", [{"type": "stop"}], event_ids=["x"])):
            with pytest.raises(EventStoreError) as info:
                call()
            _assert_retryable(info.value)
            assert f":{cluster.port}" in str(info.value)  # names the database it could not reach
    finally:
        cluster.start()
    # Back up: the same store works again without being reopened; the retry lands once.
    assert store.head("down") == 1
    assert store.append("down", [{"type": "stop"}], event_ids=["x"]).version == 2
    assert store.append("down", [{"type": "stop"}], event_ids=["x"]).replayed
    store.close()
