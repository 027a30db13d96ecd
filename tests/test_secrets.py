"""Secrets: a database password never appears in an error message, a traceback, a log record
or CLI output — neither against a port where nothing listens nor against a server that
rejects the password (a private PostgreSQL cluster with scram-sha-256 authentication)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest

from eventstore.errors import EventStoreError, StorageError
from eventstore import EventStore
from test_restart import PrivateCluster

PASSWORD = "S3cr3t-pw!x"  # distinctive, and with a character that URLs must escape
WRONG = "Wr0ng-pw#y"
FORMS = {PASSWORD, quote(PASSWORD, safe=""), WRONG, quote(WRONG, safe="")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _leaks(text: str) -> list[str]:
    return [form for form in FORMS if form in text]


def _everything_about(exc: BaseException) -> str:
    """The message, repr, structured context and the whole chained traceback."""
    parts = [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    if isinstance(exc, StorageError):
        parts.append(repr(exc.context))
    return "\n".join(parts)


def _calls(store: EventStore) -> list[Any]:
    return [
        store.migrate,
        lambda: store.append("s", [{"type": "stop"}], event_ids=["e"]),
        lambda: store.head("s"),
        lambda: store.load("s"),
        lambda: list(store.history("s")),
        store.sessions,
        lambda: store.verify(),
        lambda: store.branch("s", at=0, new_id="b"),
    ]


@pytest.fixture
def all_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every log record at DEBUG, the SQLAlchemy engine's and pool's included."""
    caplog.set_level(logging.DEBUG)
    for name in ("sqlalchemy.engine", "sqlalchemy.pool", "sqlalchemy.dialects", "psycopg", "eventstore"):
        caplog.set_level(logging.DEBUG, logger=name)
    yield caplog


def _check_store(url: str, logs: pytest.LogCaptureFixture) -> list[StorageError]:
    store = EventStore(url)
    assert not _leaks(repr(store)) and not _leaks(store.url) and "***" in unquote(store.url)
    errors = []
    for call in _calls(store):
        with pytest.raises(EventStoreError) as info:
            call()
        assert isinstance(info.value, StorageError), f"{type(info.value).__name__}: {info.value}"
        assert not _leaks(_everything_about(info.value)), _everything_about(info.value)
        errors.append(info.value)
    store.close()
    for record in logs.records:
        text = record.getMessage() + (record.exc_text or "") + repr(record.args)
        assert not _leaks(text), text
    return errors


def test_unreachable_server_errors_and_logs_hide_the_password(all_logs: pytest.LogCaptureFixture) -> None:
    url = f"postgresql+psycopg://app:{quote(PASSWORD, safe='')}@127.0.0.1:{_free_port()}/chat?connect_timeout=3"
    errors = _check_store(url, all_logs)
    for exc in errors:
        assert exc.retryable  # nothing listens *yet*: trying again later may work
        assert "127.0.0.1" in str(exc) and "app:***@" in str(exc)


def test_a_password_in_the_query_string_is_hidden_too(all_logs: pytest.LogCaptureFixture) -> None:
    # libpq also takes the password as a URI parameter.
    url = f"postgresql+psycopg://app@127.0.0.1:{_free_port()}/chat?password={quote(PASSWORD, safe='')}&connect_timeout=3"
    _check_store(url, all_logs)


@pytest.fixture(scope="module")
def scram_cluster() -> Iterator[PrivateCluster]:
    c = PrivateCluster(auth="scram-sha-256", password=PASSWORD)
    try:
        yield c
    finally:
        c.close()


def test_a_rejected_password_is_a_clear_error_without_the_password(
    scram_cluster: PrivateCluster, all_logs: pytest.LogCaptureFixture
) -> None:
    # The right password works (so the failure below really is about the password)...
    with EventStore(scram_cluster.url("postgres", quote(PASSWORD, safe=""))) as ok:
        ok.migrate()
        ok.append("s", [{"type": "stop"}])
    # ...the wrong one is refused, and neither appears anywhere.
    errors = _check_store(scram_cluster.url("postgres", quote(WRONG, safe="")), all_logs)
    assert all("password authentication failed" in str(e) for e in errors), errors[0]
    # Trying again cannot help: the caller must fix its configuration, not retry.
    assert not any(e.retryable for e in errors)


def _cli(args: list[str], env_url: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "eventstore"
    env = {k: v for k, v in os.environ.items() if k != "EVENTSTORE_URL"}
    if env_url is not None:
        env["EVENTSTORE_URL"] = env_url
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=60)


def _cli_in_process(args: list[str]) -> tuple[int, str, str]:
    from typer.testing import CliRunner

    from eventstore_cli.app import app

    r = CliRunner().invoke(app, args, input="[]")
    return r.exit_code, r.stdout, r.stderr


def _bad_urls(cluster: PrivateCluster) -> list[str]:
    port = _free_port()
    return [
        f"postgresql+psycopg://app:{quote(PASSWORD, safe='')}@127.0.0.1:{port}/chat?connect_timeout=3",
        f"postgresql+psycopg://app@127.0.0.1:{port}/chat?password={quote(PASSWORD, safe='')}&connect_timeout=3",
        cluster.url("postgres", quote(WRONG, safe="")),
    ]


COMMANDS = [
    ["migrate"], ["sessions"], ["sessions", "--json"], ["history", "s"], ["checkout", "s", "--json"],
    ["verify"], ["verify", "s", "--json"], ["append", "s", "-"], ["branch", "s"], ["export", "s"],
]


def test_cli_errors_never_show_the_password(scram_cluster: PrivateCluster) -> None:
    for url in _bad_urls(scram_cluster):
        for command in COMMANDS:
            code, out, err = _cli_in_process([f"--db={url}", *command])
            assert code == 1, (command, out, err)
            assert len(err.strip().splitlines()) == 1, (command, err)
            if "--json" in command:  # errors are a JSON object then
                assert json.loads(err)["error"]["type"] == "StorageError", (command, err)
            else:
                assert err.startswith("error: "), (command, err)
            assert not _leaks(out + err), (command, out + err)


def test_the_real_cli_process_hides_the_password_from_db_and_env(scram_cluster: PrivateCluster) -> None:
    unreachable, in_query, rejected = _bad_urls(scram_cluster)
    for args, env_url in ((["--db", unreachable, "sessions"], None), (["verify"], in_query), (["migrate"], rejected)):
        r = _cli(args, env_url)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
        assert not _leaks(r.stdout + r.stderr), r.stdout + r.stderr


def test_cli_success_output_masks_the_password(scram_cluster: PrivateCluster) -> None:
    good = [
        scram_cluster.url("postgres", quote(PASSWORD, safe="")),
        scram_cluster.url("postgres") + f"?password={quote(PASSWORD, safe='')}",
    ]
    for url in good:
        for args in (["migrate"], ["sessions"], ["sessions", "--json"], ["verify"], ["demo"]):
            code, out, err = _cli_in_process([f"--db={url}", *args])
            assert code == 0, (args, err)
            assert not _leaks(out + err), (args, out + err)
    r = _cli(["--db", good[1], "migrate"])
    assert r.returncode == 0 and not _leaks(r.stdout + r.stderr), r.stdout + r.stderr
