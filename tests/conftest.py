"""Shared fixtures: every store test runs on SQLite and on a real PostgreSQL server.

`make test` starts a throwaway PostgreSQL server (scripts/with-postgres) and exports
EVENTSTORE_TEST_PG_URL. Without it, PostgreSQL-backed tests *fail*: they never skip,
so a run that could not start the server can never pass as green.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings

import db_templates as templates

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

BACKENDS = ["sqlite", "postgresql"]
PG_URL_ENV = "EVENTSTORE_TEST_PG_URL"
#: A third backend id for the store contract suite only: PostgreSQL whose event and
#: snapshot tables `migrate` creates hash-partitioned by session (4 partitions).
PARTITIONED = "postgresql-partitioned"


def pg_admin_url() -> str:
    """The URL of the test server's superuser, or a test failure when there is none."""
    url = os.environ.get(PG_URL_ENV)
    if not url:
        pytest.fail(
            f"{PG_URL_ENV} is not set: PostgreSQL tests need the server that `make test` starts "
            "(scripts/with-postgres). They fail rather than skip.",
            pytrace=False,
        )
    return url


def _psycopg_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture
def pg_schema(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty PostgreSQL schema for one test; yields a URL whose search_path is it.
    The first migrated store on it (:func:`make_store`) replays the template instead of
    Alembic, unless the test is marked ``migrations``."""
    admin = pg_admin_url()
    dsn = _psycopg_dsn(admin)
    schema = f"t_{uuid.uuid4().hex[:16]}"
    templates.admin_execute(dsn, f'CREATE SCHEMA "{schema}"')
    if not request.node.get_closest_marker("migrations"):
        templates.offer(schema)
    sep = "&" if "?" in admin else "?"
    try:
        yield f"{admin}{sep}options=-csearch_path%3D{schema}"
    finally:
        templates.withdraw(schema)
        templates.admin_execute(dsn, f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(scope="session", autouse=True)
def _templates() -> Iterator[None]:
    """Drop this worker's template schemas and files when its tests are done."""
    yield
    templates.close()


#: The pytest-xdist group (``--dist loadgroup``, see pyproject.toml) of the tests that stop,
#: pause or read the suite's one streaming replica: they run one after another on one
#: worker, and no other test touches the replica. A test is in it when it takes the
#: ``replica_url`` fixture or lives in test_replicas.py; any other test that reaches the
#: replica says so with ``@pytest.mark.xdist_group(REPLICA_GROUP)``.
REPLICA_GROUP = "pg-replica"


#: Modules whose every test runs in the serial phase: they restart or stop servers
#: (private clusters, the replica) or kill processes and connections. Among themselves
#: only the replica's tests need to run one at a time (some stop it or pause its replay);
#: the others touch only their own clusters, processes and connections. They mostly wait
#: (restarts, kills, replays): beside the workers, their waits overlap the workers' work.
SERIAL_MODULES = {"test_replicas", "test_restart", "test_crash", "test_follow_feed"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``serial`` (scripts/run-tests runs them one at a time, beside the parallel phase
    and on servers of their own) every test of the streaming replica and of
    :data:`SERIAL_MODULES`, keep the replica's in :data:`REPLICA_GROUP` for a run with
    ``--dist loadgroup``, and put ``slow`` tests first."""
    for item in items:
        module = getattr(item, "module", None)
        name = module.__name__ if module is not None else ""
        replica = "replica_url" in getattr(item, "fixturenames", ()) or name == "test_replicas"
        if replica:
            item.add_marker(pytest.mark.xdist_group(REPLICA_GROUP))
        if replica or name in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
    # pytest-xdist hands tests out in this order: the slow ones (the Agents SDK's own
    # tests, multi-process writers, a package install) start first rather than leave one
    # worker busy alone at the end. The sort is stable: the rest keep their order.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


#: The two forms of the store a module marked ``twins`` runs against.
TWINS = ["sync", "async"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test of a module marked ``twins`` on the sync store and on the async twin."""
    if "twin" in metafunc.fixturenames and metafunc.definition.get_closest_marker("twins"):
        metafunc.parametrize("twin", TWINS, indirect=True)


@pytest.fixture
def twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``"sync"``, or ``"async"``: the test module's ``EventStore`` and ``make_store`` are
    then the async twin driven through its sync-shaped test adapter (tests/twins.py)."""
    kind = str(getattr(request, "param", "sync"))
    if kind == "async":
        from twins import BlockingAsyncStore, make_async_store

        for name, twin_of in (("EventStore", BlockingAsyncStore), ("make_store", make_async_store)):
            if hasattr(request.module, name):
                monkeypatch.setattr(request.module, name, twin_of)
    return kind


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A URL to an empty database of the parametrized backend, private to this test."""
    if backend == "sqlite":
        path = str(tmp_path / "events.db")
        if not request.node.get_closest_marker("migrations"):
            templates.offer(path)
        return f"sqlite:///{path}"
    url = str(request.getfixturevalue("pg_schema"))
    if backend == PARTITIONED:
        # The server setting `migrate` honours when no `partitions` option is given, so
        # every store a test opens on this URL sees the same partitioned schema.
        url += "%20-ceventstore.partitions%3D4"
    return url


def make_store(url: str, **options: object) -> "EventStore":
    """An EventStore on ``url`` with the schema migrated (copied from the template when
    ``url`` is this test's untouched database: see tests/db_templates.py)."""
    from eventstore import EventStore

    return templates.migrated(EventStore, url, **options)


def wait_until(ready: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Poll ``ready()`` until it is true, or fail saying ``what`` never came. ``timeout``
    only bounds a broken build's wait: a test never relies on it running out."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.01)  # paces the polling only


async def await_until(ready: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """:func:`wait_until` for a coroutine: polls between turns of the event loop."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.01)  # paces the polling only


@pytest.fixture
def store(db_url: str, twin: str, request: pytest.FixtureRequest) -> Iterator["EventStore"]:
    """A migrated EventStore on a private database of the parametrized backend (the async
    twin behind its test adapter in the ``async`` run of a module marked ``twins``);
    ``seal=False`` for a test marked ``unsealed``."""
    options = {"seal": False} if request.node.get_closest_marker("unsealed") else {}
    if twin == "async":
        from twins import make_async_store

        s: Any = make_async_store(db_url, **options)
    else:
        s = make_store(db_url, **options)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def raw_engine(db_url: str) -> Iterator["Engine"]:
    """A plain SQLAlchemy engine on the same database, for raw SQL (tampering, checks)."""
    from sqlalchemy import create_engine

    url = db_url
    engine = create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


if TYPE_CHECKING:
    from sqlalchemy import Engine

    from eventstore import EventStore
