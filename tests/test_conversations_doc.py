"""docs/conversations.md's examples run as written (each in a fresh directory)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = (Path(__file__).resolve().parent.parent / "docs" / "conversations.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", DOC, flags=re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_examples_run(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"docs/conversations.md python block {index}", "exec"), {"__name__": "__doc__"})
