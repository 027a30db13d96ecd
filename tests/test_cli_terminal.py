"""Stored text on a terminal: never markup, never a control sequence, always visible.

A model's output is data. Every human view must show it literally (Rich markup such as
`[/INST]` neither crashes nor disappears) and must not let it drive the terminal (ESC
sequences, OSC titles, C1 controls, NUL, bidirectional overrides); `--json` keeps the
exact values. Checked through the real program on both backends, and once under a
pseudo-terminal so the colour and width paths run.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import EXE, run_cli

from eventstore_cli.terminal import UNSAFE, json_text, safe

# A sequence Rich never emits for our styles (blink + reverse), so seeing it raw means
# stored text reached the terminal.
BLINK = "\x1b[5;7m"
HOSTILE = (
    f"What does [/INST] mean? A [bold red]B[/bold red] {BLINK}X \x1b]0;pwned\x07 \x1b[2J "
    "\x9b31m nul\x00 rtl\u202eevil \u2066iso\u2069 zw\u200b tag\U000e0041 :smile:"
)
SESSION = "ada@example.com"
# Session ids and actors refuse C0 controls; the other unsafe characters they may hold.
ODD = "\u202e\x9b[2J"
BRANCH = f"b[/]{ODD}"


def _actions() -> list[dict[str, Any]]:
    call = f"call{BLINK}"
    return [
        {"type": "send", "id": f"u-1{BLINK}", "text": HOSTILE},
        {"type": "part", "part": {"type": "message-start", "messageId": f"a\u202e1"}},
        {"type": "part", "part": {"type": "text-delta", "messageId": "a\u202e1", "text": "reply [/] " + HOSTILE}},
        {"type": "part", "part": {"type": "reasoning", "messageId": "a\u202e1", "text": "think [b]" + HOSTILE}},
        {
            "type": "part",
            "part": {"type": "tool-call", "messageId": "a\u202e1", "id": call, "name": f"to[/]ol{BLINK}",
                     "input": {"q": "[/]" + HOSTILE}},
        },
        {"type": "toolPhase", "name": f"to[/]ol{BLINK}", "state": "awaiting-confirmation", "prompt": "ok? " + HOSTILE},
        {"type": "part", "part": {"type": "tool-result", "id": call, "output": {"[/]": HOSTILE}}},
        {"type": "part", "part": {"type": "error", "error": "boom [/] " + HOSTILE, "code": "network"}},
    ]


def _raw_unsafe(text: str) -> list[str]:
    """Unsafe characters in ``text`` other than the newlines that end lines."""
    return sorted({repr(c) for c in UNSAFE.findall(text) if c != "\n"})


# -- the one function --------------------------------------------------------------------


def test_safe_escapes_every_control_and_format_character() -> None:
    unsafe = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp", "Cs")]
    shown = safe("".join(unsafe))
    assert not any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") for c in shown)
    assert safe("\x1b[31m") == "\\x1b[31m" and safe("\u202e") == "\\u202e" and safe("\x00") == "\\x00"
    assert safe("\U000e0041") == "\\U000e0041" and safe("a\nb\tc") == "a\\nb\\tc"
    assert safe("a\nb\tc\r", multiline=True) == "a\nb\tc\\r"
    ordinary = "Hello [/INST] [bold]x[/bold] 🙂 日本語 café \\x1b —"
    assert safe(ordinary) == ordinary


def test_json_keeps_exact_values_and_escapes_what_a_terminal_would_act_on() -> None:
    doc = {"text": HOSTILE, "ids": [f"u{BLINK}", "a\u202e1"], "n": 1}
    text = json_text(doc)
    assert json.loads(text) == doc
    assert _raw_unsafe(text) == []


# -- every human view, both backends -------------------------------------------------------


@pytest.fixture
def hostile_db(db_url: str, tmp_path: Path) -> str:
    run_cli("migrate", db=db_url)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(_actions()), encoding="utf-8")
    run_cli("append", SESSION, str(path), "--actor", f"act[/]or{ODD}", db=db_url)
    run_cli("branch", f"{SESSION}@2", "--name", BRANCH, db=db_url)
    run_cli("append", BRANCH, "-", db=db_url, input=json.dumps({"type": "send", "id": "u-9", "text": HOSTILE}))
    return db_url


VIEWS = [
    ["sessions"],
    ["history", SESSION],
    ["history", SESSION, "--turns"],
    ["history", BRANCH, "--turns"],
    ["checkout", SESSION],
    ["checkout", f"{SESSION}@5"],
    ["diff", SESSION, BRANCH],
    ["diff", f"{SESSION}@3", SESSION, "--events"],
    ["replay", SESSION],
    ["verify"],
    ["verify", BRANCH],
]


def test_every_human_view_shows_stored_text_literally_and_escaped(hostile_db: str, tmp_path: Path) -> None:
    for args in VIEWS:
        r = run_cli(*args, db=hostile_db)
        out = r.stdout + r.stderr
        assert _raw_unsafe(out) == [], (args, _raw_unsafe(out))
        assert BLINK not in out, args
        assert "\\x1b[5;7m" in out or "\\u202e" in out, (args, out)  # shown, escaped
    turns = run_cli("history", SESSION, "--turns", db=hostile_db).stdout
    assert "[/INST]" in turns and "A [bold red]B[/bold red]" in turns and ":smile:" in turns
    state = run_cli("checkout", SESSION, db=hostile_db).stdout
    assert "[/INST]" in state and "\\u202e" in state and "\\x00" in state and "\\x9b" in state
    assert '"[/]' in state  # tool input shown with its brackets
    # Commands that echo ids are escaped too, and so are error messages quoting them.
    r = run_cli("branch", SESSION, "--name", f"c{ODD}", db=hostile_db)
    assert _raw_unsafe(r.stdout) == [] and "c\\u202e\\x9b[2J" in r.stdout
    r = run_cli("checkout", f"nope{ODD}", db=hostile_db, code=1)
    assert _raw_unsafe(r.stderr) == [] and "nope\\u202e\\x9b[2J" in r.stderr
    archive = tmp_path / "x.jsonl"
    r = run_cli("export", SESSION, "-o", str(archive), db=hostile_db)
    assert _raw_unsafe(r.stderr) == []


def test_json_output_is_exact(hostile_db: str) -> None:
    state = json.loads(run_cli("checkout", SESSION, "--json", db=hostile_db).stdout)
    assert state["messages"][0]["parts"][0]["text"] == HOSTILE
    assert state["messages"][0]["id"] == f"u-1{BLINK}"
    events = json.loads(run_cli("history", SESSION, "--json", db=hostile_db).stdout)
    assert [e["action"] for e in events] == _actions()
    turns = json.loads(run_cli("history", SESSION, "--turns", "--json", db=hostile_db).stdout)
    assert turns[0]["user_text"] == HOSTILE  # whole, not shortened


# -- a real terminal ----------------------------------------------------------------------------


def _pty_run(args: list[str], cwd: Path, *, stderr_too: bool = False) -> bytes:
    """Run the program with stdout (and optionally stderr) on a pseudo-terminal (80 columns);
    its raw output bytes."""
    main, child = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("EVENTSTORE_URL", "NO_COLOR")}
    env.update({"COLUMNS": "80", "LINES": "40", "TERM": "xterm-256color"})
    proc = subprocess.Popen(
        [str(EXE), *args], stdin=subprocess.DEVNULL, stdout=child, stderr=child if stderr_too else subprocess.PIPE,
        cwd=cwd, env=env,
    )
    os.close(child)
    chunks = []
    while True:
        ready, _, _ = select.select([main], [], [], 60)
        if not ready:
            proc.kill()
            raise AssertionError(f"{args}: no output for 60 s")
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=60) == 0, (args, proc.stderr.read() if proc.stderr else b"")
    os.close(main)
    return b"".join(chunks)


SGR = re.compile(rb"\x1b\[[0-9;]*m")


def test_a_terminal_receives_no_control_byte_from_stored_text(tmp_path: Path) -> None:
    """Only Rich's own colour codes (SGR) reach a real terminal; lines fit 80 columns."""
    db = f"sqlite:///{tmp_path / 'tty.db'}"
    run_cli("migrate", db=db)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(_actions()), encoding="utf-8")
    run_cli("append", SESSION, str(path), "--actor", "ada", db=db)
    run_cli("branch", f"{SESSION}@2", "--name", BRANCH, db=db)
    run_cli("append", BRANCH, "-", db=db, input=json.dumps({"type": "send", "id": "u-9", "text": HOSTILE * 3}))
    for args in (["checkout", SESSION], ["history", SESSION, "--turns"], ["history", SESSION], ["sessions"],
                 ["diff", SESSION, BRANCH], ["replay", SESSION]):
        raw = _pty_run(["--db", db, *args], tmp_path)
        assert BLINK.encode() not in raw, args
        plain = SGR.sub(b"", raw)
        text = plain.decode("utf-8")
        assert "\x1b" not in text, (args, text)
        assert _raw_unsafe(text.replace("\r\n", "\n")) == [], (args, _raw_unsafe(text))
        assert "\\x1b[5;7m" in text or "\\u202e\\x9b" in text, args
        widths = [len(line) for line in text.replace("\r\n", "\n").split("\n")]
        assert max(widths) <= 80, (args, max(widths))
    # Colour did reach the terminal: the pty path is the styled one.
    assert SGR.search(_pty_run(["--db", db, "checkout", SESSION], tmp_path))
    # Progress bars (stderr on the terminal) name stored ids without parsing them as markup.
    for args in (["export", BRANCH, "-o", str(tmp_path / "b.jsonl")], ["verify"], ["history", BRANCH, "--turns"]):
        raw = _pty_run(["--db", db, *args], tmp_path, stderr_too=True)
        assert BLINK.encode() not in raw and b"Traceback" not in raw and "\u202e".encode() not in raw, args


def test_history_on_a_terminal_shows_a_page_and_says_how_to_see_more(tmp_path: Path) -> None:
    from eventstore.samples import chat_session

    db = f"sqlite:///{tmp_path / 'long.db'}"
    run_cli("migrate", db=db)
    actions = chat_session(3)
    run_cli("append", "long", "-", db=db, input=json.dumps(actions))
    paged = SGR.sub(b"", _pty_run(["--db", db, "history", "long"], tmp_path)).decode().splitlines()
    assert len(paged) == 1 + 100 + 1 and "more events follow" in paged[-1] and "--all" in paged[-1]
    everything = SGR.sub(b"", _pty_run(["--db", db, "history", "long", "--all"], tmp_path)).decode().splitlines()
    assert len(everything) == 1 + len(actions)
    piped = run_cli("history", "long", db=db).stdout.splitlines()  # a pipe is never paged
    assert len(piped) == 1 + len(actions)
