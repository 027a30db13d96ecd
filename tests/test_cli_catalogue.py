"""`eventstore sessions` with filters and `eventstore info`: the catalogue from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import json_error, one_error_line, run_cli


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cat.db'}"
    run_cli("migrate", db=url)
    for sid, text in [("s1", "Coffee \x1b[31mmugs"), ("s2", "tea"), ("s3", "more mugs")]:
        action = json.dumps({"type": "send", "id": "u-1", "text": text})
        run_cli("append", sid, "-", db=url, input=action)
    return url


def test_info_sets_and_shows_the_entry(db: str) -> None:
    r = run_cli("info", "s1", "--title", "Mugs", "--owner", "user:ada", "--meta", "tenant=acme", "--actor", "me", "--json", db=db)
    doc = json.loads(r.stdout)
    assert (doc["title"], doc["owner"], doc["metadata"], doc["status"], doc["turns"]) == (
        "Mugs", "user:ada", {"tenant": "acme"}, "streaming", 1,
    )
    assert [c["actor"] for c in doc["info_changes"]] == ["me"]
    # Showing changes nothing; the log did not move.
    again = json.loads(run_cli("info", "s1", "--json", db=db).stdout)
    assert again["head"] == 1 and len(again["info_changes"]) == 1
    human = run_cli("info", "s1", "--title", "", db=db).stdout
    assert "\x1b" not in human and "\\x1b" in human  # the first user text, escaped


def test_sessions_filters_page_and_json_shapes(db: str) -> None:
    run_cli("info", "s1", "--owner", "user:ada", db=db)
    run_cli("info", "s3", "--owner", "user:ada", "--meta", "tenant=acme", db=db)
    plain = json.loads(run_cli("sessions", "--json", db=db).stdout)
    assert isinstance(plain, list) and [s["id"] for s in plain] == ["s1", "s2", "s3"]
    page = json.loads(run_cli("sessions", "--owner", "user:ada", "--limit", "1", "--json", db=db).stdout)
    assert set(page) == {"items", "next_cursor"} and [s["id"] for s in page["items"]] == ["s3"]
    rest = json.loads(
        run_cli("sessions", "--owner", "user:ada", "--limit", "1", "--cursor", page["next_cursor"], "--json", db=db).stdout
    )
    assert [s["id"] for s in rest["items"]] == ["s1"] and rest["next_cursor"] is None
    assert [s["id"] for s in json.loads(run_cli("sessions", "--meta", "tenant=acme", "--json", db=db).stdout)["items"]] == ["s3"]
    assert [s["id"] for s in json.loads(run_cli("sessions", "-q", "MUGS", "--json", db=db).stdout)["items"]] == ["s3", "s1"]
    assert [s["id"] for s in json.loads(run_cli("sessions", "--order", "created", "--json", db=db).stdout)["items"]] == ["s1", "s2", "s3"]
    human = run_cli("sessions", "--owner", "user:ada", db=db).stdout
    assert "\x1b" not in human and "\\x1b" in human and "user:ada" in human


def test_catalogue_errors_are_one_line(db: str) -> None:
    assert "limit" in one_error_line(run_cli("sessions", "--limit", "0", db=db, code=1))
    assert "cursor" in one_error_line(run_cli("sessions", "--cursor", "forged", db=db, code=1))
    assert "status" in one_error_line(run_cli("sessions", "--status", "busy", db=db, code=1))
    assert json_error(run_cli("sessions", "--status", "busy", "--json", db=db, code=1))["type"] == "InvalidEvent"
    assert "nope" in one_error_line(run_cli("info", "nope", "--title", "x", db=db, code=1))
    assert "control" in one_error_line(run_cli("info", "s1", "--title", "a\x07b", db=db, code=1))
    run_cli("info", "s1", "--meta", "no-equals-sign", db=db, code=2)
