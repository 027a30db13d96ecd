"""The `eventstore` command line, driven through Typer's runner (and a real subprocess).

Every command is run with its human and --json output; every expected failure must be
one `error: …` line on stderr with exit code 1 (2 for usage errors) and no traceback.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from eventstore.samples import demo_conversation
import frozen_ddl
from eventstore_cli.app import app

Run = Callable[..., Any]


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


@pytest.fixture
def run(db: str) -> Run:
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None, code: int = 0) -> Any:
        result = runner.invoke(app, ["--db", db, *args], input=input)
        assert "Traceback" not in result.stderr, result.stderr
        assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr)
        if code == 1:
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1, result.stderr
            if "--json" in args:
                assert set(json.loads(lines[0])["error"]) == {"type", "message"}, result.stderr
            else:
                assert lines[0].startswith("error: "), result.stderr
        return result

    return invoke


def js(result: Any) -> Any:
    return json.loads(result.stdout)


@pytest.fixture
def demo_db(run: Run, tmp_path: Path) -> Path:
    """A database holding the demo conversation as session `s` (51 events)."""
    path = tmp_path / "demo.json"
    path.write_text(json.dumps(demo_conversation()), encoding="utf-8")
    run("migrate")
    run("append", "s", str(path), "--expected-version", "0", "--actor", "tester")
    return path


def test_every_command_has_help() -> None:
    runner = CliRunner()
    names = [c.name or c.callback.__name__ for c in app.registered_commands]  # type: ignore[union-attr]
    assert set(names) >= {
        "migrate", "append", "sessions", "history", "checkout", "branch", "diff",
        "compact", "replay", "verify", "export", "import", "demo",
    }
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0 and "--db" in top.stdout
    for name in names:
        r = runner.invoke(app, [name, "--help"])
        assert r.exit_code == 0, name
        body = r.stdout.split("Options")[0]
        assert len(body.split("\n", 2)[-1].strip()) > 40, f"{name} has no real help"


def test_migrate_append_and_sessions(run: Run, tmp_path: Path) -> None:
    assert "created the database and its schema" in run("migrate").stdout
    assert "already up to date; nothing to do" in run("migrate").stdout  # idempotent
    lines = "\n".join(json.dumps(a) for a in demo_conversation()[:5])
    r = run("append", "s1", "-", "--json", input=lines)
    doc = js(r)
    assert (doc["session"], doc["version"], doc["first_version"], doc["count"]) == ("s1", 5, 1, 5)
    one = run("append", "s1", "-", input='{"type": "stop"}')
    assert "head is now 6" in one.stdout
    r = run("append", "s1", "-", "--expected-version", "3", input='{"type": "stop"}', code=1)
    assert "version 6, not 3" in r.stderr
    run("branch", "s1@4", "--name", "s1-alt")
    doc = js(run("sessions", "--json"))
    assert [s["id"] for s in doc] == ["s1", "s1-alt"]
    for s in doc:
        assert {"id", "parent", "fork_version", "head", "baseline"} <= set(s)
    assert doc[1]["parent"] == "s1" and doc[1]["fork_version"] == 4 and doc[1]["head"] == 4
    human = run("sessions").stdout
    assert "branches" in human and "forked at 4" in human


def test_history_json_and_turns(run: Run, demo_db: Path) -> None:
    events = js(run("history", "s", "--json"))
    assert len(events) == 51
    e = events[0]
    assert {"session", "version", "event_id", "type", "action", "turn", "recorded_at", "actor", "metadata"} <= set(e)
    assert e["recorded_at"].endswith("Z") and e["actor"] == "tester" and e["type"] == "send"
    assert len(js(run("history", "s@10", "--json"))) == 10
    assert [e["version"] for e in js(run("history", "s", "--from", "5", "-n", "3", "--json"))] == [6, 7, 8]
    assert [e["version"] for e in js(run("history", "s@40", "-n", "2", "--last", "--json"))] == [39, 40]
    run("history", "s", "--last", code=2)
    run("history", "s", "--turns", "-n", "2", code=2)
    turns = js(run("history", "s", "--turns", "--json"))
    assert [t["turn"] for t in turns] == [1, 2]
    assert turns[1]["retries"] == 1 and turns[1]["outcome"] == "idle"
    assert "dishwasher" in run("history", "s").stdout
    human = run("history", "s", "--turns").stdout
    assert "turn 2" in human and "retry" in human


def test_checkout_at_versions(run: Run, demo_db: Path) -> None:
    head = js(run("checkout", "s", "--json"))
    assert set(head) <= {"messages", "status", "error"} and head["status"] == "idle"
    assert js(run("checkout", "s@0", "--json")) == {"messages": [], "status": "idle"}
    assert js(run("checkout", "s", "--at", "1", "--json"))["messages"][0]["id"] == "u-1"
    assert js(run("checkout", "s@1", "--at", "1", "--json"))["status"] == "streaming"
    run("checkout", "s@1", "--at", "2", code=2)
    assert "s@51" in run("checkout", "s").stdout
    assert "no version 99" in run("checkout", "s@99", code=1).stderr


def test_branch_diff_and_replay(run: Run, demo_db: Path) -> None:
    b = js(run("branch", "s", "--at", "20", "--name", "alt", "--json"))
    assert b == {"id": "alt", "parent": "s", "fork_version": 20}
    run("append", "alt", "-", input='{"type": "send", "id": "u-9", "text": "other path"}')
    d = js(run("diff", "s", "alt", "--json"))
    assert d["left"] == {"session": "s", "version": 51}
    assert d["right"] == {"session": "alt", "version": 21}
    assert d["base"] == {"session": "s", "version": 20}
    assert d["messages"]["added"] == ["u-9"]
    assert "u-2" in d["messages"]["removed"]
    assert d["status"] == {"left": "idle", "right": "streaming"}
    assert d["events"] == {"left": 31, "right": 1}
    human = run("diff", "s@20", "alt").stdout
    assert "+ user u-9" in human and "base s@20" in human
    listed = run("diff", "s@22", "alt", "--events").stdout
    assert "left s@22: 2 event(s)" in listed and "right alt@21: 1 event(s)" in listed
    ev = js(run("diff", "s@22", "alt", "--events", "--json"))["events_since_base"]
    assert [e["version"] for e in ev["left"]] == [21, 22] and ev["right"][0]["session"] == "alt"
    generated = run("branch", "alt").stdout
    assert generated.startswith("created alt-")
    run("branch", "s", "--name", "alt", code=1)  # taken

    steps = js(run("replay", "s", "--from", "20", "--to", "23", "--json"))
    assert [x["version"] for x in steps] == [21, 22, 23]
    assert steps[0]["messages"]["added"][0]["id"] == "u-2" and "changes" not in steps[0]
    assert "3 event(s) replayed" in run("replay", "s@23", "--from", "20").stdout
    run("replay", "s", "--from", "9", "--to", "3", code=2)


@pytest.mark.parametrize(
    "args",
    [
        ["history", "@3"],
        ["compact", "s"],
        ["compact", "--all"],

    ],
)
def test_usage_errors_exit_2(run: Run, demo_db: Path, args: list[str]) -> None:
    r = run(*args, code=2)
    assert r.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["checkout", "nope"],
        ["history", "nope"],
        ["history", "nope", "--turns"],
        ["branch", "nope"],
        ["diff", "nope", "s"],
        ["compact", "nope", "--upto", "1"],
        ["replay", "nope"],
        ["verify", "nope"],
        ["export", "nope"],
    ],
)
def test_missing_session_is_one_line(run: Run, demo_db: Path, args: list[str]) -> None:
    assert "'nope' not found" in run(*args, code=1).stderr


@pytest.mark.parametrize(
    "args",
    [
        ["checkout", "s@"],
        ["checkout", "s@-1"],
        ["checkout", "s@x"],
        ["checkout", "s@²"],
        ["diff", "s@1.5", "s"],
        ["branch", "s@abc"],
    ],
)
def test_a_ref_without_digits_after_the_at_is_a_session_id(run: Run, demo_db: Path, args: list[str]) -> None:
    err = run(*args, code=1).stderr
    assert "not found" in err and "must be a number" in err


def test_malformed_and_missing_input_files(run: Run, demo_db: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"type": "send", "id": "u", "text": "x"},', encoding="utf-8")
    assert "invalid JSON" in run("append", "s", str(bad), code=1).stderr
    bad.write_text('{"type": "send"}\nnot json\n', encoding="utf-8")
    assert "line 2" in run("append", "s", str(bad), code=1).stderr
    bad.write_text("[1, 2]", encoding="utf-8")
    run("append", "s", str(bad), code=1)
    bad.write_text("", encoding="utf-8")
    run("append", "s", str(bad), code=1)
    bad.write_bytes(b"\xff\xfe[")
    run("append", "s", str(bad), code=1)
    assert "unknown action type" in run("append", "s", "-", input='{"type": "nope"}', code=1).stderr
    assert "no such file" in run("append", "s", str(tmp_path / "missing.json"), code=1).stderr
    run("import", str(tmp_path / "missing.jsonl"), code=1)
    run("import", str(bad), code=1)
    bad.write_text('{"format": "eventstore-export", "format_version": 1}\n{"kind": "event"}\n', encoding="utf-8")
    assert "import line 2" in run("import", str(bad), code=1).stderr
    run("import", str(tmp_path), code=1)  # a directory
    assert js(run("history", "s", "--json"))[-1]["version"] == 51  # nothing was written


def test_compact_then_below_the_baseline(run: Run, demo_db: Path, tmp_path: Path) -> None:
    run("branch", "s@10", "--name", "early")
    archive = tmp_path / "archive.jsonl"
    r = js(run("compact", "s", "--upto", "30", "--archive", str(archive), "--json"))
    assert r["baseline"] == 30 and r["archived"] == 51 and r["kept_for_branches"] == 10
    err = run("checkout", "s@29", code=1).stderr
    assert "compacted up to version 30" in err
    run("diff", "s@5", "s", code=1)
    run("replay", "s", "--from", "3", code=1)
    assert len(js(run("checkout", "early@10", "--json"))["messages"]) == 2
    assert js(run("verify", "--json"))["ok"] is True
    assert js(run("history", "s", "--json"))[0]["version"] == 31
    # The archive restores the full history in another database.
    other = f"sqlite:///{tmp_path / 'restored.db'}"
    runner = CliRunner()
    assert runner.invoke(app, ["--db", other, "migrate"]).exit_code == 0
    res = runner.invoke(app, ["--db", other, "import", str(archive), "--json"])
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout) == [{"session": "s", "status": "created", "events": 51, "head": 51}]
    full = runner.invoke(app, ["--db", other, "history", "s", "--json"])
    assert len(json.loads(full.stdout)) == 51
    # Policy form over every session.
    doc = js(run("compact", "--all", "--keep-last-turns", "1", "--json"))
    assert {d["session"] for d in doc} == {"s", "early"}
    summary = run("compact", "--all", "--keep-last-turns", "0").stdout
    assert "event(s) removed from 1 of 2 session(s)" in summary and "0 event(s) removed" not in summary
    run("compact", "s", "--upto", "3", code=1)


def test_export_import_round_trip(run: Run, demo_db: Path, tmp_path: Path) -> None:
    run("branch", "s@20", "--name", "b")
    run("append", "b", "-", input='{"type": "retry"}')
    out = run("export", "b").stdout
    lines = [json.loads(x) for x in out.splitlines()]
    assert lines[0]["format"] == "eventstore-export" and lines[0]["sessions"] == ["s", "b"]
    path = tmp_path / "b.jsonl"
    assert "exported 52" in run("export", "b", "-o", str(path)).stderr
    assert path.read_text(encoding="utf-8") == out
    other = f"sqlite:///{tmp_path / 'other.db'}"
    runner = CliRunner()
    runner.invoke(app, ["--db", other, "migrate"])
    r = runner.invoke(app, ["--db", other, "import", str(path)])
    assert r.exit_code == 0 and "b: created" in r.stdout
    again = runner.invoke(app, ["--db", other, "export", "b"])
    assert again.stdout == out
    assert "present" in run("import", "-", input=out).stdout
    tampered = out.replace('"actor":"tester"', '"actor":"mallory"', 1)
    assert "hash" in run("import", "-", input=tampered, code=1).stderr


def test_verify_reports_tampering_with_exit_1(run: Run, demo_db: Path, tmp_path: Path) -> None:
    assert js(run("verify", "--json"))["ok"] is True
    assert "ok" in run("verify", "s").stdout
    con = sqlite3.connect(tmp_path / "cli.db")
    for stmt in frozen_ddl.sqlite_drop_immutability():
        con.execute(stmt)
    con.execute("UPDATE events SET actor = 'mallory' WHERE version = 7")
    con.commit()
    con.close()
    r = run("verify", "--json", code=1)
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and any(p["version"] == 7 and "version 7" in p["message"] for p in doc["problems"])
    assert "FAILED" in run("verify", code=1).stdout


def test_unreachable_database_hides_the_password() -> None:
    runner = CliRunner()
    url = "postgresql+psycopg://user:s3cret-pw@127.0.0.1:1/db?connect_timeout=2"
    r = runner.invoke(app, ["--db", url, "sessions"])
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert "s3cret-pw" not in r.stderr + r.stdout
    assert r.stderr.startswith("error: ")
    url = "postgresql+psycopg://user@127.0.0.1:1/db?password=qu3ry-pw&connect_timeout=2"
    r = runner.invoke(app, ["--db", url, "migrate"])
    assert r.exit_code == 1 and "qu3ry-pw" not in r.stderr + r.stdout
    r = runner.invoke(app, ["--db", "nosuchdb://x", "sessions"])
    assert r.exit_code == 1 and r.stderr.startswith("error: ")


def test_demo_runs_twice_in_the_same_directory(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "eventstore"
    env = {k: v for k, v in os.environ.items() if k != "EVENTSTORE_URL"}
    env["COLUMNS"] = "100"
    first = subprocess.run([str(exe), "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "Traceback" not in first.stderr
    assert (tmp_path / "eventstore.db").exists()
    assert "diff demo demo-alt" in first.stdout and "turn 2" in first.stdout
    second = subprocess.run([str(exe), "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "demo-2" in second.stdout
    listing = subprocess.run(
        [str(exe), "sessions", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    ids = [s["id"] for s in json.loads(listing.stdout)]
    assert ids == ["demo", "demo-alt", "demo-2", "demo-2-alt"]


def test_the_cli_tour_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command line of the README's CLI tour (pipelines included), in order, in a fresh dir.

    In-process for speed; `echo '…' | eventstore …` feeds the echoed text on stdin.
    (README's own test runs the pasted tour as real subprocesses.)
    """
    import re
    import shlex

    from test_readme import cli_tour

    tour = cli_tour()
    lines = [
        line
        for block in re.findall(r"```bash\n(.*?)```", tour, flags=re.S)
        for line in block.splitlines()
        if line.strip()
    ]
    assert len(lines) >= 15
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EVENTSTORE_URL", raising=False)
    runner = CliRunner()
    for line in lines:
        cmd, _, comment = line.partition("  #")
        stdin = None
        if " | " in cmd:
            producer, _, cmd = cmd.partition(" | ")
            words = shlex.split(producer)
            assert words[0] == "echo", line
            stdin = " ".join(words[1:]) + "\n"
        argv = shlex.split(cmd)
        assert argv[0] == "eventstore", line
        r = runner.invoke(app, argv[1:], input=stdin, env={"COLUMNS": "100"})
        expect_fail = comment.strip().startswith("fails")
        assert (r.exit_code != 0) == expect_fail, f"{line}\n{r.stdout}\n{r.stderr}"
        assert r.exception is None or isinstance(r.exception, SystemExit), f"{line}: {r.exception!r}"


def test_cli_on_both_backends(db_url: str, tmp_path: Path) -> None:
    """The same commands against SQLite and PostgreSQL (the `db_url` fixture's backends)."""
    runner = CliRunner()

    def cli(*args: str, input: str | None = None, code: int = 0) -> Any:
        r = runner.invoke(app, ["--db", db_url, *args], input=input)
        assert r.exit_code == code, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        return r

    cli("migrate")
    cli("append", "s", "-", input=json.dumps(demo_conversation()))
    cli("branch", "s@20", "--name", "b")
    cli("append", "b", "-", "--expected-version", "20", input='{"type": "send", "id": "x", "text": "y"}')
    d = json.loads(cli("diff", "s", "b", "--json").stdout)
    assert d["base"] == {"session": "s", "version": 20} and d["messages"]["added"] == ["x"]
    assert json.loads(cli("compact", "s", "--upto", "25", "--json").stdout)["baseline"] == 25
    assert "compacted up to version 25" in cli("checkout", "s@24", code=1).stderr
    assert json.loads(cli("verify", "--json").stdout)["ok"] is True
    exported = cli("export", "b").stdout
    other = f"sqlite:///{tmp_path / 'copy.db'}"
    runner.invoke(app, ["--db", other, "migrate"])
    assert runner.invoke(app, ["--db", other, "import", "-"], input=exported).exit_code == 0
    assert runner.invoke(app, ["--db", other, "export", "b"]).stdout == exported
    assert len(json.loads(cli("history", "b", "--turns", "--json").stdout)) == 2
