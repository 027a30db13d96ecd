"""The CLI as a new user meets it, through the program in a process of its own: ids with
'@', database URL mistakes, no stray database files, JSON errors, refs, help, and strict
input JSON."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import cli_helpers
import pytest
from cli_helpers import json_error, one_error_line, run_cli

from eventstore import EventStore, InvalidEvent, mask_url, split_ref
from eventstore.samples import demo_conversation

SEND = json.dumps({"type": "send", "id": "u-1", "text": "hi"})


# -- session ids with '@' ---------------------------------------------------------------------


def test_a_ref_splits_at_the_last_at_only_before_digits() -> None:
    assert split_ref("ada@example.com") == ("ada@example.com", None)
    assert split_ref("ada@example.com@3") == ("ada@example.com", 3)
    assert split_ref("s@0") == ("s", 0)
    assert split_ref("s@x") == ("s@x", None) and split_ref("s@") == ("s@", None)
    assert split_ref("s@²") == ("s@²", None)  # only ASCII digits make a version


def test_session_ids_with_at_work_for_every_command(backend: str, db_url: str, tmp_path: Path) -> None:
    # Every command family through the real console script on SQLite (the other tests fork
    # a warm copy of the program: tests/cli_helpers.py). What only the real script shows
    # (its start, each command's imports in a cold interpreter) is the same on either
    # backend; PostgreSQL's own cold start is test_secrets.py's real `migrate`. On
    # PostgreSQL the same commands and assertions run through the warm copy.
    run_cli = functools.partial(cli_helpers.run_cli, real=backend == "sqlite")
    ada = "ada@example.com"
    run_cli("migrate", db=db_url)
    run_cli("append", ada, "-", db=db_url, input=json.dumps(demo_conversation()[:25]))
    assert len(json.loads(run_cli("history", ada, "--json", db=db_url).stdout)) == 25
    assert len(json.loads(run_cli("history", f"{ada}@5", "--json", db=db_url).stdout)) == 5
    assert json.loads(run_cli("checkout", f"{ada}@1", "--json", db=db_url).stdout)["status"] == "streaming"
    assert "ada@example.com@25" in run_cli("checkout", ada, db=db_url).stdout
    r = json.loads(run_cli("branch", f"{ada}@20", "--name", "bob@example.com", "--json", db=db_url).stdout)
    assert r == {"id": "bob@example.com", "parent": ada, "fork_version": 20}
    d = json.loads(run_cli("diff", ada, "bob@example.com", "--json", db=db_url).stdout)
    assert d["base"] == {"session": ada, "version": 20}
    assert len(json.loads(run_cli("replay", f"{ada}@3", "--json", db=db_url).stdout)) == 3
    assert json.loads(run_cli("verify", ada, "--json", db=db_url).stdout)["ok"] is True
    out = tmp_path / "ada.jsonl"
    run_cli("export", ada, "-o", str(out), db=db_url)
    assert json.loads(run_cli("compact", ada, "--upto", "10", "--json", db=db_url).stdout)["baseline"] == 10
    assert "restored" in run_cli("import", str(out), db=db_url).stdout
    assert {s["id"] for s in json.loads(run_cli("sessions", "--json", db=db_url).stdout)} == {ada, "bob@example.com"}


def test_a_new_id_ending_in_at_digits_is_refused_at_creation(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_cli("migrate", db=db_url)
    err = one_error_line(run_cli("append", "x@3", "-", db=db_url, input=SEND, code=1))
    assert "must not end in '@' and digits" in err
    run_cli("append", "x", "-", db=db_url, input=SEND)
    err = one_error_line(run_cli("branch", "x", "--name", "y@12", db=db_url, code=1))
    assert "must not end in '@' and digits" in err
    assert [s["id"] for s in json.loads(run_cli("sessions", "--json", db=db_url).stdout)] == ["x"]
    # The library's rule, whatever the caller: append, branch and import.
    with EventStore(db_url) as store:
        with pytest.raises(InvalidEvent, match="'@' and digits"):
            store.append("z@0", [{"type": "stop"}])
        with pytest.raises(InvalidEvent, match="'@' and digits"):
            store.branch("x", at=1, new_id="x@1")

    # A session made before the rule existed (simulated by lifting it) exports fine, but
    # importing it elsewhere creates it anew, which the rule refuses.
    exported = tmp_path / "legacy.jsonl"
    with EventStore(f"sqlite:///{tmp_path / 'legacy.db'}") as legacy:
        legacy.migrate()
        with monkeypatch.context() as m:
            m.setattr("eventstore.engine.transaction_steps.check_new_session_id", lambda *a, **k: None)
            legacy.append("old@9", [{"type": "stop"}])
        with exported.open("w", encoding="utf-8") as fh:
            legacy.export("old@9", fh)
    err = one_error_line(run_cli("import", str(exported), db=db_url, code=1))
    assert "must not end in '@' and digits" in err


# -- database URLs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, says",
    [
        ("postgresql+psycopg2://u:pw@127.0.0.1:1/db", "unsupported driver 'psycopg2'"),
        ("postgresql+asyncpg://u@127.0.0.1:1/db", "unsupported driver 'asyncpg'"),
        ("mysql://u@127.0.0.1/db", "unsupported database 'mysql'"),
        ("postgresql+psycopg://u@127.0.0.1:1/db?sslmode=bogus", "invalid sslmode value"),
        ("postgresql+psycopg://u@127.0.0.1:99999/db", "invalid port number"),
        ("postgresql+psycopg://u@127.0.0.1:abc/db", "not a database URL"),
        ("not a url", "not a database URL"),
        ("sqlite:///x.db?bogus=1", "bogus"),
    ],
)
def test_every_database_url_mistake_is_one_line(url: str, says: str, tmp_path: Path) -> None:
    for args in (["sessions"], ["migrate"]):
        r = run_cli(*args, db=url, code=1, cwd=tmp_path)
        line = one_error_line(r)
        assert says in line, line
        assert "try again" not in line  # a configuration mistake is not retryable
    assert not (tmp_path / "x.db").exists()


def test_passwords_are_masked_by_field_not_by_substring() -> None:
    assert mask_url("postgresql://unsupported:unsu@h/db") == "postgresql://unsupported:***@h/db"
    assert mask_url("postgresql://postgresql:p@h/d") == "postgresql://postgresql:***@h/d"
    assert mask_url("postgresql://sekrit:Abc@Pw9x@127.0.0.1/db") == "postgresql://sekrit:***@127.0.0.1/db"
    assert mask_url("postgresql://u:a/b:c@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert mask_url("postgresql://u:pa?ss@h/db") == "postgresql://u:***@h/db"
    assert mask_url("postgresql://u@h/d?password=zz&sslpassword=yy&application_name=a@b") == (
        "postgresql://u@h/d?password=***&sslpassword=***&application_name=a@b"
    )
    assert mask_url("sqlite:///:memory:") == "sqlite:///:memory:"
    assert mask_url("sqlite:///dir@x/a.db") == "sqlite:///dir@x/a.db"


def test_the_cli_masks_a_password_holding_at_and_keeps_the_message_whole() -> None:
    url = "postgresql+psycopg://sekrit:Abc@Pw9x@127.0.0.1:1/db?connect_timeout=2"
    line = one_error_line(run_cli("sessions", db=url, code=1))
    assert "Abc" not in line and "Pw9x" not in line and "sekrit:***@127.0.0.1:1/db" in line
    url = "postgresql+psycopg2://unsupported:unsu@127.0.0.1:1/db"
    line = one_error_line(run_cli("sessions", db=url, code=1))
    assert "unsupported driver" in line and "unsu@" not in line and "***ostgresql" not in line


def test_memory_database_is_shown_as_typed() -> None:
    assert "(sqlite:///:memory:)" in run_cli("migrate", db="sqlite:///:memory:").stdout


# -- no stray files ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["sessions"], ["history", "s"], ["checkout", "s"], ["append", "s", "-"], ["branch", "s"],
        ["diff", "s", "t"], ["replay", "s"], ["verify"], ["export", "s"], ["compact", "s", "--upto", "1"],
        ["import", "-"], ["sessions", "--json"],
    ],
)
def test_read_commands_never_create_a_database(args: list[str], tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'fresh.db'}"
    r = run_cli(*args, db=db, code=1, input=SEND)
    if "--json" in args:
        assert json_error(r)["type"] == "SchemaError"
    else:
        assert "eventstore migrate" in one_error_line(r)
    assert list(tmp_path.iterdir()) == []


def test_only_migrate_creates_and_it_says_what_it_did(db_url: str, tmp_path: Path) -> None:
    first = run_cli("migrate", db=db_url).stdout
    if db_url.startswith("sqlite"):
        assert first.startswith("created the database and its schema")
    else:
        assert first.startswith("migrated the schema")
    assert run_cli("migrate", db=db_url).stdout.startswith("the schema is already up to date; nothing to do")


# -- refs and messages ------------------------------------------------------------------------------


def test_history_refuses_a_version_beyond_the_head_like_checkout(db_url: str) -> None:
    run_cli("migrate", db=db_url)
    run_cli("append", "demo", "-", db=db_url, input=json.dumps(demo_conversation()[:10]))
    for cmd in (["history", "demo@999999"], ["history", "demo@11", "--turns"], ["checkout", "demo@999999"]):
        assert "has no version" in one_error_line(run_cli(*cmd, db=db_url, code=1))
    assert len(json.loads(run_cli("history", "demo@10", "--json", db=db_url).stdout)) == 10


def test_json_errors_are_objects_with_the_same_exit_codes(db_url: str) -> None:
    run_cli("migrate", db=db_url)
    err = json_error(run_cli("checkout", "nope", "--json", db=db_url, code=1))
    assert err["type"] == "SessionNotFound" and "'nope' not found" in err["message"]
    err = json_error(run_cli("append", "s", "-", "--json", db=db_url, input='{"type": "nope"}', code=1))
    assert err["type"] == "InvalidEvent"
    err = json_error(run_cli("history", "s", "--last", "--json", db=db_url, code=2))
    assert err["type"] == "UsageError" and "--last needs --limit" in err["message"]
    err = json_error(run_cli("checkout", "--json", db=db_url, code=2))  # a missing argument
    assert err["type"] == "UsageError"
    assert "Usage:" in run_cli("checkout", db=db_url, code=2).stderr  # without --json: click's usage text


def test_version_and_db_after_the_command(tmp_path: Path) -> None:
    from importlib.metadata import version

    assert run_cli("--version").stdout.strip() == f"eventstore {version('eventstore')}"
    db = f"sqlite:///{tmp_path / 'late.db'}"
    run_cli("migrate", "--db", db)
    run_cli("append", "s", "-", f"--db={db}", input=SEND)
    assert json.loads(run_cli("sessions", "--json", "--db", db).stdout)[0]["id"] == "s"
    assert json.loads(run_cli("history", "s", "--db", db, "--json", cwd=tmp_path).stdout)[0]["version"] == 1
    assert not (tmp_path / "eventstore.db").exists()


def test_help_names_arguments_one_way_and_demo_tells_the_truth() -> None:
    usage = {
        "append": "{SESSION} [FILE]", "history": "{SESSION[@V]}", "checkout": "{SESSION[@V]}",
        "branch": "{SESSION[@V]}", "diff": "{SESSION[@V]} {SESSION[@V]}", "compact": "[SESSION]",
        "replay": "{SESSION[@V]}", "verify": "[SESSION]", "export": "{SESSION}", "import": "{FILE}",
    }
    for cmd, args in usage.items():
        first = run_cli(cmd, "--help").stdout.splitlines()[0]
        assert first.endswith(f"[OPTIONS] {args}"), first
    demo = " ".join(run_cli("demo", "--help").stdout.split())
    assert "database named by --db" in demo
    assert "--db may also follow the command" in " ".join(run_cli("--help").stdout.split())


def test_compact_all_is_summarised(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    run_cli("migrate", db=db)
    for name in ("a", "b", "c"):
        run_cli("append", name, "-", db=db, input=json.dumps(demo_conversation()))
    run_cli("compact", "--all", "--keep-last-turns", "1", db=db)
    out = run_cli("compact", "--all", "--keep-last-turns", "1", db=db).stdout
    assert out.strip() == "0 event(s) removed from 0 of 3 session(s); 3 session(s) already within the policy"


# -- strict input JSON --------------------------------------------------------------------------------


def test_input_json_is_strict(db_url: str, tmp_path: Path) -> None:
    run_cli("migrate", db=db_url)
    dup = '{"type": "send", "id": "u-1", "text": "a", "text": "b"}'
    for text in (dup, f"[{dup}]", f"{SEND}\n{dup}\n"):
        line = one_error_line(run_cli("append", "s", "-", db=db_url, input=text, code=1))
        assert "'text' appears twice" in line
    huge = '{"type": "part", "part": {"type": "tool-call", "messageId": "a", "id": "c", "name": "t", "input": ' + "9" * 5000 + "}}"
    assert "number is too long" in one_error_line(run_cli("append", "s", "-", db=db_url, input=huge, code=1))
    assert json.loads(run_cli("sessions", "--json", db=db_url).stdout) == []


def test_odd_but_legal_actions_are_accepted_as_documented(db_url: str) -> None:
    """A repeated send id, a delta for an unknown message and a NUL in a message id are
    stored as sent: the log records what the chat app did (docs/security.md says why)."""
    run_cli("migrate", db=db_url)
    actions = [
        {"type": "send", "id": "u-1", "text": "a"},
        {"type": "part", "part": {"type": "text-delta", "messageId": "ghost", "text": "lost"}},
        {"type": "part", "part": {"type": "finish", "reason": "stop"}},
        {"type": "send", "id": "u-1", "text": "b"},
        {"type": "part", "part": {"type": "message-start", "messageId": "a\x00b"}},
    ]
    run_cli("append", "s", "-", db=db_url, input=json.dumps(actions))
    state = json.loads(run_cli("checkout", "s", "--json", db=db_url).stdout)
    assert [m["id"] for m in state["messages"]] == ["u-1", "u-1", "a\x00b"]
    assert "a\\x00b" in run_cli("checkout", "s", db=db_url).stdout
    assert [e["action"] for e in json.loads(run_cli("history", "s", "--json", db=db_url).stdout)] == actions
