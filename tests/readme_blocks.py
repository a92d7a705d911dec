"""README.md's ```python and ```bash blocks and their markers (the line before each block):

- ``<!-- readme-test: run -->``: tests/test_readme.py runs it as pasted;
- ``<!-- readme-test: run in (tests/test_x.py) -->``: that test file runs it as pasted, adding
  only output flags (``readme_argv``), and checks more of what it prints than test_readme could;
- ``<!-- readme-test: skip (why) -->``: not runnable here, the reason says why.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"(?P<before>[^\n]*)\n```(?P<lang>python|bash)\n(?P<code>.*?)\n```", re.S)
MARKER = re.compile(
    r"<!-- readme-test: "
    r"(?:(?P<run>run)(?: in \((?P<owner>[\w/.]+\.py)\))?|skip \((?P<why>[^)]+)\)) -->$"
)


@dataclass(frozen=True)
class Block:
    line: int  # the block's first line of code in README.md
    lang: str
    code: str
    marker: str  # the line before the block

    @property
    def runs(self) -> bool:
        """Run as pasted by tests/test_readme.py."""
        m = MARKER.match(self.marker)
        return bool(m and m.group("run") and not m.group("owner"))

    @property
    def owner(self) -> str | None:
        """The test file that runs it instead (``run in (...)``)."""
        m = MARKER.match(self.marker)
        return m.group("owner") if m else None

    @property
    def where(self) -> str:
        return f"README.md:{self.line} (```{self.lang})"


def blocks(text: str | None = None) -> list[Block]:
    text = README.read_text() if text is None else text
    return [
        Block(
            text.count("\n", 0, m.start("code")) + 1,
            m.group("lang"),
            m.group("code"),
            m.group("before").strip(),
        )
        for m in BLOCK.finditer(text)
    ]


def readme_argv(command: str) -> list[str]:
    """The argv of the README's one-line bash block ``command`` (as written there, its comment
    left out, ``.venv/bin/python`` this interpreter): a ``run in`` block's owner runs it so."""
    found = [
        b
        for b in blocks()
        if b.lang == "bash" and b.owner and b.code.split("#")[0].strip() == command
    ]
    assert len(found) == 1, f"README.md has {len(found)} `run in` bash blocks {command!r}"
    argv = shlex.split(command)
    return [sys.executable if a == ".venv/bin/python" else a for a in argv]


def command_of(block: Block) -> str:
    """A one-line bash block's command, its comment left out."""
    return block.code.split("#")[0].strip()
