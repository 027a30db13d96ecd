"""The test harness itself: PostgreSQL really is there whenever the suite runs."""

from __future__ import annotations

import os

import psycopg

from conftest import PG_URL_ENV, _psycopg_dsn, pg_admin_url


def test_postgres_server_is_running_for_the_suite() -> None:
    assert os.environ.get(PG_URL_ENV), "make test must export the PostgreSQL URL"
    with psycopg.connect(_psycopg_dsn(pg_admin_url())) as conn:
        (version,) = conn.execute("SHOW server_version_num").fetchone()  # type: ignore[misc]
    assert int(version) >= 120000
