"""The Python examples of docs/conversations.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = (Path(__file__).resolve().parents[1] / "docs" / "conversations.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", DOC, re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"docs/conversations.md python block {index}", "exec"), {"__name__": "__doc__"})
    if "sidebar.db" in BLOCKS[index]:
        assert "chat-1 Which coffee mug keeps heat? streaming" in capsys.readouterr().out


def test_the_sidebar_and_the_rewind_examples_are_both_fenced() -> None:
    assert sum("sidebar.db" in b for b in BLOCKS) == 1
    assert sum("store.rewind(" in b for b in BLOCKS) == 1


def test_there_is_an_example() -> None:
    assert BLOCKS
